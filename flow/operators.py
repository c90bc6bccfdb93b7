"""Logical operators: immutable descriptions plus how to run them on Tables.

An ``Operator`` is what a flow node does. ``op.instantiate()`` builds the per-replica state
once (a class's constructor, an ``init=`` function) and returns a ``BoundOperator``:
a callable ``bound(inputs: list[Table], store) -> Table``. ``flow.run``, the optimizer's
plan interpreter and the executors all run operators through this one interface, so they
share one meaning.

Semantics in short (docs/flow-semantics.md has the exact form):
- ``map`` replaces the columns with ``names`` (the qid is kept): a stage sends on only what
  later stages need. Re-emit a column by returning it. A batching operator is never
  called with an empty Table.
- ``filter`` keeps the rows whose predicate is True.
- ``agg`` (optionally after ``groupby``) gives one row per group, groups sorted by key,
  rows with a missing key dropped, missing values skipped; the row's qid is the smallest
  qid of its group.
- ``join`` matches rows on ``on`` (default qid); missing keys never match; clashing
  column names get ``suffixes`` (default ``("", "_right")``); left columns first, then
  the right non-key ones; qid of the left row (the right row's for right-only rows).
- ``union`` appends rows; ``lookup`` adds a column read from the KVS; ``anyof`` runs
  alternatives and keeps, per row, the first result that ``valid`` accepts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flow.context import reads_note, recording_reads
from flow.errors import (
    DataError,
    DataTypeError,
    FlowError,
    FlowValueError,
    LookupKeyError,
    NoValidResultError,
    OperatorFailedError,
    OperatorOutputError,
    RejectRow,
    RowRejectedError,
    SchemaError,
)
from flow.table import Column, Row, Table, built_column
from flow.tracebacks import restore_files
from flow.types import ColumnType, any_true, build_column, unify

AGGREGATES = ("count", "sum", "min", "max", "mean")
JOIN_HOWS = ("inner", "left", "outer")
_MISSING = object()


def callable_name(fn) -> str:
    """A readable name for a user callable: its __name__, or its class's name."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "lambda" if name == "<lambda>" else name


@dataclass(frozen=True)
class Operator:
    """Base of all logical operators. Subclasses are frozen dataclasses."""

    kind = "operator"
    arity = 1

    @property
    def label(self) -> str:
        return self.kind

    # The user's flags live in fields named ``batching_``, ``gpu_``, ``high_variance_`` on the
    # operators that take them (the trailing underscore keeps these properties readable).
    @property
    def batching(self) -> bool:
        return getattr(self, "batching_", False)

    @property
    def gpu(self) -> bool:
        return getattr(self, "gpu_", False)

    @property
    def high_variance(self) -> bool:
        return getattr(self, "high_variance_", False)

    @property
    def timeout_s(self) -> float | None:
        """How long one run of this operator may take in a deployment (None: the request's
        deadline alone bounds it); past it the runtime abandons the run and answers 504."""
        return getattr(self, "timeout_s_", None)

    @property
    def rowwise(self) -> bool:
        """True if each output row depends only on one input row (safe to batch requests)."""
        return True

    @property
    def generates(self) -> bool:
        """True if one input row may give several output rows (a generator map): such an
        operator is row-wise but does not keep rows 1:1."""
        return False

    def instantiate(self) -> BoundOperator:
        raise NotImplementedError

    def describe(self) -> str:
        """A one-line description for explain()."""
        return self.label


class BoundOperator:
    """An operator with its per-replica state built; call it on input Tables."""

    def __init__(self, op: Operator, name: str):
        self.op = op
        self.name = name

    def __call__(self, inputs: Sequence[Table], store=None) -> Table:
        raise NotImplementedError


# -- source -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceOp(Operator):
    """The flow's input: the request's rows."""

    kind = "source"
    arity = 0

    def instantiate(self):
        return _Identity(self, "source")


class _Identity(BoundOperator):
    def __call__(self, inputs, store=None):
        return inputs[0]


# -- map ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapOp(Operator):
    kind = "map"
    fn: Any = None
    names: tuple[str, ...] = ()
    init: Callable | None = None
    col: str | None = None
    batching_: bool = False
    gpu_: bool = False
    high_variance_: bool = False
    timeout_s_: float | None = None
    cache: Any = None  # a flow.prediction.CacheSpec: memoise outputs per row (the runtime's)
    hedge: Any = None  # "pNN" or seconds: a backup copy after that long without an answer

    @property
    def label(self) -> str:
        return callable_name(self.fn)

    @property
    def generates(self) -> bool:
        """A row function that is a generator (``def f(row): yield ...``), or a class whose
        ``__call__`` is: each value it yields is an output row with the input row's qid."""
        return is_generator(self.fn)

    def describe(self) -> str:
        flags = [
            f for f, on in (("batching", self.batching), ("gpu", self.gpu), ("high_variance", self.high_variance)) if on
        ]
        if self.generates:
            flags.append("generator")
        if self.timeout_s_ is not None:
            flags.append(f"timeout {self.timeout_s_:g}s")
        if self.cache is not None:
            flags.append(self.cache.describe())
        if self.hedge is not None:
            flags.append(f"hedge {self.hedge}" if isinstance(self.hedge, str) else f"hedge {self.hedge * 1000:g} ms")
        src = f"({self.col})" if self.col else ""
        return f"map {self.label}{src} -> {', '.join(self.names)}" + (f" [{', '.join(flags)}]" if flags else "")

    def instantiate(self):
        return _BoundMap(self, self.label, build_callable(self.fn, self.init, self.label))


