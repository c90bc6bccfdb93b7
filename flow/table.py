"""The Table: typed, named columns plus a ``qid`` column saying which query each row answers.

Every request row is one query with its own qid; operators keep the qid of the row they
came from, so the rows of many requests can be merged into one Table (batching) and split
back by qid. A request's rows have unique qids (``flow.run`` checks); after a join on a
duplicated key or a union several rows can share a qid (they all answer that query), so
the constructors accept repeated qids. In float columns NaN is a missing value.

    t = Table.from_pylist([{"x": 1, "img": np.zeros((2, 2))}, {"x": 2, "img": np.ones((2, 2))}])
    t.schema                      # {'x': int, 'img': tensor[float64, (2, 2)]}
    [r.x for r in t.rows()]       # [1, 2]
    t["img"].shape                # (2, 2, 2): one contiguous array

A batching operator's torch tensor output stays a torch tensor while the Table stays in
its process (``TorchColumn``: on a GPU, it stays on the GPU); ``t.tensor("emb")`` gives it
to the next operator as it is, and anything that reads the column as numpy (or sends it
to another process) gets one host copy.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeGuard

import numpy as np

from flow.errors import DataTypeError, SchemaError
from flow.types import ColumnType, any_true, build_column, may_not_fit, unify

QID = "qid"


class Column:
    """One column's storage: values (row axis first) and a validity mask (None = all valid).

    A float column treats NaN as missing: its mask is False wherever the value is NaN, and
    its storage holds NaN wherever the mask is False (so ``to_numpy()`` needs no copy).
    """

    __slots__ = ("type", "values", "valid")

    def __init__(self, type_: ColumnType, values: np.ndarray, valid: np.ndarray | None = None):
        if valid is not None:
            valid = np.asarray(valid, dtype=bool)
            if valid.shape != (len(values),):
                raise SchemaError(f"validity mask has shape {valid.shape}, the column has {len(values)} rows")
        if type_.kind == "float" and len(values):
            if values.dtype != np.float64:
                values = values.astype(np.float64)
            nan = np.isnan(values)
            if valid is None:
                valid = ~nan if any_true(nan) else None
            else:
                valid = valid & ~nan
                if not nan[~valid].all():
                    values = values.copy()
                    values[~valid] = np.nan
        self.type = type_
        self.values = values
        self.valid = valid if valid is None or np.count_nonzero(valid) < len(valid) else None

    def __len__(self) -> int:
        return len(self.values)

    def cell(self, i: int):
        if self.valid is not None and not self.valid[i]:
            return None
        if self.type.kind == "tensor":
            return self.values[i]
        return self.values.item(i)  # a Python scalar (an object column's own object): no numpy scalar between

    def take(self, idx: np.ndarray) -> Column:
        """Rows at ``idx``; an index of -1 gives a missing value (outer joins).

        Unlike numpy, -1 never means "the last row": ``Table.take`` refuses negative
        positions, and only the join uses -1, for "no matching row".
        """
        idx = np.asarray(idx, dtype=np.int64)
        missing = idx < 0
        any_missing = bool(missing.any())
        if len(self.values) == 0:
            if not missing.all():
                raise IndexError(f"row index {int(idx[~missing][0])} out of range for a column of 0 rows")
            values = np.empty((len(idx),) + self.values.shape[1:], dtype=self.values.dtype)
            if self.type.kind != "null" and len(idx):
                values[...] = self.type.fill_value()
            valid: np.ndarray | None = np.zeros(len(idx), dtype=bool)
            return Column(self.type, values, valid)
        safe = np.where(missing, 0, idx) if any_missing else idx
        values = self.values[safe]
        valid = self.valid[safe] if self.valid is not None else None
        if any_missing:
            valid = ~missing if valid is None else (valid & ~missing)
            if self.type.kind == "null":
                pass
            elif self.type.kind == "tensor":
                values[missing] = 0
            else:
                values[missing] = self.type.fill_value()
        return Column(self.type, values, valid)

    def as_type(self, type_: ColumnType) -> Column:
        if type_ == self.type:
            return self
        if self.type.kind == "null":
            values = np.empty((len(self),) + type_.shape, dtype=type_.dtype)
            if len(self):
                values[...] = type_.fill_value()
            return Column(type_, values, np.zeros(len(self), dtype=bool))
        values = self.values.astype(type_.dtype)
        if type_.kind == "float" and self.valid is not None:
            values[~self.valid] = np.nan
        return Column(type_, values, self.valid)

    def to_numpy(self) -> np.ndarray:
        """Values with missing ones as NaN (float) or None (other kinds, as an object array)."""
        if self.valid is None or self.type.kind in ("float", "null"):
            return self.values  # float storage already holds NaN where missing
        out = np.empty(len(self), dtype=object)
        if self.type.kind == "tensor":  # a slice assignment would try to broadcast the arrays
            for i, v in enumerate(self.to_list()):
                out[i] = v
        else:
            out[:] = self.to_list()
        return out

    def to_list(self) -> list:
        if self.type.kind == "tensor":
            return [self.cell(i) for i in range(len(self))]
        if self.valid is None:
            return self.values.tolist()
        return [v if ok else None for v, ok in zip(self.values.tolist(), self.valid)]

    def equals(self, other: Column) -> bool:
        if self.type != other.type or len(self) != len(other):
            return False
        mine = self.valid if self.valid is not None else np.ones(len(self), bool)
        theirs = other.valid if other.valid is not None else np.ones(len(other), bool)
        if not np.array_equal(mine, theirs):
            return False
        if self.type.kind in ("str", "bytes", "null"):
            return all(a == b for a, b, ok in zip(self.values, other.values, mine) if ok)
        a, b = self.values[mine], other.values[mine]
        if self.type.kind == "float" or (self.type.kind == "tensor" and a.dtype.kind == "f"):
            return bool(np.array_equal(a, b, equal_nan=True))
        return bool(np.array_equal(a, b))


def built_column(type_: ColumnType, values: np.ndarray, valid: np.ndarray | None) -> Column:
    """A Column of what ``types.build_column`` returned: that has checked it already (float
    storage is float64, a mask only where a value is missing, NaN where it is), so with no
    mask the constructor's checks would change nothing. Operators' outputs are built so."""
    if valid is not None:
        return Column(type_, values, valid)
    col = Column.__new__(Column)
    col.type, col.values, col.valid = type_, values, None
    return col


# torch dtypes (by name: torch is never imported for this) -> the numpy dtype of their host copy
_TORCH_DTYPES = {
    f"torch.{name}": np.dtype(name)
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
}


def is_torch_tensor(value) -> bool:
    """True for a plain ``torch.Tensor`` (checked without importing torch)."""
    t = type(value)
    return t.__name__ == "Tensor" and t.__module__ == "torch"


def torch_column(value, n: int) -> TorchColumn | None:
    """The column of a batching operator's torch tensor output of ``n`` rows, held as the
    tensor itself (on its device: no copy); None where only a host copy will do (a 1-d
    tensor is a scalar column, whose missing values numpy marks; a dtype numpy lacks, such
    as bfloat16; a sparse tensor): the generic path converts or refuses it."""
    if not is_torch_tensor(value) or value.ndim < 2 or value.shape[0] != n:
        return None
    dtype = _TORCH_DTYPES.get(str(value.dtype))
    if dtype is None or str(value.layout) != "torch.strided":
        return None
    return TorchColumn(
        ColumnType.tensor(dtype, tuple(value.shape[1:])), value.detach() if value.requires_grad else value
    )


class TorchColumn(Column):
    """A tensor column whose rows are one torch tensor, kept where the operator that made
    it put it: on a GPU, consecutive operators and stages of one executor hand it on in
    GPU memory (the next one reads it with ``Table.tensor``). Whatever reads ``values``
    (numpy operators, a row's cell, equality, the encoding when the Table leaves the
    process) gets a host copy, made once and kept; ``on_host`` says whether it was made."""

    __slots__ = ("tensor", "_host")

    def __init__(self, type_: ColumnType, tensor):
        if type_.kind != "tensor":
            raise SchemaError(f"a TorchColumn holds a tensor column, got {type_}")
        self.type = type_
        self.valid = None
        self.tensor = tensor
        self._host: np.ndarray | None = None

    @property
    def values(self) -> np.ndarray:  # type: ignore[override]  # read-only here: the host copy of the tensor
        host = self._host
        if host is None:  # the one copy to the host (a view of a CPU tensor's own memory)
            host = self._host = np.ascontiguousarray(self.tensor.detach().cpu().numpy())
        return host

    @property
    def on_host(self) -> bool:
        """Whether the host copy has been made (something read the column as numpy)."""
        return self._host is not None

    @property
    def device(self) -> str:
        """Where the rows are: "cpu", "cuda:0", ..."""
        return str(self.tensor.device)

    def __len__(self) -> int:
        return int(self.tensor.shape[0])

    def take(self, idx) -> Column:
        """Rows at ``idx``, on the tensor's device (a run of consecutive rows is a view).
        Missing rows (-1, outer joins) and bad positions take the host path, as any column."""
        idx = np.asarray(idx, dtype=np.int64)
        t = self.tensor
        if len(idx) == 0:
            return TorchColumn(self.type, t[:0])
        first, last = int(idx[0]), int(idx[-1])
        if int(idx.min()) < 0 or int(idx.max()) >= len(self):
            return Column.take(self, idx)
        if last - first == len(idx) - 1 and (len(idx) < 3 or bool((np.diff(idx) == 1).all())):
            return TorchColumn(self.type, t[first : last + 1])
        import torch

        return TorchColumn(self.type, t.index_select(0, torch.from_numpy(idx).to(t.device)))


class Row:
    """A view of one row: ``row.conf``, ``row["conf"]``, ``row.qid``, ``row.as_dict()``."""

    __slots__ = ("_table", "_i")

    def __init__(self, table: Table, i: int):
        self._table = table
        self._i = i

    @property
    def qid(self) -> int:
        return int(self._table._qid[self._i])

    def __getitem__(self, name: str):
        if name == QID:
            return self.qid
        try:
            col = self._table._cols[name]
        except KeyError:
            raise KeyError(f"row has no column {name!r}; columns are {self._table.columns}") from None
        return col.cell(self._i)

    def __getattr__(self, name: str):
        # ``row.qid`` is the property above; any other name is a column (row-wise operators
        # read these in their inner loop: one lookup, no detour through __getitem__)
        if name.startswith("__"):
            raise AttributeError(name)
        col = self._table._cols.get(name)
        if col is None:
            raise AttributeError(f"row has no column {name!r}; columns are {self._table.columns}")
        return col.cell(self._i)

    def keys(self) -> list[str]:
        return list(self._table.columns)

    def get(self, name: str, default=None):
        return self[name] if name in self._table._cols or name == QID else default

    def as_dict(self, qid: bool = False) -> dict[str, Any]:
        out = {QID: self.qid} if qid else {}
        out.update((n, c.cell(self._i)) for n, c in self._table._cols.items())
        return out

    def __repr__(self) -> str:
        return f"Row({self.as_dict(qid=True)!r})"


class Table:
    """Typed, named columns plus a ``qid`` column of query ids. Immutable by convention.

    Build one with ``Table.from_pylist``, ``from_dict``, ``from_pandas``, ``from_arrow``, or
    ``Table.from_any`` for any of those. ``qid=`` gives the query ids: a sequence of ints, the
    name of a column that holds them, or None for 0..n-1.
    """

    __slots__ = ("_qid", "_cols")

    def __init__(self, columns: Mapping[str, Column], qid: np.ndarray):
        self._cols = dict(columns)
        self._qid = qid
        for name, col in self._cols.items():
            if len(col) != len(qid):
                raise SchemaError(f"column {name!r} has {len(col)} rows, the table has {len(qid)}")

    # -- constructors ---------------------------------------------------------------

    @classmethod
    def built(cls, cols: dict[str, Column], qid: np.ndarray) -> Table:
        """A Table of columns already known to have ``len(qid)`` rows, and of a qid array
        already int64 (no re-check, no copy): what the runtime assembles from checked parts."""
        t = cls.__new__(cls)
        t._cols = cols
        t._qid = qid
        return t

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], qid=None, schema: Mapping[str, Any] | None = None) -> Table:
        """From a dict of columns: ``{"x": [1, 2], "img": np.zeros((2, 28, 28))}``."""
        if not isinstance(data, Mapping):
            raise DataTypeError(f"from_dict expects a mapping of column name to values, got {type(data).__name__}")
        data = dict(data)
        qids = _take_qid_column(data, qid)
        columns: dict[str, Column] = {}
        n = None
        for name, values in data.items():
            _check_column_name(name)
            if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
                raise DataTypeError(f"column {name!r}: expected a sequence of values, got {type(values).__name__}")
            want = ColumnType.parse(schema[name], name) if schema and name in schema else None
            ctype, arr, valid = build_column(values, name, want)
            if n is not None and len(arr) != n:
                raise SchemaError(f"column {name!r} has {len(arr)} rows, other columns have {n}")
            n = len(arr)
            columns[name] = Column(ctype, arr, valid)
        if n is None:
            n = len(qids) if qids is not None else 0
        return cls(columns, _make_qids(qids, n))

    @classmethod
    def from_pylist(cls, rows: Sequence[Mapping[str, Any]], qid=None, schema: Mapping[str, Any] | None = None) -> Table:
        """From a list of row dicts: ``[{"x": 1}, {"x": 2}]``. All rows need the same keys."""
        rows = list(rows)
        names: list[str] = []
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise DataTypeError(f"row {i}: expected a mapping of column to value, got {type(row).__name__}")
            if i == 0:
                names = list(row.keys())
            elif set(row.keys()) != set(names):
                diff = sorted(set(row.keys()) ^ set(names))
                raise SchemaError(f"row {i} has different columns than row 0: {diff}")
        if schema is not None and not rows:
            names = list(schema)
        data = {n: [r[n] for r in rows] for n in names}
        return cls.from_dict(data, qid=qid, schema=schema)

    @classmethod
    def from_pandas(cls, df, qid=None, schema: Mapping[str, Any] | None = None) -> Table:
        """From a pandas DataFrame; object columns holding arrays become tensor columns."""
        import pandas as pd

        if not isinstance(df, pd.DataFrame):
            raise DataTypeError(f"from_pandas expects a DataFrame, got {type(df).__name__}")
        if df.columns.duplicated().any():
            dup = df.columns[df.columns.duplicated()][0]
            raise SchemaError(f"duplicate column name {dup!r}")
        data = {}
        hints: dict[str, ColumnType] = {}
        stored = df.attrs.get(PANDAS_SCHEMA_ATTR) if isinstance(df.attrs.get(PANDAS_SCHEMA_ATTR), Mapping) else {}
        for name in df.columns:
            s = df[name]
            hint = _pandas_type_hint(s, stored.get(name))
            if hint is not None:
                hints[name] = hint
            if s.dtype.kind in "biuf" and not hasattr(s.dtype, "numpy_dtype"):
                data[name] = s.to_numpy()  # plain numpy dtypes (NaN in floats = missing)
            elif hasattr(s.dtype, "numpy_dtype") and s.dtype.kind in "biuf" and not s.hasnans:
                data[name] = s.to_numpy(dtype=s.dtype.numpy_dtype)  # nullable dtypes without NA
            else:  # object, str, categorical, nullable with NA: missing (None/NaN/NA/NaT) -> None
                values = s.tolist()
                for i in np.flatnonzero(s.isna().to_numpy()):
                    values[i] = None
                data[name] = values
        table = cls.from_dict(data, qid=qid, schema=schema)
        return _apply_hints(table, hints, schema)

    @classmethod
    def from_arrow(cls, table, qid=None, schema: Mapping[str, Any] | None = None) -> Table:
        """From a pyarrow Table; fixed_shape_tensor columns become tensor columns."""
        import pyarrow as pa

        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            raise DataTypeError(f"from_arrow expects a pyarrow Table, got {type(table).__name__}")
        names = table.column_names
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SchemaError(f"duplicate column name {dup!r}")
        data: dict[str, Any] = {}
        for name in names:
            want = ColumnType.parse(schema[name], name) if schema and name in schema else None
            data[name] = _arrow_column_values(table.column(name), name, want)
        out = cls.from_dict(data, qid=qid, schema=schema)
        # a column of no values to infer from (all null) takes its Arrow type: looked up
        # for those alone (a few us a column otherwise)
        hints = {}
        for name, field in zip(names, table.schema):
            col = out._cols.get(name)  # not the qid column (qid="qid")
            if col is not None and col.type.kind == "null" and (hint := _arrow_type_hint(field.type)) is not None:
                hints[name] = hint
        return _apply_hints(out, hints, schema) if hints else out

    @classmethod
    def from_any(cls, data, qid=None, schema: Mapping[str, Any] | None = None) -> Table:
        """A Table from a Table, DataFrame, pyarrow Table, list of row dicts or dict of columns."""
        if isinstance(data, Table):
            return data
        mod = type(data).__module__.split(".")[0]
        if mod == "pandas":
            return cls.from_pandas(data, qid=qid, schema=schema)
        if mod == "pyarrow":
            return cls.from_arrow(data, qid=qid, schema=schema)
        if isinstance(data, Mapping):
            return cls.from_dict(data, qid=qid, schema=schema)
        if isinstance(data, (list, tuple)):
            return cls.from_pylist(data, qid=qid, schema=schema)
        raise DataTypeError(
            f"cannot make a Table from {type(data).__name__}; pass a pandas DataFrame, a pyarrow "
            f"Table, a list of row dicts or a dict of columns"
        )

    @classmethod
    def empty(cls, schema: Mapping[str, Any] | None = None) -> Table:
        """A Table of no rows with the given column types: ``Table.empty({"x": int})``."""
        cols = {}
        for name, t in (schema or {}).items():
            _check_column_name(name)
            t = ColumnType.parse(t, name)
            cols[name] = Column(t, np.empty((0,) + t.shape, dtype=t.dtype))
        return cls(cols, np.empty(0, dtype=np.int64))

    # -- access -----------------------------------------------------------------------

    @property
    def columns(self) -> tuple[str, ...]:
        """Column names, without ``qid``."""
        return tuple(self._cols)

    @property
    def schema(self) -> dict[str, ColumnType]:
        return {n: c.type for n, c in self._cols.items()}

    @property
    def qid(self) -> np.ndarray:
        return self._qid

    @property
    def num_rows(self) -> int:
        return len(self._qid)

    def __len__(self) -> int:
        return len(self._qid)

    def __contains__(self, name: str) -> bool:
        return name in self._cols or name == QID

    def __getitem__(self, name: str) -> np.ndarray:
        """A column as a numpy array (missing values as NaN for floats, else None)."""
        if name == QID:
            return self._qid
        return self._column(name).to_numpy()

    def column(self, name: str) -> Column:
        return self._column(name)

    def tensor(self, name: str):
        """Column ``name`` as a torch tensor, rows first. A tensor that an operator in this
        process returned comes back as it is, on its device, without a copy (a GPU stage's
        output reaches the next operator on the same executor still on the GPU); any other
        numeric, bool or tensor column shares its numpy memory (on the CPU, no copy: do not
        write to it). Then ``.to(flow.current_device())`` moves it only if it must move.
        A tensor made under ``torch.inference_mode()`` is an inference tensor: use it
        under ``inference_mode`` (or ``no_grad``) too.

            x = table.tensor("img").to(fs.current_device())
        """
        col = self._column(name)
        if type(col) is TorchColumn:
            return col.tensor
        kind = col.type.kind
        if kind not in ("int", "float", "bool", "tensor"):
            raise DataTypeError(
                f"column {name!r} is {col.type}: only int, float, bool and tensor columns are torch tensors"
            )
        if col.valid is not None and kind != "float":
            raise DataTypeError(
                f"column {name!r} has missing values, which a torch tensor cannot mark; fill or filter them first"
            )
        import torch

        values = col.values
        if values.flags.writeable:
            return torch.from_numpy(values)
        with warnings.catch_warnings():  # read-only (a KVS cache hit): shared all the same, as documented
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(values)

    def _column(self, name: str) -> Column:
        try:
            return self._cols[name]
        except KeyError:
            raise SchemaError(f"no column {name!r}; columns are {list(self._cols)}") from None

    def row(self, i: int) -> Row:
        return Row(self, i)

    def rows(self) -> Iterator[Row]:
        return (Row(self, i) for i in range(len(self)))

    __iter__ = rows

    # -- conversion -------------------------------------------------------------------

    def to_pylist(self, qid: bool = True) -> list[dict[str, Any]]:
        lists = {n: c.to_list() for n, c in self._cols.items()}
        qids = self._qid.tolist()
        out = []
        for i in range(len(self)):
            row = {QID: qids[i]} if qid else {}
            for n, values in lists.items():
                row[n] = values[i]
            out.append(row)
        return out

    def to_dict(self, qid: bool = True) -> dict[str, Any]:
        out = {QID: self._qid} if qid else {}
        out.update((n, c.to_numpy()) for n, c in self._cols.items())
        return out

    def to_pandas(self):
        """A DataFrame with a ``qid`` column first. Missing values: NaN in float columns,
        ``pd.NA`` in int (``Int64``) and bool (``boolean``) columns, None in the others.
        Tensor columns become object columns of arrays. The column types are kept in
        ``df.attrs`` so that ``Table.from_pandas(df, qid="qid")`` restores empty and
        all-missing columns with their type."""
        import pandas as pd

        data: dict[str, Any] = {QID: self._qid}
        for n, c in self._cols.items():
            kind = c.type.kind
            if kind in ("int", "bool") and c.valid is not None:
                data[n] = pd.array(c.values, dtype="Int64" if kind == "int" else "boolean", copy=True)
                data[n][~c.valid] = pd.NA
            elif kind == "tensor":  # one array (or None) per row
                cells = np.empty(len(c), dtype=object)
                for i, v in enumerate(c.to_list()):
                    cells[i] = v
                data[n] = cells
            elif kind in ("bytes", "null"):
                data[n] = pd.Series(c.to_numpy(), dtype=object)
            else:
                data[n] = c.to_numpy()
        df = pd.DataFrame(data)
        df.attrs[PANDAS_SCHEMA_ATTR] = {n: c.type.to_json() for n, c in self._cols.items()}
        return df

    def to_arrow(self):
        import pyarrow as pa

        arrays = [pa.array(self._qid, type=pa.int64())]
        for c in self._cols.values():
            arrays.append(_column_to_arrow(c))
        return pa.Table.from_arrays(arrays, names=[QID, *self._cols])

    # -- relational building blocks -------------------------------------------------------

    def take(self, idx) -> Table:
        """Rows at the given positions, in that order (duplicates allowed, no negatives)."""
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            bad = int(idx[(idx < 0) | (idx >= len(self))][0])
            raise IndexError(f"row position {bad} out of range for a table of {len(self)} rows")
        return Table({n: c.take(idx) for n, c in self._cols.items()}, self._qid[idx])

    def filter(self, mask) -> Table:
        """The rows where ``mask`` (one bool per row) is True. Every row kept: this Table
        itself (the same rows and qid array, so a join on qid of it with another branch of
        the same rows stays a rename, as a Cascade's unsure rows when all are unsure)."""
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (len(self),):
            raise ValueError(f"filter mask has shape {mask.shape}, the table has {len(self)} rows")
        if mask.all():
            return self
        return self.take(np.flatnonzero(mask))

    def select(self, names: Iterable[str]) -> Table:
        return Table({n: self._column(n) for n in names}, self._qid)

    def with_columns(self, columns: Mapping[str, Column], keep: bool = True) -> Table:
        base = dict(self._cols) if keep else {}
        base.update(columns)
        return Table(base, self._qid)

    def with_qid(self, qid) -> Table:
        return Table(self._cols, np.asarray(qid, dtype=np.int64))

    @staticmethod
    def concat(tables: Sequence[Table]) -> Table:
        """Rows of all tables, in order; columns must match by name (types unify)."""
        tables = list(tables)
        if not tables:
            return Table.empty()
        names = tables[0].columns
        for t in tables[1:]:
            if set(t.columns) != set(names):
                raise SchemaError(f"cannot concatenate tables with columns {list(names)} and {list(t.columns)}")
        cols: dict[str, Column] = {}
        for n in names:
            parts = [t._cols[n] for t in tables]
            ctype = parts[0].type
            for p in parts[1:]:
                ctype = unify(ctype, p.type, n)
            if _same_device(parts, ctype):  # torch tensors of one device: joined there, never via the host
                import torch

                cols[n] = TorchColumn(ctype, torch.cat([p.tensor for p in parts]))
                continue
            parts = [p.as_type(ctype) for p in parts]
            values = np.concatenate([p.values for p in parts])  # parts: one per table, and there are some
            if any(p.valid is not None for p in parts):
                valid = np.concatenate([p.valid if p.valid is not None else np.ones(len(p), bool) for p in parts])
            else:
                valid = None
            cols[n] = Column(ctype, values, valid)
        return Table(cols, np.concatenate([t._qid for t in tables]))

    def split_by_qid(self) -> dict[int, Table]:
        """One Table per qid, rows in their original order (used to split a batch)."""
        if len(self) == 0:
            return {}
        order = np.argsort(self._qid, kind="stable")
        sorted_qid = self._qid[order]
        bounds = np.flatnonzero(np.diff(sorted_qid)) + 1
        out = {}
        for chunk in np.split(order, bounds):
            out[int(self._qid[chunk[0]])] = self.take(chunk)
        return out

    def sort_by_qid(self) -> Table:
        return self.take(np.argsort(self._qid, kind="stable"))

    # -- comparison and display ----------------------------------------------------------

    def equals(self, other: Table) -> bool:
        """Same qids, columns (names, order, types) and values, in the same row order."""
        return (
            isinstance(other, Table)
            and self.columns == other.columns
            and np.array_equal(self._qid, other._qid)
            and all(c.equals(other._cols[n]) for n, c in self._cols.items())
        )

    def __eq__(self, other) -> bool:
        return self.equals(other) if isinstance(other, Table) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking container: not hashable

    def __repr__(self) -> str:
        """The first rows and the last, as pandas shows a DataFrame, then the column types:

         qid  cls      conf
           0    3  0.981234
           1    7      None
        [2 rows x 2 columns] cls: int, conf: float
        """
        return _render(self)


# -- helpers ----------------------------------------------------------------------------

REPR_ROWS = 10  # a Table's repr shows all rows up to this many, else the first and last 5
REPR_WIDTH = 110  # ...and the columns that fit in this many characters
REPR_CELL = 30  # a value's text is cut to this many characters


def _render(table: Table) -> str:
    n = len(table)
    shown = list(range(n)) if n <= REPR_ROWS else [*range(REPR_ROWS // 2), *range(n - REPR_ROWS // 2, n)]
    names = [QID, *table.columns]
    cells = [[str(int(table._qid[i])) for i in shown]]
    cells += [[_cell_text(table._cols[c].cell(i)) for i in shown] for c in table.columns]
    widths = [max([len(name), *map(len, col)]) for name, col in zip(names, cells)]
    keep, used = 0, 0
    for w in widths:  # the leading columns that fit (qid always)
        if keep and used + w + 2 > REPR_WIDTH:
            break
        keep, used = keep + 1, used + w + 2
    cut = keep < len(names)
    lines = ["  ".join(name.rjust(w) for name, w in zip(names[:keep], widths)) + ("  ..." if cut else "")]
    for r in range(len(shown)):
        if n > REPR_ROWS and r == REPR_ROWS // 2:
            lines.append("  ".join("...".rjust(w) for w in widths[:keep]) + ("  ..." if cut else ""))
        lines.append("  ".join(col[r].rjust(w) for col, w in zip(cells[:keep], widths)) + ("  ..." if cut else ""))
    k = len(table.columns)
    foot = f"[{n} row{'s' if n != 1 else ''} x {k} column{'s' if k != 1 else ''}]"
    types = ", ".join(f"{name}: {t}" for name, t in table.schema.items())
    if types:
        foot += " " + (types if len(foot) + len(types) < REPR_WIDTH else types[: REPR_WIDTH - len(foot) - 4] + "...")
    return "\n".join([*lines, foot])


def _cell_text(value) -> str:
    """One value as a Table's repr shows it, cut to ``REPR_CELL`` characters."""
    if isinstance(value, np.ndarray):
        text = np.array2string(value, threshold=4, edgeitems=1, separator=", ", precision=4, max_line_width=10**6)
        text = " ".join(text.split())
    elif isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, (bytes, bytearray, memoryview)):
        text = repr(bytes(value[: REPR_CELL + 1]))
    else:
        text = str(value)
    return text if len(text) <= REPR_CELL else text[: REPR_CELL - 3] + "..."


def _same_device(parts: Sequence[Column], ctype: ColumnType) -> TypeGuard[Sequence[TorchColumn]]:
    """True if every part is a TorchColumn of type ``ctype`` on one device."""
    if type(parts[0]) is not TorchColumn:
        return False
    device = parts[0].tensor.device
    return all(type(p) is TorchColumn and p.type == ctype and p.tensor.device == device for p in parts)


def _check_column_name(name) -> None:
    if not isinstance(name, str) or not name:
        raise SchemaError(f"column names must be non-empty strings, got {name!r}")
    if name == QID:
        raise SchemaError(
            "column 'qid' is reserved for query ids; rename it, or pass qid='qid' to use it as the query ids"
        )


def _take_qid_column(data: dict, qid):
    if isinstance(qid, str):
        if qid not in data:
            raise SchemaError(f"qid={qid!r} names no column; columns are {list(data)}")
        return data.pop(qid)
    return qid


def _make_qids(qids, n: int) -> np.ndarray:
    if qids is None:
        return np.arange(n, dtype=np.int64)
    arr = np.asarray(list(qids) if not isinstance(qids, np.ndarray) else qids)
    if arr.ndim != 1 or len(arr) != n:
        raise SchemaError(f"qid: expected {n} query ids, got {arr.shape}")
    if len(arr) and arr.dtype.kind not in "iu":
        raise DataTypeError(f"column 'qid': query ids must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and len(arr) and arr.max() > np.iinfo(np.int64).max:
        raise DataTypeError(f"column 'qid': query id {arr.max()} does not fit in int64")
    return arr.astype(np.int64)


PANDAS_SCHEMA_ATTR = "flowserve_schema"


def _apply_hints(table: Table, hints: Mapping[str, ColumnType], schema) -> Table:
    """Give columns that came out ``null`` (no values to infer from) their source's type."""
    fixed = {}
    for name, hint in hints.items():
        if schema and name in schema:
            continue
        col = table._cols.get(name)
        if col is not None and col.type.kind == "null" and hint.kind != "null":
            fixed[name] = col.as_type(hint)
    return table.with_columns(fixed) if fixed else table


def _pandas_type_hint(s, stored) -> ColumnType | None:
    try:
        if isinstance(stored, Mapping):
            return ColumnType.from_json(stored)
    except (KeyError, TypeError, ValueError):
        pass
    import pandas as pd

    if isinstance(s.dtype, pd.StringDtype):
        return ColumnType("str")
    kind = s.dtype.kind
    return {"b": ColumnType("bool"), "i": ColumnType("int"), "u": ColumnType("int"), "f": ColumnType("float")}.get(kind)


def _arrow_type_hint(t) -> ColumnType | None:
    import pyarrow as pa

    if isinstance(t, pa.FixedShapeTensorType):
        return ColumnType.tensor(t.value_type.to_pandas_dtype(), t.shape)
    if pa.types.is_fixed_size_list(t) and (
        pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type) or pa.types.is_boolean(t.value_type)
    ):
        return ColumnType.tensor(t.value_type.to_pandas_dtype(), (t.list_size,))
    if pa.types.is_boolean(t):
        return ColumnType("bool")
    if pa.types.is_integer(t):
        return ColumnType("int")
    if pa.types.is_floating(t):
        return ColumnType("float")
    if pa.types.is_string(t) or pa.types.is_large_string(t) or getattr(pa.types, "is_string_view", lambda _: False)(t):
        return ColumnType("str")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return ColumnType("bytes")
    return None


def _arrow_column_values(chunked, name: str, want: ColumnType | None = None):
    """A column's values for ``build_column``: a numpy array where they are numbers (a
    regular list column's as one (n, *shape) array), else Python values. ``want``: the
    column's declared type, if any."""
    import pyarrow as pa

    if chunked.num_chunks == 1:
        arr = chunked.chunk(0)
    elif chunked.num_chunks == 0:
        arr = pa.array([], type=chunked.type)
    else:
        arr = chunked.combine_chunks()
    if isinstance(arr.type, pa.FixedShapeTensorType):
        return _arrow_tensor_values(arr.storage, tuple(arr.type.shape), arr.type.value_type, name)
    if arr.null_count == 0 and (
        pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_boolean(arr.type)
    ):
        return arr.to_numpy(zero_copy_only=False)
    if pa.types.is_null(arr.type):
        return [None] * len(arr)
    if arr.type.id in _list_type_ids():
        rows = _regular_list_rows(arr, want)
        if rows is not None:
            return rows
        return [None if v is None else np.asarray(v) for v in arr.to_pylist()]
    return arr.to_pylist()


# np.asarray's dtype for a row's Python values, by the Arrow leaf type's kind (ints that
# all fit int64, floats, bools): what the rows below must come out as
_ROW_DTYPES = {"i": np.dtype(np.int64), "f": np.dtype(np.float64), "b": np.dtype(np.bool_)}


def _list_type_ids() -> frozenset:
    """The type ids of Arrow's list types (a list, a large list, a fixed-size list)."""
    global _LIST_IDS
    if _LIST_IDS is None:
        import pyarrow as pa

        _LIST_IDS = frozenset((pa.lib.Type_LIST, pa.lib.Type_LARGE_LIST, pa.lib.Type_FIXED_SIZE_LIST))
    return _LIST_IDS


_LIST_IDS: frozenset | None = None


def _regular_list_rows(arr, want: ColumnType | None = None) -> np.ndarray | None:
    """The rows of a list column nested k deep (an image as lists of lists) as
    ``np.asarray(row)`` makes them from each row's Python lists, without making those lists:
    one fresh (n, *shape) array, whose rows are those arrays, when no level holds a null,
    every row has the same non-empty shape and the leaves are numbers (ints up to 32 bits,
    or signed 64, floats, bools). None for any other column (the rows go through Python
    values, which name what is ragged or missing), or one declared other than a tensor
    (``build_column`` names the rows' type).

    Declared a tensor of a dtype that holds every leaf value as it is (uint8 leaves for a
    uint8 or float32 tensor), the array has that dtype already: the same numbers the
    Python values' int64 or float64 would give cast to it, without the detour and its
    range check (an image's column: 4 us instead of 30)."""
    import pyarrow as pa

    if want is not None and want.kind != "tensor":
        return None

    n, shape, level = len(arr), [], arr
    if n == 0:
        return None
    lists = _list_type_ids()
    while level.type.id in lists:
        if level.null_count:
            return None
        if level.type.id == pa.lib.Type_FIXED_SIZE_LIST:
            size = level.type.list_size
            start, stop = level.offset * size, (level.offset + len(level)) * size
        else:
            offsets = level.offsets.to_numpy()
            start, stop = int(offsets[0]), int(offsets[-1])
            size = int(offsets[1]) - start
            if len(offsets) > 2 and (offsets[1:] - offsets[:-1] != size).any():
                return None
        if size == 0:
            return None
        shape.append(size)
        level = level.values.slice(start, stop - start)
    t = level.type
    if level.null_count or not (
        pa.types.is_floating(t) or pa.types.is_boolean(t) or (pa.types.is_integer(t) and t != pa.uint64())
    ):
        return None
    values = level.to_numpy(zero_copy_only=False)  # a view of the body's buffer, read-only: copied below
    if want is not None and want.shape == tuple(shape) and not may_not_fit(values.dtype, want.dtype):
        dtype = want.dtype
    else:
        dtype = _ROW_DTYPES["i" if values.dtype.kind in "iu" else values.dtype.kind]
    return values.astype(dtype).reshape((n, *shape))


def _arrow_tensor_values(storage, shape: tuple, value_type, name: str):
    """A fixed-size-list array as one (n, *shape) array, or a list with None for null rows."""
    import pyarrow as pa

    n, size = len(storage), int(np.prod(shape))
    child = storage.values.slice(storage.offset * size, n * size)
    row_valid = storage.is_valid().to_numpy(zero_copy_only=False) if storage.null_count else np.ones(n, bool)
    if child.null_count:
        elem_ok = child.is_valid().to_numpy(zero_copy_only=False).reshape(n, size).all(axis=1)
        if (row_valid & ~elem_ok).any():
            raise DataTypeError(f"column {name!r}: a tensor row has missing elements; only whole rows may be missing")
        child = child.fill_null(pa.scalar(0, type=child.type) if not pa.types.is_boolean(child.type) else False)
    values = child.to_numpy(zero_copy_only=False).reshape((n,) + shape)
    if row_valid.all():
        return values
    return [values[i] if row_valid[i] else None for i in range(n)]


def _column_to_arrow(col: Column):
    import pyarrow as pa

    kind = col.type.kind
    mask = None if col.valid is None else ~col.valid
    if kind == "tensor":
        n = len(col)
        flat = pa.array(col.values.reshape(n, -1).reshape(-1) if n else np.empty(0, col.type.dtype))
        size = int(np.prod(col.type.shape))
        storage = pa.FixedSizeListArray.from_arrays(flat, size, mask=pa.array(mask) if mask is not None else None)
        ttype = pa.fixed_shape_tensor(flat.type, list(col.type.shape))
        return pa.ExtensionArray.from_storage(ttype, storage)
    if kind == "null":
        return pa.nulls(len(col))
    arrow_type = {
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "str": pa.string(),
        "bytes": pa.binary(),
    }[kind]
    return pa.array(col.values, type=arrow_type, mask=mask)
