"""Column types and build_column: inference, coercion and the errors that name the column."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from flow import ColumnType, DataTypeError
from flow.types import build_column, check_fits, unify

# -- ColumnType -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, kind",
    [
        (int, "int"),
        (float, "float"),
        (bool, "bool"),
        (str, "str"),
        (bytes, "bytes"),
        ("int", "int"),
        ("null", "null"),
        (np.int32, "int"),
        (np.uint8, "int"),
        (np.float32, "float"),
        (np.dtype(bool), "bool"),
    ],
)
def test_parse_accepts_python_types_kind_names_and_dtypes(spec, kind):
    assert ColumnType.parse(spec, "c").kind == kind


@pytest.mark.parametrize("spec", [object, "tensor", "complex", np.complex64, list])
def test_parse_rejects_unknown_types_naming_the_column(spec):
    with pytest.raises(DataTypeError, match="column 'img'"):
        ColumnType.parse(spec, "img")


def test_tensor_type_and_json_round_trip():
    t = ColumnType.tensor(np.float32, [2, 3])
    assert t.kind == "tensor" and t.dtype == np.float32 and t.shape == (2, 3)
    assert str(t) == "tensor[float32, (2, 3)]"
    assert ColumnType.from_json(t.to_json()) == t
    assert ColumnType.from_json(ColumnType("str").to_json()) == ColumnType("str")
    assert ColumnType.parse(t, "x") is t


def test_column_type_rejects_bad_values():
    with pytest.raises(ValueError, match="unknown column kind"):
        ColumnType("complex")
    with pytest.raises(ValueError, match="needs a dtype"):
        ColumnType("tensor")
    with pytest.raises(ValueError, match="no row shape"):
        ColumnType("int", shape=(2,))


def test_fill_values():
    assert ColumnType("int").fill_value() == 0
    assert np.isnan(ColumnType("float").fill_value())
    assert ColumnType.tensor(np.int8, (2,)).fill_value().tolist() == [0, 0]


# -- build_column: inference ------------------------------------------------------------------


@pytest.mark.parametrize(
    "values, kind",
    [
        ([1, 2], "int"),
        ([1.5, 2], "float"),
        ([True, False], "bool"),
        (["a", "b"], "str"),
        ([b"a", bytearray(b"b")], "bytes"),
        ([None, None], "null"),
        ([], "null"),
        ([np.int16(1), 2], "int"),
        ([np.float32(1.5)], "float"),
        ([np.bool_(True)], "bool"),
        ([np.str_("x")], "str"),
    ],
)
def test_kind_inference(values, kind):
    ctype, arr, _ = build_column(values, "c")
    assert ctype.kind == kind
    assert len(arr) == len(values)


def test_missing_values_are_masked():
    ctype, arr, valid = build_column([1, None, 3], "c")
    assert ctype.kind == "int" and arr.dtype == np.int64
    assert valid.tolist() == [True, False, True]


def test_nan_is_missing_in_float_columns():
    for values in ([1.0, float("nan"), None], np.array([1.0, np.nan, np.nan])):
        ctype, arr, valid = build_column(values, "c")
        assert ctype.kind == "float"
        assert valid.tolist() == [True, False, False]
        assert np.isnan(arr[1:]).all()  # storage holds NaN where missing
    # int and NaN: a float column, as in pandas
    assert build_column([1, float("nan")], "c")[0].kind == "float"


@pytest.mark.parametrize("values", [[0.5, float("nan"), 2.0], [1, 2, 3], [float("nan")], [2**62, -(2**62)]])
def test_plain_number_lists_build_like_the_general_path(values):
    """All-float or all-int lists take a shortcut; it must agree with the general path
    (a None forces the general path and then masks one more row)."""
    ctype, arr, valid = build_column(values, "c")
    gtype, garr, gvalid = build_column(values + [None], "c")
    assert ctype == gtype and arr.dtype == garr.dtype
    np.testing.assert_array_equal(arr, garr[:-1])
    expected = None if gvalid[:-1].all() else gvalid[:-1].tolist()
    assert (None if valid is None else valid.tolist()) == expected


def test_plain_ints_beyond_int64_still_name_the_column():
    with pytest.raises(DataTypeError, match="column 'big'.*does not fit in int64"):
        build_column([2**63], "big")


def test_column_types_are_shared_and_still_checked():
    assert ColumnType.tensor(np.float32, (2, 3)) is ColumnType.tensor("float32", [2, 3])
    assert ColumnType.scalar("float") is ColumnType.scalar("float") == ColumnType("float")
    with pytest.raises(ValueError, match="unknown column kind"):
        ColumnType.scalar("tensor-ish")


def test_nan_inside_a_tensor_is_a_value_not_a_missing_row():
    ctype, arr, valid = build_column([np.array([np.nan, 1.0])], "c")
    assert ctype.kind == "tensor" and valid is None and np.isnan(arr[0, 0])


def test_tensor_column_is_one_contiguous_array():
    ctype, arr, valid = build_column([np.zeros((2, 3)), np.ones((2, 3)), None], "img")
    assert ctype == ColumnType.tensor(np.float64, (2, 3))
    assert arr.shape == (3, 2, 3) and arr.flags.c_contiguous
    assert valid.tolist() == [True, True, False]
    ctype, arr, _ = build_column([[1, 2], [3, 4]], "v")  # lists are tensors too
    assert ctype == ColumnType.tensor(np.int64, (2,)) and arr.tolist() == [[1, 2], [3, 4]]


def test_typed_2d_array_is_a_tensor_column_without_copy():
    data = np.arange(6, dtype=np.float32).reshape(3, 2)
    ctype, arr, valid = build_column(data, "x")
    assert ctype == ColumnType.tensor(np.float32, (2,)) and valid is None
    assert np.shares_memory(arr, data)


def frozen(arr: np.ndarray) -> np.ndarray:
    """A read-only array backed by bytes, like a value from the KVS cache."""
    return np.frombuffer(arr.tobytes(), dtype=arr.dtype).reshape(arr.shape)


def test_one_row_of_a_frozen_array_is_a_view_not_a_copy():
    value = frozen(np.arange(12, dtype=np.float32).reshape(3, 4))
    ctype, arr, valid = build_column([value], "emb")
    assert ctype == ColumnType.tensor(np.float32, (3, 4)) and valid is None
    assert arr.shape == (1, 3, 4) and arr.flags.c_contiguous
    assert np.shares_memory(arr, value)  # no copy of a cached 8 MB array
    assert not arr.flags.writeable  # and no way to change the cached value through it
    assert arr[0].tolist() == value.tolist()
    want = ColumnType.tensor(np.float32, (3, 4))  # a declared type that matches: a view too
    assert np.shares_memory(build_column([value], "emb", want)[1], value)


def _readonly_view(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a,  # writable: its owner may change it later
        _readonly_view,  # read-only, but a view of a writable array
        lambda a: frozen(np.asfortranarray(a).T).T,  # frozen but Fortran-ordered
        lambda a: frozen(a.astype(">f4")),  # frozen but not in the column's (native) dtype
    ],
    ids=["writable", "readonly-view-of-writable", "frozen-fortran", "frozen-big-endian"],
)
def test_one_row_is_copied_when_sharing_is_not_safe(make):
    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    value = make(base)
    ctype, arr, _ = build_column([value], "c")
    assert ctype == ColumnType.tensor(np.float32, (2, 3)) and arr.dtype == np.dtype("=f4")
    assert arr.flags.c_contiguous and arr.tolist() == [base.tolist()]
    assert not np.shares_memory(arr, value)
    base += 1  # the owner changes its array: the column keeps the values it was built from
    assert arr.tolist() == [[[0, 1, 2], [3, 4, 5]]]


def test_one_frozen_row_with_another_declared_dtype_is_converted():
    value = frozen(np.array([1.0, -2.0, 3.0]))
    ctype, arr, _ = build_column([value], "c", ColumnType.tensor(np.int32, (3,)))
    assert ctype == ColumnType.tensor(np.int32, (3,)) and arr.dtype == np.int32
    assert arr.tolist() == [[1, -2, 3]] and not np.shares_memory(arr, value)


def test_several_rows_make_one_fresh_contiguous_array():
    rows = [frozen(np.full((2, 2), i, dtype=np.float32)) for i in range(3)]
    ctype, arr, valid = build_column(rows, "c")
    assert ctype == ColumnType.tensor(np.float32, (2, 2)) and valid is None
    assert arr.shape == (3, 2, 2) and arr.flags.c_contiguous and arr.flags.writeable
    assert not any(np.shares_memory(arr, r) for r in rows)
    assert arr.tolist() == [r.tolist() for r in rows]


def test_missing_tensor_rows_hold_zeros_and_are_masked():
    rows = [None, frozen(np.full(3, 7.0)), None, np.full(3, 8.0)]
    ctype, arr, valid = build_column(rows, "c")
    assert ctype == ColumnType.tensor(np.float64, (3,)) and valid.tolist() == [False, True, False, True]
    assert arr.tolist() == [[0.0] * 3, [7.0] * 3, [0.0] * 3, [8.0] * 3]
    value = frozen(np.full(3, 7.0))  # one row present of two: a new array, not a view
    _, arr, valid = build_column([value, None], "c")
    assert arr.tolist() == [[7.0] * 3, [0.0] * 3] and valid.tolist() == [True, False]
    assert not np.shares_memory(arr, value)
    _, arr, valid = build_column([None, None], "c", ColumnType.tensor(np.int8, (2,)))
    assert arr.dtype == np.int8 and arr.tolist() == [[0, 0], [0, 0]] and valid.tolist() == [False, False]


def test_tensor_rows_are_promoted_or_converted_to_the_column_dtype():
    ctype, arr, _ = build_column([np.zeros(2, np.float32), np.ones(2, np.int64)], "c")
    assert ctype == ColumnType.tensor(np.float64, (2,)) and arr.dtype == np.float64
    ctype, arr, _ = build_column(
        [frozen(np.array([1.0, -1.0])), np.array([300.0, 2.0])], "c", ColumnType.tensor(np.int16, (2,))
    )
    assert arr.dtype == np.int16 and arr.tolist() == [[1, -1], [300, 2]]
    # rows of several dtypes are promoted together first, then cast (as np.stack did): 2**53 + 1
    # goes through float64 on its way to int64
    big = np.array([2**53 + 1], dtype=np.int64)
    _, arr, _ = build_column([big, np.array([0.0], np.float32)], "c", ColumnType.tensor(np.int64, (1,)))
    assert arr.tolist() == [[2**53], [0]]
    ctype, arr, _ = build_column([frozen(np.zeros(2, ">f4"))] * 2, "c")  # native byte order
    assert arr.dtype == np.dtype("<f4") and ctype == ColumnType.tensor(np.float32, (2,))


def test_tensor_row_errors_name_the_first_bad_row():
    with pytest.raises(DataTypeError, match=r"column 'c': row 1: not an array of numbers or booleans, got <U1$"):
        build_column([np.zeros(2), np.array(["a", "b"]), np.array([b"x", b"y"])], "c")
    with pytest.raises(DataTypeError, match=r"row 2: not an array of numbers \(are its nested lists of different"):
        build_column([np.zeros(2), None, [1, None]], "c")
    with pytest.raises(DataTypeError, match=r"ragged tensor column, rows have shapes \[\(2,\), \(3,\)\]; all rows"):
        build_column([frozen(np.zeros(2))] * 3 + [np.zeros(3)], "c")


def test_pandas_series_is_accepted():
    ctype, arr, valid = build_column(pd.Series([1.0, None]), "x")
    assert ctype.kind == "float" and valid.tolist() == [True, False]
    assert build_column(pd.Series(["a", None]), "x")[0].kind == "str"


# -- build_column: errors name the column ------------------------------------------------------


@pytest.mark.parametrize(
    "values, match",
    [
        ([np.zeros(2), np.zeros(3)], "ragged tensor column"),
        ([[1, 2], [1]], "ragged|different lengths"),
        ([1, "a"], "mixed value types"),
        ([True, 1], "mixed value types"),  # bool is not an int
        ([{"a": 1}], "unsupported value type dict"),
        ([np.array(1.0)], "0-d arrays are scalars"),
        ([np.array(["a", "b"])], "not an array of numbers or booleans"),
        ([2**63], "does not fit in int64"),
        ([-(2**63) - 1], "does not fit in int64"),
        (np.array([2**63], dtype=np.uint64), "does not fit in int64"),
        (np.array(["2020-01-01"], dtype="datetime64[D]"), "unsupported dtype"),
        (np.float64(1.0), "expected a sequence of values"),
        (np.array(1.0), "0-d array"),
        ("abc", "expected a sequence of values"),
    ],
)
def test_bad_values_raise_data_type_error_naming_the_column(values, match):
    with pytest.raises(DataTypeError, match=f"column 'col'.*({match})"):
        build_column(values, "col")


def test_int64_bounds_are_accepted():
    _, arr, _ = build_column([2**63 - 1, -(2**63)], "c")
    assert arr.tolist() == [2**63 - 1, -(2**63)]
    _, arr, _ = build_column(np.array([2**63 - 1], dtype=np.uint64), "c")
    assert arr.dtype == np.int64 and arr.tolist() == [2**63 - 1]


# -- build_column with a declared type ------------------------------------------------------


def test_declared_float_accepts_ints():
    ctype, arr, _ = build_column([1, 2], "c", ColumnType("float"))
    assert ctype.kind == "float" and arr.dtype == np.float64
    ctype, arr, _ = build_column(np.array([1, 2]), "c", ColumnType("float"))
    assert ctype.kind == "float" and arr.dtype == np.float64


@pytest.mark.parametrize(
    "values, want",
    [
        ([True], "int"),
        ([1], "bool"),
        ([1.5], "int"),
        ([1.0], "int"),
        ([True], "float"),
        (np.array([True]), "int"),
        (np.array([1]), "bool"),
        (np.array([1.5]), "int"),
        ([1], "str"),
        (["a"], "bytes"),
        ([1], "null"),
    ],
)
def test_declared_type_is_strict_about_bool_int_float_and_str(values, want):
    with pytest.raises(DataTypeError, match="column 'c'"):
        build_column(values, "c", ColumnType(want))


def test_declared_tensor_shape_is_checked():
    want = ColumnType.tensor(np.float64, (2,))
    assert build_column([None, None], "t", want)[0] == want
    with pytest.raises(DataTypeError, match=r"column 't': row 0: expected shape \(2,\), got \(3,\)"):
        build_column([np.zeros(3)], "t", want)
    with pytest.raises(DataTypeError, match="column 't'"):
        build_column(np.zeros((2, 3)), "t", want)


def test_declared_type_gives_all_missing_columns_their_type():
    ctype, arr, valid = build_column([None, None], "c", ColumnType("int"))
    assert ctype.kind == "int" and valid.tolist() == [False, False]


# -- unify -------------------------------------------------------------------------------------


def test_unify_rules():
    i, f, b, s, n = (ColumnType(k) for k in ("int", "float", "bool", "str", "null"))
    assert unify(i, f, "c") == f and unify(f, i, "c") == f
    assert unify(n, s, "c") == s and unify(b, n, "c") == b
    t32, t64 = ColumnType.tensor(np.float32, (2,)), ColumnType.tensor(np.float64, (2,))
    assert unify(t32, t64, "c") == t64
    for a, b_ in ((b, i), (s, ColumnType("bytes")), (i, s), (t64, ColumnType.tensor(np.float64, (3,)))):
        with pytest.raises(DataTypeError, match="column 'c': cannot combine"):
            unify(a, b_, "c")


# -- check_fits: a value must fit its column's type, the same on every path -------------------


@pytest.mark.parametrize(
    "values, dtype, bad",
    [
        (np.array([[0, 255]]), np.uint8, None),
        (np.array([[0, 256]]), np.uint8, "256"),
        (np.array([[1.0, -1.0]]), np.uint8, "-1.0"),
        (np.array([[75.0, 1.0]]), np.uint8, None),  # an integer, whatever its JSON spelling
        (np.array([[1.0, np.nan]]), np.int32, "nan"),  # NaN is no integer
        (np.array([[np.inf, 1.0]]), np.int64, "inf"),
        (np.array([[2.0**63]]), np.int64, "9.223372036854776e+18"),  # int64's max rounds up to 2**63 as a float
        (np.array([[-(2.0**63)]]), np.int64, None),
        (np.array([[2**63]], dtype=np.uint64), np.int64, "9223372036854775808"),
        (np.array([[True, False]]), np.float32, "True"),  # a boolean is no number
        (np.array([[1, 0]]), np.bool_, "1"),  # nor a number a boolean
        (np.array([[3.4e38, np.inf, np.nan]]), np.float32, None),  # infinities and NaN are values
        (np.array([[1.0, -3.5e38]]), np.float32, "-3.5e+38"),
        (np.array([[65504, 65520]]), np.float16, "65520"),
        (np.array([[2**62]]), np.float32, None),  # never an overflow: an int64 is below float32's max
    ],
)
def test_check_fits_names_the_first_value_a_dtype_cannot_hold(values, dtype, bad):
    t = ColumnType.tensor(dtype, values.shape[1:])
    if bad is None:
        check_fits(values, t, "c")
        return
    with pytest.raises(DataTypeError) as e:
        check_fits(values, t, "c", 7)
    assert str(e.value).startswith(f"column 'c': row 7: {bad} does not fit in {t} (")


def test_check_fits_names_the_row_of_the_first_misfit_in_row_order():
    values = np.array([[1, 2], [3, 300], [-5, 4]])
    with pytest.raises(DataTypeError, match=r"^column 'img': row 11: 300 does not fit in tensor\[uint8, \(2,\)\]"):
        check_fits(values, ColumnType.tensor(np.uint8, (2,)), "img", np.array([4, 11, 12]))


def test_a_declared_tensor_column_refuses_what_does_not_fit_whatever_built_it():
    t = ColumnType.tensor(np.uint8, (2,))
    says = r"column 'img': row 1: 300\.7 does not fit in tensor\[uint8, \(2,\)\] \(integers 0\.\.255\)"
    with pytest.raises(DataTypeError, match=says):  # rows of lists
        build_column([[1, 2], [300.7, 1]], "img", t)
    with pytest.raises(DataTypeError, match=says):  # rows of arrays, the missing one skipped
        build_column([np.array([1.0, 2.0]), np.array([300.7, 1.0]), None], "img", t)
    with pytest.raises(DataTypeError, match=says):  # one (n, 2) array
        build_column(np.array([[1.0, 2.0], [300.7, 1.0]]), "img", t)
    with pytest.raises(DataTypeError, match=r"row 2: True does not fit"):  # booleans beside numbers, row by row
        build_column([np.array([1, 2]), None, np.array([True, False])], "img", t)
    ctype, arr, _ = build_column([[1.0, 255.0]], "img", t)
    assert arr.dtype == np.uint8 and arr.tolist() == [[1, 255]]


def test_rows_into_a_narrower_float_are_checked_after_the_cast():
    """float64 rows into a float32 column are cast first and only then looked at: an
    infinity the cast made is refused naming its row (past a missing one), an infinity
    or NaN that was given is a value, and nothing warns."""
    t = ColumnType.tensor(np.float32, (2,))
    with pytest.raises(DataTypeError, match=r"^column 'v': row 2: 1e\+39 does not fit in tensor\[float32, \(2,\)\]"):
        build_column([np.array([1.0, 2.0]), None, np.array([3.0, 1e39])], "v", t)
    with pytest.raises(DataTypeError, match=r"^column 'h': row 1: 70000 does not fit in tensor\[float16"):
        build_column([np.array([1, 2]), np.array([70000, 1])], "h", ColumnType.tensor(np.float16, (2,)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, arr, valid = build_column([np.array([np.inf, np.nan]), None, np.array([-np.inf, 3.5])], "v", t)
    assert arr.dtype == np.float32 and valid.tolist() == [True, False, True]
    assert str(arr.tolist()) == "[[inf, nan], [0.0, 0.0], [-inf, 3.5]]"


def _frozen(a: np.ndarray) -> np.ndarray:
    """``a``'s values in a read-only array over bytes, as a KVS cache hit holds them."""
    return np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)