def is_generator(fn) -> bool:
    """Whether calling ``fn`` (or, for a class, its instances) returns a generator."""
    target = fn.__call__ if isinstance(fn, type) else fn
    return inspect.isgeneratorfunction(target)


def build_callable(fn, init, name: str) -> Callable:
    """Build a user callable once per replica: a class is constructed, ``init`` is run."""
    # code shipped in a plan: its tracebacks name the user's file, not "<dynamic-code>"
    restore_files(fn, *(() if init is None else (init,)))
    reads: list = []  # the store's keys it read, and what they held: a failure names them
    try:
        with recording_reads(reads):
            if isinstance(fn, type):  # inspect.isclass's own test; the checker types fn() as Any, not object
                return fn()
            if init is not None:
                state = init()
                return lambda *args: fn(state, *args)
    except Exception as e:  # the user's constructor: whatever it raises fails the build, naming it
        if isinstance(e, FlowError) and e.operator is not None:
            raise  # names its operator already (e.g. a nested flow's)
        raise OperatorFailedError(
            f"operator {name!r}: building it failed: {type(e).__name__}: {e}{reads_note(reads)}", operator=name
        ) from e
    return fn


class _BoundMap(BoundOperator):
    op: MapOp  # the subclass binds only this operator kind (declared for the checker; no runtime cost)

    def __init__(self, op: MapOp, name: str, call: Callable):
        super().__init__(op, name)
        self.call = call
        self.generates = op.generates  # inspect's answer, once a replica, not once a call

    def __call__(self, inputs, store=None):
        (table,) = inputs
        op: MapOp = self.op
        if op.col is not None and op.col not in table:
            raise SchemaError(
                f"operator {self.name!r}: input has no column {op.col!r}; columns are {list(table.columns)}"
            )
        if op.batching:
            return _map_batch(self.name, self.call, op.names, op.col, table)
        if self.generates:
            return _map_generated(self.name, self.call, op.names, op.col, table)
        return _map_rows(self.name, self.call, op.names, op.col, table)


def _invoke(name: str, call: Callable, arg, qid: int | None):
    try:
        return call(arg)
    except RejectRow as e:
        raise RowRejectedError(f"operator {name!r} rejected the row: {e}", operator=name, qid=qid) from None
    except Exception as e:  # the user's code: whatever it raises fails this query, naming the operator
        if isinstance(e, FlowError) and e.operator is not None:
            raise  # names its operator already (e.g. a nested flow run's, a 422 included)
        raise OperatorFailedError(f"operator {name!r} raised {type(e).__name__}: {e}", operator=name, qid=qid) from e


def _map_rows(name, call, names, col, table: Table) -> Table:
    k = len(names)
    outputs: list[list] = [[] for _ in range(k)]
    qids = table.qid
    qid_list = qids.tolist()
    if col is not None:
        args = iter(qid_list if col == "qid" else table.column(col).to_list())
    else:
        args = table.rows()
    for i, arg in enumerate(args):
        result = _invoke(name, call, arg, qid_list[i])
        if k == 1:
            outputs[0].append(result)
            continue
        if not isinstance(result, (tuple, list)) or len(result) != k:
            raise arity_error(name, names, result, int(qids[i]))
        for j in range(k):
            outputs[j].append(result[j])
    return Table(_columns_from_values(name, names, outputs, None), qids)


def _map_generated(name, call, names, col, table: Table) -> Table:
    """A generator map: every value a row's generator yields is an output row with that
    row's qid, in the order yielded, rows in input order (0 values: the row is dropped)."""
    k = len(names)
    outputs: list[list] = [[] for _ in range(k)]
    out_qids: list[int] = []
    qid_list = table.qid.tolist()
    for i, arg in enumerate(_row_args(col, table, qid_list)):
        q = qid_list[i]
        # the generator's body runs as it is iterated: its errors name the operator too
        for result in _invoke(name, _drain, (call, arg), q):
            if k == 1:
                outputs[0].append(result)
            elif not isinstance(result, (tuple, list)) or len(result) != k:
                raise arity_error(name, names, result, q)
            else:
                for j in range(k):
                    outputs[j].append(result[j])
            out_qids.append(q)
    return Table(_columns_from_values(name, names, outputs, None), np.asarray(out_qids, dtype=np.int64))


def _drain(call_arg) -> list:
    call, arg = call_arg
    return list(call(arg))


def each_generated(b: _BoundMap, table: Table) -> Iterator[Table]:
    """A generator map's output (``b([table])``, ``b`` a bound generator map) one value at a
    time, as the rows' generators yield them: a one-row Table per value, with its row's
    qid, in the same order, checked alike, its errors the same. A stream sends each on as
    it comes (executors/worker/fused.py)."""
    op = b.op
    if op.col is not None and op.col not in table:
        b([table])  # the map's own SchemaError naming the column
    name, names, k = b.name, op.names, len(op.names)
    qid_list = table.qid.tolist()
    for i, arg in enumerate(_row_args(op.col, table, qid_list)):
        q = qid_list[i]
        values = _invoke(name, b.call, arg, q)  # a generator: its body runs as it is iterated
        while True:
            result = _invoke(name, _next, values, q)
            if result is _DONE:
                break
            if k == 1:
                outputs = [[result]]
            elif not isinstance(result, (tuple, list)) or len(result) != k:
                raise arity_error(name, names, result, q)
            else:
                outputs = [[v] for v in result]
            yield Table(_columns_from_values(name, names, outputs, None), np.array([q], dtype=np.int64))


