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

import contextlib
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


def tensor_value(value: Any, column: str, row: int) -> np.ndarray:
    """Row ``row``'s value of tensor column ``column`` as an array of numbers or booleans
    (of its own dtype: the column's type casts it after ``check_fits``). A nested list of
    ragged lengths, or of strings, is a ``DataTypeError`` naming the column and row: the
    same on every path (``flow.run``, HTTP JSON, the relay)."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):  # numpy's "inhomogeneous shape" for ragged nested lists
        arr = None
    if arr is None or arr.dtype == object:
        raise DataTypeError(
            f"column {column!r}: row {row}: not an array of numbers (are its nested lists of different lengths?)"
        )
    if arr.dtype.kind not in "biuf":
        raise DataTypeError(f"column {column!r}: row {row}: not an array of numbers or booleans, got {arr.dtype}")
    return arr


# -- whether a column's values fit its type: one check for every path --------------------

_INT_BOUNDS: dict = {}
_MAY_NOT_FIT: dict = {}


def int_bounds(dtype: np.dtype) -> tuple[int, int]:
    """An integer dtype's (min, max) as ints (np.iinfo computes them on each access)."""
    bounds = _INT_BOUNDS.get(dtype)
    if bounds is None:
        info = np.iinfo(dtype)
        bounds = _INT_BOUNDS[dtype] = (int(info.min), int(info.max))
    return bounds


def may_not_fit(src: np.dtype, dst: np.dtype) -> bool:
    """Whether some value of dtype ``src`` is one ``dst`` cannot hold as it is: a boolean
    as a number or a number as a boolean, a fraction as an integer, an integer or a
    float beyond ``dst``'s range (int64 to uint8, float64 to float32, uint16 to float16;
    never int64 to float32, uint8 to int64, or float32 to float64)."""
    key = (src, dst)
    may = _MAY_NOT_FIT.get(key)
    if may is None:
        if src.kind not in "biuf" or dst.kind not in "biuf":
            may = False  # not numbers: the builders say what is wrong
        elif (src.kind == "b") != (dst.kind == "b"):
            may = True
        elif src.kind == "b" or src == dst:
            may = False
        elif dst.kind == "f":
            limit = np.finfo(src).max if src.kind == "f" else max(-int(np.iinfo(src).min), int(np.iinfo(src).max))
            may = float(limit) > float(np.finfo(dst).max)
        elif src.kind == "f":
            may = True
        else:
            low, high = int_bounds(dst)
            info = np.iinfo(src)
            may = int(info.min) < low or int(info.max) > high
        _MAY_NOT_FIT[key] = may
    return may


def check_fits(values: np.ndarray, type_: ColumnType, column: str, rows: Any = 0) -> None:
    """Refuse a value of ``values`` (rows of ``type_``, the row axis first) that
    ``type_``'s dtype cannot hold as it is: ``DataTypeError`` naming the column, the row,
    the first such value and the type, instead of numpy's cast wrapping it (300 as uint8 is
    44, -1 is 255), truncating it (2.5 is 2) or overflowing it (1e39 as float32 is inf).

    A number fits an integer dtype if it is an integer within its range (75.0 fits uint8,
    as JSON Schema's "integer" says), a float dtype if it stays finite (NaN and infinities
    are values), a bool dtype never; a boolean fits only a bool dtype. ``rows``: the row
    number of ``values``' first row, or an array of each row's number (rows left out,
    e.g. missing ones). flow.run, ``Table`` builders and both HTTP codecs call this, so a
    value means the same on every path. Free when ``values``' dtype always fits; else one
    vectorised pass (min and max), and a second only to find and name a value that does
    not fit."""
    dst = type_.dtype
    if not values.size or not may_not_fit(values.dtype, dst) or _all_fit(values, dst):
        return
    bad = _misfits(values, dst).reshape(len(values), -1)
    if not any_true(bad):
        return
    first = int(np.argmax(bad.ravel()))
    row, at = divmod(first, bad.shape[1])
    value = values.reshape(len(values), -1)[row, at].item()
    row = rows + row if isinstance(rows, int) else int(rows[row])
    raise DataTypeError(f"column {column!r}: row {row}: {value!r} {_does_not_fit(type_)}")


