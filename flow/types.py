"""Column types of a Table, and inference of a column's type from Python or numpy values.

A column is one of: ``int`` (int64), ``float`` (float64), ``bool``, ``str``, ``bytes``,
``tensor`` (same-shape numeric n-d arrays, stored as one contiguous array with the row
axis first), or ``null`` (every value missing, type not yet known). Any column may hold
missing values (``None``), which appear after left/outer joins and from operators that
return ``None``.

Columns are immutable by convention, so a one-row tensor column built from a frozen array
(read-only and backed by ``bytes``, as KVS cache hits are) is a read-only view of it, not a
copy; several rows are copied once into one new array.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter
from typing import Any

import numpy as np

from flow.errors import DataTypeError

SCALAR_KINDS = ("int", "float", "bool", "str", "bytes")
KINDS = SCALAR_KINDS + ("tensor", "null")

_STORAGE = {
    "int": np.dtype(np.int64),
    "float": np.dtype(np.float64),
    "bool": np.dtype(np.bool_),
    "str": np.dtype(object),
    "bytes": np.dtype(object),
    "null": np.dtype(object),
}
_FILL = {"int": 0, "float": np.nan, "bool": False, "str": "", "bytes": b"", "null": None}


@dataclass(frozen=True)
class ColumnType:
    """The type of one column: a kind, and for tensors the element dtype and row shape."""

    kind: str
    # None only as an argument: __post_init__ sets the storage dtype of every kind
    dtype: np.dtype = None  # type: ignore[assignment]  # never None once built
    shape: tuple[int, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown column kind {self.kind!r}; expected one of {KINDS}")
        if self.kind == "tensor":
            if self.dtype is None:
                raise ValueError("a tensor column type needs a dtype")
            object.__setattr__(self, "dtype", np.dtype(self.dtype))
            object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        else:
            object.__setattr__(self, "dtype", _STORAGE[self.kind])
            if self.shape:
                raise ValueError(f"a {self.kind} column has no row shape, got {self.shape}")

    @classmethod
    def tensor(cls, dtype, shape: Sequence[int]) -> ColumnType:
        return _tensor_type(np.dtype(dtype), tuple(shape))

    @classmethod
    def scalar(cls, kind: str) -> ColumnType:
        """The (shared, immutable) type of a non-tensor kind: built once, not per column."""
        try:
            return _SCALAR_TYPES[kind]
        except KeyError:
            return cls(kind)  # raises the unknown-kind error

    def fill_value(self):
        """The placeholder stored where a value is missing (it is masked out)."""
        if self.kind == "tensor":
            return np.zeros(self.shape, dtype=self.dtype)
        return _FILL[self.kind]

    def __str__(self) -> str:
        if self.kind == "tensor":
            return f"tensor[{self.dtype}, {self.shape}]"
        return self.kind

    __repr__ = __str__

    def to_json(self) -> dict:
        if self.kind == "tensor":
            return {"kind": "tensor", "dtype": self.dtype.str, "shape": list(self.shape)}
        return {"kind": self.kind}

    @classmethod
    def from_json(cls, doc: Mapping) -> ColumnType:
        if doc.get("kind") == "tensor":
            return cls.tensor(np.dtype(doc["dtype"]), doc["shape"])
        return cls(doc["kind"])

    @classmethod
    def parse(cls, spec: Any, column: str) -> ColumnType:
        """Accept a ColumnType, a kind name, a Python type, or a numpy dtype."""
        if isinstance(spec, ColumnType):
            return spec
        if isinstance(spec, str) and spec in KINDS and spec != "tensor":
            return cls(spec)
        by_python = {int: "int", float: "float", bool: "bool", str: "str", bytes: "bytes"}
        if isinstance(spec, type) and spec in by_python:
            return cls(by_python[spec])
        try:
            dt = np.dtype(spec)
        except TypeError:
            dt = None
        kind = _kind_of_dtype(dt) if dt is not None and dt.kind in "iub f" else None
        if kind is not None:  # always, for those dtype kinds
            return cls(kind)
        raise DataTypeError(
            f"column {column!r}: cannot understand type {spec!r}; use int, float, bool, str, "
            f"bytes or ColumnType.tensor(dtype, shape)"
        )


_SCALAR_TYPES = {k: ColumnType(k) for k in KINDS if k != "tensor"}


@lru_cache(maxsize=1024)
def _tensor_type(dtype: np.dtype, shape: tuple) -> ColumnType:
    # a request's columns are built per operator: reuse their (immutable) types
    return ColumnType("tensor", dtype, shape)


def any_true(mask: np.ndarray) -> np.bool_:
    """``mask.any()`` for a bool array, without ndarray.any's Python-level dispatch (a
    quarter of the cost on the one-row tables of single requests)."""
    return np.count_nonzero(mask) > 0


def _kind_of_dtype(dt: np.dtype) -> str | None:
    if dt.kind == "b":
        return "bool"
    if dt.kind in "iu":
        return "int"
    if dt.kind == "f":
        return "float"
    if dt.kind == "U":
        return "str"
    if dt.kind == "S":
        return "bytes"
    return None


def _value_kind(value: Any) -> str:
    """The kind of a present value (callers drop the Nones first)."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, (np.ndarray, list, tuple)):
        return "tensor"
    return "other"