_DONE = object()  # a generator has no more values


def _next(values):
    return next(values, _DONE)


def _row_args(col, table: Table, qid_list: list):
    """What a row function is called with, row by row: the row, or its ``col`` value."""
    if col is not None:
        return iter(qid_list if col == "qid" else table.column(col).to_list())
    return table.rows()


def arity_error(name, names, result, qid: int) -> OperatorOutputError:
    """A row-wise map of several columns returned something else than one value per column."""
    got = f"{len(result)} values" if isinstance(result, (tuple, list)) else type(result).__name__
    return OperatorOutputError(
        f"operator {name!r} returned {got}; expected a tuple of {len(names)} values for {list(names)}",
        operator=name,
        qid=qid,
    )


def _columns_from_values(name, names, outputs, qid) -> dict[str, Column]:
    cols = {}
    for n, values in zip(names, outputs):
        try:
            ctype, arr, valid = build_column(values, n)
        except DataTypeError as e:
            raise OperatorOutputError(f"operator {name!r}: {e}", operator=name, qid=qid) from None
        cols[n] = built_column(ctype, arr, valid)
    return cols


def _map_batch(name, call, names, col, table: Table) -> Table:
    n = len(table)
    if n == 0:  # a batching function is never called with an empty batch
        return Table({c: Column(ColumnType("null"), np.empty(0, dtype=object)) for c in names}, table.qid)
    arg = table[col] if col is not None else table
    return batch_output(name, names, table, _invoke(name, call, arg, None))


def batch_output(name, names, table: Table, result) -> Table:
    """A batching map's output Table from what its function returned for ``table``'s rows
    (checked: one value per input row for each of ``names``)."""
    n = len(table)
    if _is_dataframe_like(result):
        try:
            result = Table.from_any(result)
        except DataError as e:
            raise OperatorOutputError(f"operator {name!r} (batching): {e}", operator=name) from None
    if isinstance(result, Table):
        missing = [c for c in names if c not in result.columns]
        if missing:
            raise OperatorOutputError(f"operator {name!r} returned a Table without columns {missing}", operator=name)
        parts = [result.column(c) for c in names]
        cols = dict(zip(names, parts))
    else:
        if isinstance(result, Mapping):
            missing = [c for c in names if c not in result]
            if missing:
                raise OperatorOutputError(f"operator {name!r} returned a dict without columns {missing}", operator=name)
            values = [result[c] for c in names]
        elif len(names) == 1:
            values = [result]
        elif isinstance(result, (tuple, list)) and len(result) == len(names):
            values = list(result)
        else:
            got = f"{len(result)} columns" if isinstance(result, (tuple, list)) else type(result).__name__
            raise OperatorOutputError(
                f"operator {name!r} (batching) returned {got}; expected {len(names)} columns for {list(names)}",
                operator=name,
            )
        cols = {}
        for c, v in zip(names, values):
            if not hasattr(v, "__len__") or isinstance(v, (str, bytes)):
                raise OperatorOutputError(
                    f"operator {name!r} (batching) returned a {type(v).__name__} for column {c!r}; "
                    f"expected one value per input row",
                    operator=name,
                )
            if type(v) is np.ndarray:
                same = _passed_through(table, v)
                if same is not None:
                    cols[c] = same
                    continue
            if _is_torch(v):
                v = v.detach().cpu().numpy()
            try:
                ctype, arr, valid = build_column(v, c)
            except DataTypeError as e:
                raise OperatorOutputError(f"operator {name!r}: {e}", operator=name) from None
            cols[c] = built_column(ctype, arr, valid)
    for c, column in cols.items():
        if len(column) != n:
            raise OperatorOutputError(
                f"operator {name!r} (batching) returned {len(column)} rows for column {c!r}; the input had {n}",
                operator=name,
            )
    return Table(cols, table.qid)


def _passed_through(table: Table, v: np.ndarray) -> Column | None:
    """The column of ``table`` whose array ``v`` is (as ``table[name]`` gave it, not a
    copy), where building ``v`` again would give that same column: a column the function
    passed on is then kept as it is instead of being checked and built again (about 1 us a
    column saved, on every stage that passes columns on). Not where the function
    may have written a missing value into the array in place (NaN into a float column, None
    into an object one) or the storage would change (another dtype, a strided tensor)."""
    for col in table._cols.values():
        if type(col) is not Column or col.values is not v:
            continue
        if col.valid is not None or v.dtype.kind not in "biuf" or v.dtype != col.type.dtype:
            return None
        if v.ndim == 1 and v.dtype.kind == "f" and any_true(np.isnan(v)):
            return None
        if v.ndim > 1 and not v.flags.c_contiguous:
            return None
        return col
    return None