def _all_fit(values: np.ndarray, dst: np.dtype) -> bool:
    """True if every value fits ``dst`` (False: some may not; ``_misfits`` says which)."""
    src = values.dtype
    if (src.kind == "b") != (dst.kind == "b"):
        return False
    low, high = values.min(), values.max()
    if dst.kind == "f":
        limit = np.finfo(dst).max
        return bool(-limit <= low and high <= limit)  # False for NaN and infinities: _misfits decides
    lo, hi = int_bounds(dst)
    if src.kind == "f":
        return bool(lo <= low and high < float(hi) + 1) and bool(np.array_equal(values, np.trunc(values)))
    return lo <= int(low) and int(high) <= hi


def _misfits(values: np.ndarray, dst: np.dtype) -> np.ndarray:
    """Per value, whether it does not fit ``dst`` (see ``check_fits``)."""
    src = values.dtype
    if (src.kind == "b") != (dst.kind == "b"):
        return np.ones(values.shape, dtype=bool)
    if dst.kind == "f":
        with np.errstate(over="ignore"):
            return np.isinf(values.astype(dst)) & np.isfinite(values)
    lo, hi = int_bounds(dst)
    if src.kind == "f":  # NaN fails every comparison: it is no integer
        # float(hi) + 1: int64's max rounds up to 2**63 as a float, which does not fit
        return ~((values >= lo) & (values < float(hi) + 1) & (values == np.trunc(values)))
    src_lo, src_hi = int_bounds(src)  # compare within src's own range (no out-of-range scalars)
    bad = np.zeros(values.shape, dtype=bool)
    if lo > src_lo:
        bad |= values < lo
    if hi < src_hi:
        bad |= values > hi
    return bad


def _does_not_fit(type_: ColumnType) -> str:
    """The end of a misfit's message: the type, and what fits it."""
    dst = type_.dtype
    if dst.kind == "b":
        holds = "booleans"
    elif dst.kind == "f":
        holds = f"numbers within ±{float(np.finfo(dst).max):.8g}"
    else:
        lo, hi = int_bounds(dst)
        holds = f"integers {lo}..{hi}"
    return f"does not fit in {type_ if type_.kind == 'tensor' else dst.name} ({holds})"


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
    if type_ is None and type(values) is list and len(values) == 1 and type(values[0]) is np.ndarray:
        one = _shared_row(values[0])
        if one is None:
            one = _copied_row(values[0])
        if one is not None:
            return one
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
        except OverflowError:  # a Python int beyond int64 (or, in a float column, beyond a double)
            row, big = next((i, v) for i, v in enumerate(filled) if not _fits_scalar(v, kind))
            raise DataTypeError(f"column {column!r}: row {row}: {int(big)!r} {_does_not_fit(ctype)}") from None
        if kind == "float":  # NaN is a missing value, as in pandas (and JSON has no NaN)
            not_nan = _not_nan_mask(arr)
            if not_nan is not None:
                valid = not_nan if valid is None else valid & not_nan
    return ctype, arr, _mask_or_none(valid)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _fits_scalar(value, kind: str) -> bool:
    """Whether an integer (the only value numpy refuses with OverflowError) fits ``kind``."""
    if not isinstance(value, (int, np.integer)):
        return True
    value = int(value)
    if kind == "int":
        return _INT64_MIN <= value <= _INT64_MAX
    try:
        float(value)
    except OverflowError:
        return False
    return True


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


def _shared_row(a: np.ndarray):
    """The column ``_tensor_column`` makes of one frozen numeric array (a KVS cache hit, read
    by a per-row lookup): the array itself as the one row, not copied; None for any other
    array (the general path converts it, or names what is wrong with it)."""
    if (
        a.ndim
        and a.dtype.kind in "biuf"
        and a.dtype.isnative
        and a.flags.c_contiguous
        and a.flags.aligned
        and _is_frozen(a)
    ):
        return ColumnType.tensor(a.dtype, a.shape), a[None], None
    return None


def _copied_row(a: np.ndarray):
    """The column ``_tensor_column`` makes of one numeric array that is not frozen (a
    row-wise map's output, say): a fresh C-order copy of it as the one row, of its dtype
    and shape; None for any other array (the general path converts it, or names what is
    wrong with it)."""
    if a.ndim and a.dtype.kind in "biuf" and a.dtype.isnative:
        out = np.empty((1,) + a.shape, dtype=a.dtype)
        out[0] = a
        return ColumnType.tensor(a.dtype, a.shape), out, None
    return None