@pytest.mark.parametrize(
    "value",
    [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.arange(4, dtype=np.int8),
        np.array([True, False]),
        np.arange(3, dtype=np.float16),
        np.arange(3, dtype=">f4"),  # not native: converted, not shared
        np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2],  # not contiguous: copied
    ],
    ids=["f32", "i8", "bool", "f16", "big-endian", "strided"],
)
@pytest.mark.parametrize("frozen", [True, False], ids=["frozen", "writable"])
def test_one_array_row_builds_the_column_several_rows_do_and_shares_only_a_frozen_one(value, frozen):
    a = _frozen(value) if frozen and value.flags.c_contiguous else value
    ctype, arr, valid = build_column([a], "v")
    many_type, many, _ = build_column([a, a], "v")  # the general path: rows stacked
    assert ctype == many_type and valid is None and arr.dtype == many.dtype and arr.shape == many[:1].shape
    assert arr.tolist() == many[:1].tolist()
    shared = np.shares_memory(arr, a)
    assert shared == (frozen and a.dtype.isnative and a.flags.c_contiguous), (shared, a.flags)


def test_random_one_array_rows_build_the_column_of_the_general_path():
    """One array row that is not frozen (a row-wise map's output) is copied as its one row:
    the general path's type, dtype, values and C order, never a writable array's memory, for
    arrays of every dtype, shape, order and stride; what the short way does not take (a
    0-d array, complex, strings, a foreign byte order) the general path takes or names.
    The general path is given the same value in a tuple (the short way takes a list)."""
    rng = np.random.default_rng(20261128)
    dtypes = [np.float32, np.float64, np.float16, np.int8, np.int64, np.uint8, np.uint64, np.bool_, ">f4", "<i2",
              np.complex64, "U3", object]  # fmt: skip
    taken = 0
    for _ in range(400):
        shape = tuple(int(d) for d in rng.integers(0, 4, rng.integers(0, 4)))
        dtype = np.dtype(dtypes[rng.integers(len(dtypes))])
        a = np.asarray(rng.standard_normal(shape) * 50).astype(dtype) if dtype.kind != "O" else np.full(shape, None)
        if a.ndim >= 2 and rng.random() < 0.3:
            a = a.T if rng.random() < 0.5 else a[:, ::2]
        if rng.random() < 0.2:
            a.flags.writeable = False  # read-only: shared where it is frozen (the test above), copied otherwise
        try:
            want = build_column((a,), "v")
        except DataTypeError as e:
            with pytest.raises(DataTypeError) as got:
                build_column([a], "v")
            assert str(got.value) == str(e)
            continue
        ctype, arr, valid = build_column([a], "v")
        assert (ctype, valid) == (want[0], want[2]) and arr.dtype == want[1].dtype and arr.shape == want[1].shape
        assert arr.flags.c_contiguous and np.array_equal(arr, want[1])
        if a.flags.writeable:
            assert not np.shares_memory(arr, a)  # a writable array's row is a copy
        taken += 1
    assert taken > 150, taken