def _is_torch(v) -> bool:
    return type(v).__module__.startswith("torch")


def _is_dataframe_like(v) -> bool:
    mod = type(v).__module__.split(".")[0]
    return (mod == "pandas" and type(v).__name__ == "DataFrame") or (
        mod == "pyarrow" and type(v).__name__ in ("Table", "RecordBatch")
    )


# -- filter ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterOp(Operator):
    kind = "filter"
    pred: Any = None
    batching_: bool = False

    @property
    def label(self) -> str:
        return callable_name(self.pred)

    def describe(self) -> str:
        return f"filter {self.label}"

    def instantiate(self):
        return _BoundFilter(self, self.label, build_callable(self.pred, None, self.label))


class _BoundFilter(BoundOperator):
    def __init__(self, op, name, call):
        super().__init__(op, name)
        self.call = call

    def __call__(self, inputs, store=None):
        (table,) = inputs
        if self.op.batching and len(table) == 0:  # never called with an empty batch
            return table
        return table.filter(self.keep(table))

    def keep(self, table: Table) -> np.ndarray:
        """One bool per row of ``table``: the rows the predicate keeps. (A key-split part
        of a request needs to know which rows survived, to merge back in order.)"""
        if self.op.batching:
            if len(table) == 0:  # never called with an empty batch
                return np.zeros(0, dtype=bool)
            mask = _invoke(self.name, self.call, table, None)
            if _is_torch(mask):
                mask = mask.detach().cpu().numpy()
            mask = np.asarray(mask)
            if mask.dtype != bool or mask.shape != (len(table),):
                raise OperatorOutputError(
                    f"filter {self.name!r} (batching) must return {len(table)} bools, got {mask.dtype} {mask.shape}",
                    operator=self.name,
                )
            return mask
        keep = np.zeros(len(table), dtype=bool)
        name, call = self.name, self.call
        for i, q in enumerate(table.qid.tolist()):
            result = _invoke(name, call, Row(table, i), q)
            if result is not True and result is not False and type(result) is not np.bool_:
                raise predicate_error(name, result, q)
            keep[i] = result
        return keep


def predicate_error(name: str, result, qid: int) -> OperatorOutputError:
    """A row-wise filter's predicate returned something other than a bool."""
    return OperatorOutputError(
        f"filter {name!r} returned {type(result).__name__}; a filter predicate must return a bool",
        operator=name,
        qid=qid,
    )


# -- aggregation ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AggOp(Operator):
    kind = "agg"
    fn: str = "count"
    col: str | None = None
    by: str | None = None
    name: str = "count"

    @property
    def label(self) -> str:
        return f"{self.fn}" + (f"_{self.col}" if self.col else "") + (f"_by_{self.by}" if self.by else "")

    @property
    def rowwise(self):
        return False  # a group mixes rows: never merge requests into one batch

    def describe(self) -> str:
        target = f"({self.col})" if self.col else "()"
        return f"agg {self.fn}{target} as {self.name}" + (f" by {self.by}" if self.by else "")

    def instantiate(self):
        return _BoundAgg(self, self.label)


class _BoundAgg(BoundOperator):
    op: AggOp  # the subclass binds only this operator kind (declared for the checker; no runtime cost)

    def __call__(self, inputs, store=None):
        (table,) = inputs
        op: AggOp = self.op
        for c in (op.col, op.by):
            if c is not None and c not in table.columns:
                raise SchemaError(
                    f"operator {self.name!r}: input has no column {c!r}; columns are {list(table.columns)}"
                )
        column = table.column(op.col) if op.col else None
        out_type = agg_output_type(op.fn, column.type if column is not None else None, self.name, op.col)
        if op.by is None:
            groups = [(None, np.arange(len(table)))] if len(table) else []
        else:
            groups = _groups(table.column(op.by), self.name)
        if not groups:  # no rows, or no row with a key: no groups, no output rows
            return _empty_agg_output(op, table, out_type)
        qids, values = [], []
        for _key, idx in groups:
            qids.append(int(table.qid[idx].min()))
            values.append(_aggregate(op.fn, column, idx, self.name, op.col))
        cols = {}
        if op.by is not None:
            cols[op.by] = table.column(op.by).take(np.asarray([idx[0] for _, idx in groups], dtype=np.int64))
        try:
            ctype, arr, valid = build_column(values, op.name, out_type)
        except DataTypeError as e:
            raise OperatorOutputError(f"operator {self.name!r}: {e}", operator=self.name) from None
        cols[op.name] = Column(ctype, arr, valid)
        return Table(cols, np.asarray(qids, dtype=np.int64))


def agg_output_type(fn: str, col: ColumnType | None, name: str = "agg", col_name: str | None = None) -> ColumnType:
    """The type of an aggregate's output column, from the aggregated column's type alone.

    count -> int; sum: int/bool -> int, float -> float, tensor -> tensor (numpy's sum dtype);
    mean -> float (tensor: float64 tensor); min/max -> the column's type.
    """
    if fn == "count":
        return ColumnType("int")
    if col is None:  # unreachable through Node.agg, which requires a column for all but count
        raise DataTypeError(f"operator {name!r}: {fn} needs a column")
    kind = col.kind
    if fn in ("sum", "mean") and kind in ("str", "bytes"):
        raise DataTypeError(f"operator {name!r}: cannot {fn} the {kind} column {col_name!r}")
    if kind == "tensor":
        if fn == "mean":
            return ColumnType.tensor(np.float64, col.shape)
        if fn == "sum":
            return ColumnType.tensor(np.add.reduce(np.zeros((1,), col.dtype)).dtype, col.shape)
        return col
    if fn == "sum":
        return ColumnType("float") if kind == "float" else ColumnType("int")
    if fn == "mean":
        return ColumnType("float")
    return col  # min, max (a null column stays null)