def _tensor_column(values, valid, present, column, type_):
    # C-level passes over the rows (map/set), no per-row Python frames: a lookup of 1,000
    # cached arrays spends its time copying, not here
    try:
        arrays = list(map(np.asarray, present))
    except (ValueError, TypeError):  # a ragged nested list: the first such row names itself
        rows = _present_rows(valid, len(values))
        arrays = [tensor_value(v, column, int(r)) for v, r in zip(present, rows)]
    dtypes = set(map(_DTYPE_OF, arrays))
    if any(dt.kind not in "biuf" for dt in dtypes):
        rows = _present_rows(valid, len(values))
        for a, r in zip(arrays, rows):
            tensor_value(a, column, int(r))  # raises for the first row that is not numbers
    shapes = set(map(_SHAPE_OF, arrays))
    if type_ is not None and type_.kind == "tensor" and shapes - {type_.shape}:
        r, a = next((r, a) for r, a in zip(_present_rows(valid, len(values)), arrays) if a.shape != type_.shape)
        raise DataTypeError(f"column {column!r}: row {r}: expected shape {type_.shape}, got {a.shape}")
    if len(shapes) > 1:
        raise DataTypeError(
            f"column {column!r}: ragged tensor column, rows have shapes {sorted(shapes)[:4]}; "
            f"all rows of a tensor column must have the same shape"
        )
    checked = None  # the rows to check after the cast (float targets), with their numbers
    if type_ is not None and type_.kind == "tensor":
        dtype, shape = type_.dtype, type_.shape
        if any(may_not_fit(dt, dtype) for dt in dtypes):
            rows = _present_rows(valid, len(values))
            if dtype.kind == "f" and all(dt.kind in "iuf" for dt in dtypes):
                # numbers into a narrower float: cast first, then look for infinities in the
                # result, one pass over it instead of stacking the rows for a min and a max
                checked = (arrays, rows)
            else:
                _check_rows_fit(arrays, dtypes, type_, column, rows)
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
    # a float beyond the dtype's range becomes an infinity, which ``checked`` looks for below
    # (numpy's warning off only then: errstate costs ~1.5 us a column)
    with np.errstate(over="ignore") if checked is not None else _NO_CONTEXT:
        np.concatenate(arrays, out=out.reshape((n * shape[0],) + shape[1:]), casting="unsafe")
        if work != dtype:
            out = out.astype(dtype)
    if checked is not None and any_true(np.isinf(out)):  # an overflow, or an infinity given as one
        _check_rows_fit(checked[0], dtypes, type_, column, checked[1])
    return ColumnType.tensor(dtype, shape), out, _mask_or_none(valid)


_DTYPE_OF, _SHAPE_OF = attrgetter("dtype"), attrgetter("shape")
_NO_CONTEXT = contextlib.nullcontext()


def _present_rows(valid: np.ndarray | None, n: int) -> np.ndarray:
    """The row numbers of the present values (all rows when none is missing)."""
    return np.arange(n) if valid is None else np.flatnonzero(valid)


def _check_rows_fit(arrays: list, dtypes: set, type_: ColumnType, column: str, rows: np.ndarray) -> None:
    """``check_fits`` over rows given one array each (``rows``: their row numbers)."""
    if len(dtypes) > 1 and any(dt.kind == "b" for dt in dtypes):
        # booleans beside numbers would become 0 and 1 in a common dtype: row by row
        for a, r in zip(arrays, rows):
            check_fits(a[None], type_, column, int(r))
        return
    check_fits(np.stack(arrays), type_, column, rows)


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
            if type_.kind == "tensor" and type_.shape != ctype.shape and len(arr):
                # every row has the array's shape: the first is wrong, as built row by row
                raise DataTypeError(f"column {column!r}: row 0: expected shape {type_.shape}, got {ctype.shape}")
            if type_.kind != "tensor" or type_.shape != ctype.shape:
                raise DataTypeError(f"column {column!r}: expected {type_}, got {ctype}")
            check_fits(arr, type_, column)
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
    ctype = ColumnType.scalar(kind)
    check_fits(arr, ctype, column)  # uint64 beyond int64
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