def _as_tensor(value: Any, column: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype.kind not in "biuf":
        raise DataTypeError(
            f"column {column!r}: array values must be numeric or bool, got dtype {arr.dtype}"
            + (" (are the rows of different lengths?)" if arr.dtype == object else "")
        )
    return arr


def build_column(values: Any, column: str, type_: ColumnType | None = None):
    """Turn a sequence or array of values into (ColumnType, storage array, valid mask | None).

    Raises DataTypeError naming ``column`` for ragged tensors, mixed or unsupported types.
    """
    if _is_pandas_series(values):
        if isinstance(values.dtype, np.dtype) and values.dtype.kind in "biuf":
            values = values.to_numpy()  # NaN in floats = missing, handled below
        elif values.dtype.kind in "biuf" and not values.hasnans:  # nullable dtypes without NA
            values = values.to_numpy(dtype=values.dtype.numpy_dtype)
        else:  # object, str, nullable: every kind of missing (None, NaN, NA, NaT) -> None
            missing = values.isna().to_numpy()
            values = [None if m else v for v, m in zip(values.tolist(), missing)]
    if isinstance(values, np.ndarray) and values.dtype != object:
        return _from_typed_array(values, column, type_)
    if isinstance(values, (str, bytes, np.generic)) or not hasattr(values, "__iter__"):
        raise DataTypeError(f"column {column!r}: expected a sequence of values, got {type(values).__name__}")
    values = list(values)
    if type_ is None and values:
        fast = _plain_numbers(values)
        if fast is not None:
            return fast
    present = [v for v in values if v is not None]
    valid = None  # every value present; else one bool per value
    if len(present) < len(values):
        valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    kind = type_.kind if type_ is not None else _infer_kind(present, column)
    if kind == "null":
        if present:
            raise DataTypeError(
                f"column {column!r}: expected null (all values missing), got {type(present[0]).__name__}"
            )
        return ColumnType("null"), np.full(len(values), None, dtype=object), _mask_or_none(valid)
    if kind == "tensor":
        return _tensor_column(values, valid, present, column, type_)
    ctype = ColumnType.scalar(kind)
    fill = ctype.fill_value()
    filled = [fill if v is None else v for v in values]
    _check_scalars(present, kind, column)
    if kind in ("str", "bytes"):
        arr = np.empty(len(filled), dtype=object)
        arr[:] = [bytes(v) if kind == "bytes" else v for v in filled]
    else:
        try:
            arr = np.asarray(filled, dtype=ctype.dtype)
        except OverflowError:
            big = next(v for v in present if isinstance(v, int) and not _INT64_MIN <= v <= _INT64_MAX)
            raise DataTypeError(f"column {column!r}: {big} does not fit in int64") from None
        if kind == "float":  # NaN is a missing value, as in pandas (and JSON has no NaN)
            not_nan = _not_nan_mask(arr)
            if not_nan is not None:
                valid = not_nan if valid is None else valid & not_nan
    return ctype, arr, _mask_or_none(valid)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _plain_numbers(values: list):
    """The common case of a row-wise operator's output, all Python floats or all Python
    ints (not bools), built without the general path's per-value checks; None otherwise."""
    first = type(values[0])
    if first is not float and first is not int:
        return None
    for v in values:
        if type(v) is not first:
            return None
    kind = "float" if first is float else "int"
    try:
        arr = np.array(values, dtype=_STORAGE[kind])
    except OverflowError:  # an int beyond int64: the general path names it
        return None
    return ColumnType.scalar(kind), arr, _not_nan_mask(arr) if kind == "float" else None


def _not_nan_mask(arr: np.ndarray) -> np.ndarray | None:
    """A float column's validity: False where the value is NaN (a missing value, as in
    pandas); None when nothing is NaN."""
    nan = np.isnan(arr)
    return ~nan if any_true(nan) else None


def _is_pandas_series(values) -> bool:
    return type(values).__name__ == "Series" and type(values).__module__.startswith("pandas")


def _mask_or_none(valid: np.ndarray | None) -> np.ndarray | None:
    return None if valid is None or np.count_nonzero(valid) == len(valid) else valid


def _infer_kind(present: list, column: str) -> str:
    if not present:
        return "null"
    # a value's kind depends on its type alone: one check when every value has the same type
    if len(present) == 1 or len(set(map(type, present))) == 1:
        kinds = {_value_kind(present[0])}
    else:
        kinds = {_value_kind(v) for v in present}
    if "other" in kinds:
        bad = next(v for v in present if _value_kind(v) == "other")
        raise DataTypeError(
            f"column {column!r}: unsupported value type {type(bad).__name__}; supported are "
            f"int, float, bool, str, bytes and numeric arrays"
        )
    if kinds == {"int", "float"}:
        return "float"
    if len(kinds) > 1:
        raise DataTypeError(f"column {column!r}: mixed value types {sorted(kinds)}")
    return kinds.pop()


def _check_scalars(present: list, kind: str, column: str) -> None:
    allowed = {
        "int": (int, np.integer),
        "float": (int, float, np.integer, np.floating),
        "bool": (bool, np.bool_),
        "str": (str,),
        "bytes": (bytes, bytearray, memoryview),
    }[kind]
    for v in present:
        if not isinstance(v, allowed) or (kind in ("int", "float") and isinstance(v, (bool, np.bool_))):
            raise DataTypeError(f"column {column!r}: expected {kind}, got {type(v).__name__} {v!r:.40}")


def _tensor_column(values, valid, present, column, type_):
    # C-level passes over the rows (map/set), no per-row Python frames: a lookup of 1,000
    # cached arrays spends its time copying, not here
    try:
        arrays = list(map(np.asarray, present))
    except Exception:  # e.g. a ragged nested list: fail on the same row, same error as per row
        arrays = [_as_tensor(v, column) for v in present]
    dtypes = set(map(_DTYPE_OF, arrays))
    if any(dt.kind not in "biuf" for dt in dtypes):
        _as_tensor(next(a for a in arrays if a.dtype.kind not in "biuf"), column)  # raises, first bad row
    shapes = set(map(_SHAPE_OF, arrays))
    if len(shapes) > 1:
        raise DataTypeError(
            f"column {column!r}: ragged tensor column, rows have shapes {sorted(shapes)[:4]}; "
            f"all rows of a tensor column must have the same shape"
        )
    if type_ is not None and type_.kind == "tensor":
        dtype, shape = type_.dtype, type_.shape
        if arrays and arrays[0].shape != shape:
            raise DataTypeError(f"column {column!r}: expected shape {shape}, got {arrays[0].shape}")
    elif arrays:
        dtype, shape = np.result_type(*dtypes) if len(dtypes) == 1 else np.result_type(*arrays), arrays[0].shape
    else:
        raise DataTypeError(f"column {column!r}: cannot infer a tensor shape from no values")
    if shape == ():
        raise DataTypeError(f"column {column!r}: 0-d arrays are scalars; store them as numbers")
    n = len(values)
    if not arrays:
        return ColumnType.tensor(dtype, shape), np.zeros((n,) + shape, dtype=dtype), _mask_or_none(valid)
    if n == 1 and len(arrays) == 1:
        a = arrays[0]
        if a.dtype == dtype and a.flags.c_contiguous and a.flags.aligned and _is_frozen(a):
            # nobody can change a frozen array (a KVS cache hit): share it, do not copy
            out = a[None] if a.dtype is dtype else a.view(dtype)[None]
            return ColumnType.tensor(dtype, shape), out, None
    # rows of several dtypes under a declared dtype: promote, then cast (as numpy's stack did)
    work = np.result_type(*arrays) if len(dtypes) > 1 and type_ is not None else dtype
    if len(arrays) < n:  # missing rows hold zeros
        fill, it = np.zeros(shape, dtype=work), iter(arrays)
        arrays = [next(it) if ok else fill for ok in valid.tolist()]
    # one C call, one pass, no zero fill: each row is cast into its place in a fresh C-order
    # (n, *shape) array (concatenate's own result would follow the rows' layout)
    out = np.empty((n,) + shape, dtype=work)
    np.concatenate(arrays, out=out.reshape((n * shape[0],) + shape[1:]), casting="unsafe")
    if work != dtype:
        out = out.astype(dtype)
    return ColumnType.tensor(dtype, shape), out, _mask_or_none(valid)


_DTYPE_OF, _SHAPE_OF = attrgetter("dtype"), attrgetter("shape")


def _is_frozen(a: np.ndarray) -> bool:
    """Whether nobody can change ``a``'s data: ``a`` and every array it views are read-only
    and the memory is owned by one of them or by ``bytes`` (a KVS value is a view of the
    bytes it was decoded from). A read-only view of a writable array is not frozen."""
    if a.flags.writeable:
        return False
    base = a.base
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    while isinstance(base, memoryview):
        if not base.readonly:
            return False
        base = base.obj
    return base is None or type(base) is bytes


def _from_typed_array(arr: np.ndarray, column: str, type_: ColumnType | None):
    if arr.ndim == 0:
        raise DataTypeError(f"column {column!r}: expected a sequence of values, got a 0-d array")
    if arr.ndim > 1:
        if arr.dtype.kind not in "biuf":
            raise DataTypeError(f"column {column!r}: tensor dtype must be numeric or bool, got {arr.dtype}")
        ctype = ColumnType.tensor(arr.dtype, arr.shape[1:])
        if type_ is not None and type_ != ctype:
            if type_.kind != "tensor" or type_.shape != ctype.shape:
                raise DataTypeError(f"column {column!r}: expected {type_}, got {ctype}")
            return type_, np.ascontiguousarray(arr, dtype=type_.dtype), None
        return ctype, np.ascontiguousarray(arr), None
    kind = _kind_of_dtype(arr.dtype)
    if kind is None:
        raise DataTypeError(f"column {column!r}: unsupported dtype {arr.dtype}")
    if kind in ("str", "bytes"):
        return build_column(arr.tolist(), column, type_)
    if type_ is not None and type_.kind != kind:
        if not (type_.kind == "float" and kind == "int"):
            raise DataTypeError(f"column {column!r}: expected {type_}, got {kind} (dtype {arr.dtype})")
        kind = "float"
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and len(arr) and arr.max() > _INT64_MAX:
        raise DataTypeError(f"column {column!r}: {arr.max()} does not fit in int64")
    ctype = ColumnType.scalar(kind)
    out = np.ascontiguousarray(arr, dtype=ctype.dtype)
    return ctype, out, _not_nan_mask(out) if kind == "float" else None


def unify(a: ColumnType, b: ColumnType, column: str) -> ColumnType:
    """The type two columns of the same name share when their rows are put together."""
    if a == b:
        return a
    if a.kind == "null":
        return b
    if b.kind == "null":
        return a
    if {a.kind, b.kind} == {"int", "float"}:
        return ColumnType("float")
    if a.kind == b.kind == "tensor" and a.shape == b.shape:
        return ColumnType.tensor(np.result_type(a.dtype, b.dtype), a.shape)
    raise DataTypeError(f"column {column!r}: cannot combine {a} with {b}")