def _empty_agg_output(op: AggOp, table: Table, out_type: ColumnType) -> Table:
    schema = {}
    if op.by is not None:
        schema[op.by] = table.column(op.by).type
    schema[op.name] = out_type
    return Table.empty(schema)


def _groups(col: Column, name: str):
    """(key, row positions) per group, sorted by key; rows with a missing key are dropped."""
    if col.type.kind == "tensor":
        raise DataTypeError(f"operator {name!r}: cannot group by a tensor column")
    index: dict[Any, list[int]] = {}
    for i, key in enumerate(col.to_list()):
        if key is None:
            continue  # like SQL and pandas' dropna: rows without a key belong to no group
        index.setdefault(key, []).append(i)
    return [(k, np.asarray(index[k], dtype=np.int64)) for k in sorted(index)]


_INT64_MAX = np.iinfo(np.int64).max


def _aggregate(fn: str, col: Column | None, idx: np.ndarray, name: str, col_name: str | None = None):
    if col is None:
        return len(idx)
    values = col.values[idx]
    if col.valid is not None:
        values = values[col.valid[idx]]  # missing values (None, and NaN in floats) are skipped
    if fn == "count":
        return len(values)
    kind = col.type.kind
    if kind == "null":
        return 0 if fn == "sum" else None
    if len(values) == 0:
        if fn == "sum":
            if kind == "tensor":
                return np.zeros(col.type.shape, agg_output_type("sum", col.type).dtype)
            return 0.0 if kind == "float" else 0
        return None
    if fn == "sum":
        if kind == "int" and len(values) > 1:
            bound = max(abs(int(values.max())), abs(int(values.min())))
            if bound > _INT64_MAX // len(values):  # may overflow: add exactly
                exact = sum(values.tolist())
                if not -_INT64_MAX - 1 <= exact <= _INT64_MAX:
                    raise DataTypeError(
                        f"operator {name!r}: the sum of column {col_name!r} ({exact}) does not fit "
                        f"in int64; map the column to float first"
                    )
                return exact
        out = values.sum(axis=0)
    elif fn == "mean":
        out = values.astype(np.float64).mean(axis=0)
    elif kind in ("str", "bytes"):
        out = min(values) if fn == "min" else max(values)
    else:
        out = values.min(axis=0) if fn == "min" else values.max(axis=0)
    return out.item() if isinstance(out, np.generic) else out


# -- join and union -----------------------------------------------------------------------------


@dataclass(frozen=True)
class JoinOp(Operator):
    kind = "join"
    arity = 2
    on: tuple[str, ...] = ("qid",)
    how: str = "inner"
    suffixes: tuple[str, str] = ("", "_right")

    @property
    def rowwise(self):
        # Joining on qid pairs rows of the same query only; any other key mixes queries.
        return self.on == ("qid",)

    def describe(self) -> str:
        return f"join {self.how} on {', '.join(self.on)}"

    def instantiate(self):
        return _BoundJoin(self, "join")


class _BoundJoin(BoundOperator):
    op: JoinOp  # the subclass binds only this operator kind (declared for the checker; no runtime cost)

    def __call__(self, inputs, store=None):
        left, right = inputs
        return join_tables(left, right, self.op.on, self.op.how, self.op.suffixes, self.name)


def _join_keys(table: Table, on: tuple[str, ...], name: str) -> list:
    """One hashable key per row (None when any part is missing: such rows never match)."""
    parts = []
    for c in on:
        if c == "qid":
            parts.append(table.qid.tolist())
            continue
        col = table.column(c)
        if col.type.kind == "tensor":
            raise DataTypeError(f"operator {name!r}: cannot join on the tensor column {c!r}")
        parts.append(col.to_list())
    if len(parts) == 1:
        return parts[0]
    return [None if any(k is None for k in ks) else ks for ks in zip(*parts)]


