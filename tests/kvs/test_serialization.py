"""The codec: exact round trips of every supported type, refusals, zero-copy decode."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kvs import KVSRef, SerializationError, decode, dumps_trusted, encode, loads_trusted
from kvs.serialization import MAGIC, is_mutable_payload, is_trusted_payload


def roundtrip(value):
    return decode(encode(value))


def assert_same_array(a: np.ndarray, b: np.ndarray) -> None:
    assert type(b) is np.ndarray
    assert b.dtype == a.dtype and b.shape == a.shape
    if a.dtype.fields is None:
        np.testing.assert_array_equal(b, a)
    else:
        assert a.tobytes() == np.ascontiguousarray(b).tobytes()


# -- scalars, bytes, str, containers ---------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        2**70,
        3.5,
        -0.0,
        float("inf"),
        "",
        "héllo ✓",
        "a\0b",
        b"",
        b"\x00\xff" * 1000,
        [],
        {},
        [1, "a", None, 2.5, [True]],
        {"k": {"nested": [1, {"x": None}]}},
    ],
    ids=repr,
)
def test_roundtrip_plain_values(value):
    out = roundtrip(value)
    assert out == value and type(out) is type(value)


def test_nan_roundtrips():
    assert np.isnan(roundtrip(float("nan")))


def test_bytes_like_values_come_back_as_bytes():
    assert roundtrip(bytearray(b"xy")) == b"xy"
    assert roundtrip(memoryview(b"xyz")[1:]) == b"yz"


def test_kvsref_roundtrips():
    ref = KVSRef("emb/é/1")
    assert roundtrip(ref) == ref and type(roundtrip(ref)) is KVSRef


def test_every_value_carries_the_header():
    for value in (b"", "", None, np.zeros(0), KVSRef("k")):
        data = encode(value)
        assert data[0] == MAGIC


# -- numpy -----------------------------------------------------------------------------

DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "longdouble",
    "complex64",
    "complex128",
    "datetime64[ns]",
    "timedelta64[s]",
    "S5",
    "U3",
    "V4",
    ">i4",
    ">f8",
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 4), (2, 0, 5), (2, 3, 4, 5)], ids=str)
def test_array_roundtrip_dtypes_and_shapes(dtype, shape):
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
    arr = np.frombuffer(raw.tobytes(), dtype=dtype).reshape(shape).copy()
    if np.dtype(dtype).kind in "fc":  # avoid NaN != NaN in the comparison
        arr = np.where(np.isnan(arr), 0, arr).astype(dtype)
    assert_same_array(arr, roundtrip(arr))


def test_large_8mb_array_is_zero_copy_and_aligned():
    arr = np.random.default_rng(1).random((1024, 1024))  # 8 MiB of float64
    data = encode(arr)
    assert len(data) < arr.nbytes + 64  # header only
    out = decode(data)
    assert_same_array(arr, out)
    assert np.shares_memory(out, np.frombuffer(data, dtype=np.uint8))  # a view, no copy
    assert out.flags.aligned and out.flags.c_contiguous
    assert not out.flags.writeable
    with pytest.raises(ValueError):
        out.flags.writeable = True  # backed by immutable bytes: cannot be unlocked


def test_fortran_order_array_keeps_layout_without_copy():
    arr = np.asfortranarray(np.arange(24, dtype=np.float32).reshape(4, 6))
    out = roundtrip(arr)
    assert_same_array(arr, out)
    assert out.flags.f_contiguous


def test_non_contiguous_array_roundtrips():
    arr = np.arange(100).reshape(10, 10)[::3, 1::2]
    assert_same_array(arr, roundtrip(arr))


def test_structured_dtype_roundtrips():
    dt = np.dtype([("id", "<i8"), ("vec", "<f4", (3,)), ("name", "S4"), ("sub", [("a", "u1")])])
    arr = np.zeros(4, dtype=dt)
    arr["id"] = [1, 2, 3, 4]
    arr["vec"] = np.arange(12).reshape(4, 3)
    arr["name"] = [b"a", b"bb", b"ccc", b"dddd"]
    assert_same_array(arr, roundtrip(arr))


def test_numpy_scalars_roundtrip_as_scalars():
    for value in (np.float32(1.5), np.int16(-3), np.bool_(True), np.datetime64("2026-01-01")):
        out = roundtrip(value)
        assert type(out) is type(value) and out == value


@settings(max_examples=60, deadline=None, derandomize=True, database=None)  # same examples on every CI run
@given(
    hnp.arrays(
        dtype=st.one_of(
            hnp.integer_dtypes(),
            hnp.unsigned_integer_dtypes(),
            hnp.floating_dtypes(),
            hnp.complex_number_dtypes(),
            hnp.boolean_dtypes(),
            hnp.datetime64_dtypes(),
            hnp.byte_string_dtypes(),
            hnp.unicode_string_dtypes(),
        ),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_array_roundtrip_property(arr):
    out = roundtrip(arr)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert out.tobytes() == arr.tobytes()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(json_values)
def test_json_roundtrip_property(value):
    assert roundtrip(value) == value


# -- Arrow -----------------------------------------------------------------------------


def test_pyarrow_table_roundtrips():
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"a": [1, 2, None], "b": ["x", None, "z"]})
    out = roundtrip(table)
    assert isinstance(out, pa.Table) and out.equals(table)


# -- refusals --------------------------------------------------------------------------


class Custom:
    pass


@pytest.mark.parametrize(
    "value, name",
    [
        (object(), "object"),
        (Custom(), "Custom"),
        ((1, 2), "tuple"),
        ({1, 2}, "set"),
        (lambda x: x, "function"),
        (np.array([1, "a"], dtype=object), "object"),
        ([1, (2, 3)], "tuple"),
        ({"a": np.int64(1)}, "numpy.int64"),
        ({1: "int key"}, "int"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_refuses_unsupported_values_naming_the_type(value, name):
    with pytest.raises(SerializationError, match=name):
        encode(value)


def test_serialization_error_is_a_type_error():
    with pytest.raises(TypeError):
        encode(object())


def test_refuses_object_fields_in_structured_arrays():
    with pytest.raises(SerializationError, match="object"):
        encode(np.zeros(2, dtype=[("a", "O")]))


def test_decode_refuses_a_pickle_unless_trusted():
    blob = dumps_trusted({"fn": len})
    with pytest.raises(SerializationError, match="unpickle"):
        decode(blob)
    assert decode(blob, trusted=True) == {"fn": len}
    assert loads_trusted(blob) == {"fn": len}


def test_trusted_pickle_handles_closures():
    offset = 41
    fn = loads_trusted(dumps_trusted(lambda x: x + offset))
    assert fn(1) == 42


def test_loads_trusted_refuses_other_payloads():
    with pytest.raises(SerializationError):
        loads_trusted(encode(b"x"))
    with pytest.raises(SerializationError):  # a raw pickle has no FlowServe header
        loads_trusted(pickle.dumps(1))


def test_raw_pickle_bytes_are_never_unpickled():
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('pwned')",))

    with pytest.raises(SerializationError):
        decode(pickle.dumps(Boom()))


def test_forged_object_dtype_header_is_refused():
    # same header as a real int64 array, but the dtype text says "|O": decoding raw bytes
    # as PyObject pointers would crash the process
    data = bytearray(encode(np.zeros(2, dtype=np.int64)))
    pos = data.index(b"<i8")
    data[pos : pos + 3] = b"|O\0"
    data[4] = 2  # dtype text length
    with pytest.raises(SerializationError):
        decode(bytes(data))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xf5",
        b"plain text",
        b"\xf5Z",
        b"\xf5N\x00",
        b"\xf5J{bad json",
        encode(np.arange(10))[:-3],
        encode(np.arange(10)) + b"extra",
        b"\xf5A\x00\x01\x02",
    ],
    ids=repr,
)
def test_corrupt_or_foreign_data_is_refused(data):
    with pytest.raises(SerializationError):
        decode(data)


def test_payload_predicates():
    assert is_trusted_payload(dumps_trusted(1)) and not is_trusted_payload(encode(1))
    assert is_mutable_payload(encode([1])) and is_mutable_payload(encode({}))
    assert not is_mutable_payload(encode(1)) and not is_mutable_payload(encode("[x"))