def join_tables(left: Table, right: Table, on, how, suffixes, name="join") -> Table:
    """Relational join of two Tables; see JoinOp and docs/flow-semantics.md for the rules.

    Rows pair up where every key is equal and present (a missing key never matches). The
    output has the left columns in their order (keys once), then the right non-key columns;
    a non-key name both sides have gets ``suffixes``. Row order: left rows in order, each
    followed by its matches in right order (unmatched left rows kept for left/outer), then
    (outer) unmatched right rows in order. qid: the left row's, or the right row's if none.
    """
    on = (on,) if isinstance(on, str) else tuple(on)
    for side, t in (("left", left), ("right", right)):
        for c in on:
            if c not in t:
                raise SchemaError(f"operator {name!r}: {side} input has no column {c!r}; columns are {list(t.columns)}")
    keys = [c for c in on if c != "qid"]
    key_types = {}
    for c in keys:
        try:
            key_types[c] = unify(left.column(c).type, right.column(c).type, c)
        except DataTypeError:
            raise DataTypeError(
                f"operator {name!r}: key column {c!r} is {left.column(c).type} on the left and "
                f"{right.column(c).type} on the right; they never match"
            ) from None
    if on == ("qid",):
        pairs = _unique_qid_pairs(left.qid, right.qid, how)
        if pairs is not None:
            li_arr, ri_arr = pairs
            return _joined(left, right, li_arr, ri_arr, keys, key_types, suffixes, name)
    index: dict[Any, list[int]] = {}
    for j, key in enumerate(_join_keys(right, on, name)):
        if key is not None:
            index.setdefault(key, []).append(j)
    li, ri = [], []
    matched_right = np.zeros(len(right), dtype=bool)
    keep_left = how in ("left", "outer")
    for i, key in enumerate(_join_keys(left, on, name)):
        hits = index.get(key) if key is not None else None
        if hits:
            li.extend([i] * len(hits))
            ri.extend(hits)
            matched_right[hits] = True
        elif keep_left:
            li.append(i)
            ri.append(-1)
    if how == "outer":
        unmatched = np.flatnonzero(~matched_right).tolist()
        li.extend([-1] * len(unmatched))
        ri.extend(unmatched)
    li_arr = np.asarray(li, dtype=np.int64)
    ri_arr = np.asarray(ri, dtype=np.int64)
    return _joined(left, right, li_arr, ri_arr, keys, key_types, suffixes, name)


def _unique_qid_pairs(lq: np.ndarray, rq: np.ndarray, how: str):
    """Row pairs of a join on qid, vectorised, when each side has every qid once (the
    common case: two branches of the same requests); None otherwise. Same order as the
    general path: left rows in order, then (outer) unmatched right rows in order."""
    if lq is rq or np.array_equal(lq, rq):  # two branches of one input often share its qid array
        if not _distinct(lq):
            return None
        return SAME_ROWS, SAME_ROWS
    if not (_distinct(lq) and _distinct(rq)):
        return None
    order = np.argsort(rq, kind="stable")
    pos = np.searchsorted(rq[order], lq)
    pos_ok = pos < len(rq)
    hit = np.zeros(len(lq), dtype=bool)
    hit[pos_ok] = rq[order[pos[pos_ok]]] == lq[pos_ok]
    ri = np.full(len(lq), -1, dtype=np.int64)
    ri[hit] = order[pos[hit]]
    li = np.arange(len(lq), dtype=np.int64)
    if how == "inner":
        li, ri = li[hit], ri[hit]
    if how == "outer":
        matched = np.zeros(len(rq), dtype=bool)
        matched[ri[ri >= 0]] = True
        extra = np.flatnonzero(~matched)
        li = np.concatenate([li, np.full(len(extra), -1, dtype=np.int64)])
        ri = np.concatenate([ri, extra.astype(np.int64)])
    return li, ri


SAME_ROWS = object()  # _unique_qid_pairs: both sides hold the same qids in the same order


def _distinct(q: np.ndarray) -> bool:
    # qids usually arrive sorted: a strictly increasing array needs no np.unique
    return len(q) < 2 or bool((q[1:] > q[:-1]).all()) or len(np.unique(q)) == len(q)


def _joined(left: Table, right: Table, li_arr, ri_arr, keys, key_types, suffixes, name) -> Table:
    if li_arr is SAME_ROWS:
        # row i pairs with row i: the columns are reused as they are (a 1:1 join of two
        # branches of the same requests, the usual case, costs no copies)
        return _assemble(
            left,
            right,
            keys,
            suffixes,
            name,
            left.qid,
            {c: left.column(c).as_type(key_types[c]) for c in keys},
            None,
            None,
        )
    left_only = li_arr < 0
    qid = np.empty(len(li_arr), dtype=np.int64)
    if len(li_arr):
        qid[~left_only] = left.qid[li_arr[~left_only]]
        qid[left_only] = right.qid[ri_arr[left_only]]
    key_cols: dict[str, Column] = {}
    for c in keys:  # the key once: from the left row, or the right row when only it exists
        ktype = key_types[c]
        lt = left.column(c).as_type(ktype).take(li_arr)
        if not left_only.any():
            key_cols[c] = lt
            continue
        rt = right.column(c).as_type(ktype).take(ri_arr)
        values = lt.values.copy()
        values[left_only] = rt.values[left_only]
        lvalid = lt.valid if lt.valid is not None else np.ones(len(lt), bool)
        rvalid = rt.valid if rt.valid is not None else np.ones(len(rt), bool)
        key_cols[c] = Column(ktype, values, np.where(left_only, rvalid, lvalid))
    return _assemble(left, right, keys, suffixes, name, qid, key_cols, li_arr, ri_arr)


def _assemble(left, right, keys, suffixes, name, qid, key_cols, li_arr, ri_arr) -> Table:
    """The joined Table: left columns, then right ones (keys once, clashes suffixed);
    rows picked by ``li_arr``/``ri_arr``, or taken as they are when those are None."""
    lsuf, rsuf = suffixes
    clash = (set(left.columns) & set(right.columns)) - set(keys)
    cols: dict[str, Column] = {}
    pending = [(c, c + lsuf if c in clash else c, left, li_arr) for c in left.columns]
    pending += [(c, c + rsuf if c in clash else c, right, ri_arr) for c in right.columns if c not in keys]
    for c, out, src, idx in pending:
        if out in cols:
            raise SchemaError(f"operator {name!r}: output column {out!r} appears twice; pass other suffixes=")
        if src is left and c in key_cols:
            cols[out] = key_cols[c]
        else:
            col = src.column(c)
            cols[out] = col if idx is None else col.take(idx)
    return Table(cols, qid)


@dataclass(frozen=True)
class UnionOp(Operator):
    kind = "union"
    arity: int = 2

    def instantiate(self):
        return _BoundUnion(self, "union")


class _BoundUnion(BoundOperator):
    def __call__(self, inputs, store=None):
        try:
            first = inputs[0].columns
            ordered = [t.select(first) if set(t.columns) == set(first) else t for t in inputs]
            return Table.concat(ordered)
        except (SchemaError, DataTypeError) as e:
            raise type(e)(f"operator {self.name!r}: {e}") from None


# -- lookup ---------------------------------------------------------------------------------


SYSTEM_PREFIX = "flowserve:"  # the runtime's own keys (plans, registry, membership): never a lookup's


def outside_namespace(key, prefixes) -> str | None:
    """Why a flow may not read ``key`` (None: it may). A flow reads user keys only, and
    with declared ``prefixes`` only keys under one of them."""
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    if text.startswith(SYSTEM_PREFIX):
        return f"key {text!r} is in the runtime's namespace ({SYSTEM_PREFIX}*); lookups read user keys only"
    if prefixes is not None and not any(text.startswith(p) for p in prefixes):
        return f"key {text!r} is outside this flow's key namespace {list(prefixes)}"
    return None


@dataclass(frozen=True)
class LookupOp(Operator):
    kind = "lookup"
    key: str | None = None
    column: str | None = None
    name: str = "value"
    missing: str = "error"
    prefixes: tuple[str, ...] | None = None  # the flow's key_prefixes (None: any user key)

    @property
    def dynamic(self) -> bool:
        return self.column is not None

    @property
    def label(self) -> str:
        return f"lookup({self.column or self.key!r})" if self.column else f"lookup({self.key})"

    def describe(self) -> str:
        src = f"column {self.column}" if self.dynamic else f"key {self.key!r}"
        return f"lookup {src} -> {self.name}" + (" [missing=null]" if self.missing == "null" else "")

    def instantiate(self):
        return _BoundLookup(self, self.label)


class _BoundLookup(BoundOperator):
    op: LookupOp  # the subclass binds only this operator kind (declared for the checker; no runtime cost)

    def __call__(self, inputs, store=None):
        (table,) = inputs
        op: LookupOp = self.op
        if store is None:
            raise FlowValueError(f"operator {self.name!r} reads the store: pass kvs= (a KVS client or a dict) to run()")
        cols = table._cols
        if op.name in cols:
            raise SchemaError(
                f"operator {self.name!r}: output column {op.name!r} already exists in its input; pass name="
            )
        if op.dynamic:
            if op.column not in cols:
                raise SchemaError(
                    f"operator {self.name!r}: input has no column {op.column!r}; columns are {list(table.columns)}"
                )
            keys = cols[op.column].to_list()
        else:
            keys = [op.key] * len(table)
        if len(keys) == 1:  # one row (a relayed request's): no generator pass for its one key
            unique = list(dict.fromkeys(keys)) if keys[0] is not None else []
        else:
            unique = list(dict.fromkeys(k for k in keys if k is not None))
        for k in unique:
            if not isinstance(k, (str, bytes)):
                raise DataTypeError(
                    f"operator {self.name!r}: lookup keys must be str or bytes, got {type(k).__name__} {k!r:.40}"
                )
            why = outside_namespace(k, op.prefixes)
            if why is not None:  # checked before anything is read: a client cannot probe the store
                i = keys.index(k)
                raise LookupKeyError(f"operator {self.name!r}: {why}", operator=self.name, qid=int(table.qid[i]))
        found = dict(zip(unique, read_many(store, unique)))
        if op.missing == "error":
            _raise_if_store_lost(store, [k for k in unique if found[k] is _MISSING])
        values = []
        for i, k in enumerate(keys):
            v = found.get(k, _MISSING) if k is not None else _MISSING
            if v is _MISSING:
                if op.missing == "error":
                    what = (
                        f"key {k!r} is not in the store"
                        if k is not None
                        else f"column {op.column!r} is missing (None) in this row, so there is no key to read"
                    )
                    raise LookupKeyError(
                        f"operator {self.name!r}: {what} (pass missing='null' to get None instead)",
                        operator=self.name,
                        qid=int(table.qid[i]),
                    )
                v = None
            values.append(v)
        try:
            ctype, arr, valid = build_column(values, op.name)
        except DataTypeError as e:
            raise OperatorOutputError(f"operator {self.name!r}: {e}", operator=self.name) from None
        return table.with_columns({op.name: Column(ctype, arr, valid)})


def _raise_if_store_lost(store, missing: list) -> None:
    """A key missing from a store that lost its data (restarted empty) is the server's
    loss, not the row's fault: the store raises its retryable error (HTTP 503) then, and
    only a key missing from an intact store is a ``LookupKeyError`` (422). Stores that
    cannot tell (a plain mapping in ``flow.run``) say nothing."""
    check = getattr(store, "raise_if_lost", None)
    if missing and check is not None:
        check(missing)


def read_many(store, keys: list) -> list:
    """Read keys from a KVS-like store or a plain mapping; missing keys give _MISSING."""
    if not keys:
        return []
    if isinstance(store, Mapping):
        return [store.get(k, _MISSING) for k in keys]
    return list(store.mget(keys, default=_MISSING))


# -- anyof ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AnyOfOp(Operator):
    kind = "anyof"
    alternatives: tuple = ()
    names: tuple[str, ...] = ()
    valid: Callable | None = None
    batching_: bool = False
    gpu_: bool = False

    @property
    def label(self) -> str:
        return "anyof(" + ",".join(callable_name(f) for f in self.alternatives) + ")"

    @property
    def high_variance(self):
        return True  # alternatives always race

    @property
    def rowwise(self):
        # An alternative that raises makes all of its rows invalid; on rows merged from
        # several requests one request's failure would change the others' answers.
        return False

    def describe(self) -> str:
        return f"anyof {', '.join(callable_name(f) for f in self.alternatives)} -> {', '.join(self.names)}"

    def alternative(self, i: int) -> MapOp:
        """Alternative ``i`` as a plain map (what a competing replica runs)."""
        return MapOp(fn=self.alternatives[i], names=self.names, batching_=self.batching_, gpu_=self.gpu_)

    def instantiate(self):
        return _BoundAnyOf(self, self.label, [self.alternative(i).instantiate() for i in range(len(self.alternatives))])


class _BoundAnyOf(BoundOperator):
    op: AnyOfOp  # the subclass binds only this operator kind (declared for the checker; no runtime cost)

    def __init__(self, op, name, alternatives):
        super().__init__(op, name)
        self.alternatives = alternatives

    def __call__(self, inputs, store=None):
        (table,) = inputs
        results = []
        for alt in self.alternatives:  # run all of them, as the runtime does
            try:
                results.append(alt([table], store))
            except (OperatorFailedError, OperatorOutputError, RowRejectedError) as e:
                results.append(e)
        return choose_first_valid(self.op, self.name, table, results)


def choose_first_valid(op: AnyOfOp, name: str, table: Table, results: list) -> Table:
    """Per row, the first alternative's result (in argument order) that ``valid`` accepts.

    ``results[i]`` is alternative i's output Table (row-aligned with ``table``), or the
    error it raised (which makes every row of it invalid). A row with no valid result
    fails its query; if every alternative raised, the operator fails even on 0 rows.
    Vectorised: one ``take`` per alternative, one concat, one reorder.
    """
    n = len(table)
    alt_names = [callable_name(f) for f in op.alternatives]
    if not any(isinstance(r, Table) for r in results):
        reasons = "; ".join(f"{alt_names[a]}: {r}" for a, r in enumerate(results)) or "no alternative ran"
        raise NoValidResultError(
            f"operator {name!r}: no alternative gave a valid result ({reasons})",
            operator=name,
            qid=int(table.qid[0]) if n else None,
        )
    choice = np.full(n, -1, dtype=np.int64)
    for a, res in enumerate(results):
        if not isinstance(res, Table):
            continue
        if len(res) != n:
            raise OperatorOutputError(
                f"operator {name!r}: alternative {alt_names[a]!r} gave {len(res)} rows for {n} input rows",
                operator=name,
            )
        todo = np.flatnonzero(choice < 0)
        if len(todo) == 0:
            break
        if op.valid is None:
            choice[todo] = a
            break
        ok = np.fromiter((is_valid(op, name, res, int(i)) for i in todo), dtype=bool, count=len(todo))
        choice[todo[ok]] = a
    bad = np.flatnonzero(choice < 0)
    if len(bad):
        i = int(bad[0])
        reasons = "; ".join(
            f"{alt_names[a]}: {r if isinstance(r, Exception) else 'result not valid'}" for a, r in enumerate(results)
        )
        raise NoValidResultError(
            f"operator {name!r}: no alternative gave a valid result for {len(bad)} of {n} rows ({reasons})",
            operator=name,
            qid=int(table.qid[i]),
        )
    first = next(r for r in results if isinstance(r, Table))
    if n == 0:
        return first
    winners = np.unique(choice)
    if len(winners) == 1:
        return results[int(winners[0])]
    positions = [np.flatnonzero(choice == a) for a in winners]
    try:
        merged = Table.concat([results[int(a)].take(pos) for a, pos in zip(winners, positions)])
    except (SchemaError, DataTypeError) as e:
        raise OperatorOutputError(
            f"operator {name!r}: the alternatives' results do not fit together: {e}", operator=name
        ) from None
    return merged.take(np.argsort(np.concatenate(positions), kind="stable"))


def is_valid(op: AnyOfOp, name: str, result: Table, i: int) -> bool:
    if op.valid is None:
        return True
    try:
        ok = op.valid(Row(result, i))
    except Exception as e:  # the user's valid= predicate: whatever it raises fails the query
        raise OperatorFailedError(
            f"operator {name!r}: valid= raised {type(e).__name__}: {e}", operator=name, qid=int(result.qid[i])
        ) from e
    return bool(ok)
