"""The short way for a big JSON row of tensors (executors/codec/jsontensors.py) against the
general path (httpcodec.parse_body + input_table): every body it takes it reads into the
same tensors, and every body it leaves (None) is the general path's to read or refuse; over
real HTTP the answers and the errors are the general path's."""

from __future__ import annotations

import httpx
import numpy as np
import orjson
import pytest

from executors.codec import jsontensors
from executors.codec.bodies import input_table, parse_body
from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import ColumnType, Flow
from flow.errors import DataError

U8 = {"img": ColumnType.tensor(np.uint8, (2, 3))}
F32 = {"v": ColumnType.tensor(np.float32, (4,))}
I64 = {"a": ColumnType.tensor(np.int64, (2, 2))}
TWO = {"img": ColumnType.tensor(np.uint8, (2, 3)), "v": ColumnType.tensor(np.float32, (4,))}
TAB = {"k": ColumnType("int"), "x": ColumnType("float"), "v": ColumnType.tensor(np.float32, (2,))}
F16 = {"h": ColumnType.tensor(np.float16, (2,))}


def general(body: bytes, schema):
    """The general path's tensors, or the DataError it raises."""
    try:
        rows = parse_body(body, "application/json", schema)
        table = input_table("f", rows, np.arange(len(rows)), schema)
    except DataError as e:
        return e
    return {c: table[c] for c in schema}


def short(body: bytes, schema):
    """The short way's tensors, or None."""
    got = jsontensors.read_rows(body, schema)
    return None if got is None else {c: col.values for c, col in got[1].items()}


# (schema, body, whether the short way must take it)
CASES = [
    (U8, b'{"img": [[1,2,3],[4,5,255]]}', True),
    (U8, b'{ "img" :\n [[0, 2 ,3],\r\n\t[4,5,6]] }', True),
    (F32, b'{"v": [1.5, -2, 3e2, 0.30000000000000004]}', True),
    (F32, b'{"v": [1, 2, 3, 16777217]}', True),
    (F32, b'{"v": [1E-3, -0.0, 1e-400, 9007199254740991]}', True),
    (I64, b'{"a": [[-9007199254740993, 2], [3, 9223372036854775807]]}', True),
    (TWO, b'{"v": [1,2,3,4], "img": [[1,2,3],[4,5,6]]}', True),
    (U8, b'{"img": [[1,2,3],[4,5,256]]}', False),  # out of range for uint8
    (U8, b'{"img": [[1,2,3],[4,5,-1]]}', False),
    (U8, b'{"img": [[1,2,3],[4,5,6.0]]}', False),  # a float never becomes an integer
    (U8, b'{"img": [[1,2,3],[4,5,1e2]]}', False),
    (U8, b'{"img": [[1,2,3],[4,5]]}', False),  # ragged
    (U8, b'{"img": [[1,2,3],[4,5,6],[7,8,9]]}', False),  # another shape
    (U8, b'{"img": [1,2,3,4,5,6]}', False),
    (U8, b'{"img": [[1,2,3],[4,5,null]]}', False),
    (U8, b'{"img": [[1,2,3],[4,5,true]]}', False),
    (U8, b'{"img": null}', False),
    (F32, b'{"v": [NaN, 1, 2, 3]}', False),
    (F32, b'{"v": [Infinity, 1, 2, 3]}', False),
    (F32, b'{"v": [1e400, 1, 2, 3]}', False),
    (F32, b'{"v": [18446744073709551616, 1, 2, 3]}', False),  # over 64 bits
    (F32, b'{"v": [9007199254740993, 1, 2, 3]}', False),  # an integer no double holds
    (F32, b'{"v": [.5, 1, 2, 3]}', False),
    (F32, b'{"v": [+1, 1, 2, 3]}', False),
    (F32, b'{"v": [01, 1, 2, 3]}', False),
    (F32, b'{"v": [1, 2, 3, 4],}', False),
    (F32, b'{"v": [1, 2, 3, 4]} x', False),
    (F32, b'{"v": [1, 2, 3, 4]}\n{"v": [1, 2, 3, 4]}', False),
    (F32, b'[{"v": [1, 2, 3, 4]}]', True),  # a list of one row
    (F32, b'{"v": [1, 2, 3, 4], "v": [5, 6, 7, 8]}', False),
    (F32, b'{"v": [1, 2, 3, 4], "w": [5, 6, 7, 8]}', False),
    (F32, b'{"w": [1, 2, 3, 4]}', False),
    (F32, b'{"\\u0076": [1, 2, 3, 4]}', False),
    (F32, b'{"v": "1, 2, 3, 4"}', False),
    (F32, b'\xef\xbb\xbf{"v": [1, 2, 3, 4]}', False),
    (F32, b'{"v": [1, 2, 3, 4]', False),
    (TWO, b'{"img": [[1,2,3],[4,5,6]]}', False),
    (I64, b'{"a": [[9223372036854775808, 2], [3, 4]]}', False),
    (F32, b'[{"v": [1, 2, 3, 4]}, {"v": [5, 6, 7, 8.5]}]', True),  # rows: a list of objects
    (F32, b' [ {"v": [1, 2, 3, 4]} ,\n{"v": [5, 6, 7, 8]} ] ', True),
    (TWO, b'[{"v": [1,2,3,4], "img": [[1,2,3],[4,5,6]]}, {"img": [[1,2,3],[4,5,7]], "v": [1,2,3,4]}]', True),
    (F32, b'[{"v": [1, 2, 3, 4]}, {"v": [5, 6, 7]}]', False),
    (F32, b'[{"v": [1, 2, 3, 4]}, {"w": [5, 6, 7, 8]}]', False),
    (F32, b'[{"v": [1, 2, 3, 4]}, {"v": [5, 6, 7, 8], "v": [1, 1, 1, 1]}]', False),
    (F32, b'[{"v": [1, 2, 3, 4]}, {}]', False),
    (F32, b'[{"v": [1, 2, 3, 4]}, 5]', False),
    (F32, b'[{"v": [1, 2, 3, 4]},]', False),
    (F32, b'[{"v": [1, 2, 3, 4]}]]', False),
    (F32, b'[{"v": [1, 2, 3, 4]} {"v": [1, 2, 3, 4]}]', False),
    (F32, b"[]", False),
    (TAB, b'[{"k": 1, "x": 2, "v": [1, 2]}, {"x": -1.5e-3, "k": -9223372036854775808, "v": [0, 0.5]}]', True),
    (TAB, b'{"k": 7, "x": -0.0, "v": [1, 2]}', True),
    (TAB, b'[{"k": 2.0, "x": 2, "v": [1, 2]}]', False),  # a float never becomes an int
    (TAB, b'[{"k": 1e2, "x": 2, "v": [1, 2]}]', False),
    (TAB, b'[{"k": 9223372036854775808, "x": 2, "v": [1, 2]}]', False),
    (TAB, b'[{"k": 1, "x": null, "v": [1, 2]}]', False),  # missing: the general path's business
    (TAB, b'[{"k": 1, "x": -0, "v": [1, 2]}]', False),
    (TAB, b'[{"k": true, "x": 1, "v": [1, 2]}]', False),
    (TAB, b'[{"k": 1, "x": [1], "v": [1, 2]}]', False),
    (TAB, b'[{"k": 1, "x": 1, "v": 3}]', False),
    (F32, b'{"v": [-0, 1, 2, 3]}', False),  # the integer -0: 0.0 the general way, -0.0 Arrow's
    (F32, b'{"v": [-0.0, -0.5, -0e1, 3]}', True),
    (F32, b'{"v": [1e39, 1, 2, 3]}', False),  # an infinity as float32: the general path refuses it
    (F32, b'{"v": [3.4028235e38, 1, 2, 3]}', False),  # (no integer a double holds exactly)
    (F16, b'{"h": [70000, 1]}', False),  # an infinity as float16
    (F16, b'{"h": [-65520.0, 1]}', False),
    (F16, b'{"h": [65504, -1.5]}', True),  # the largest float16
    (F16, b'{"h": [65519, 0.1]}', True),  # rounds to it
]


@pytest.mark.parametrize("schema, body, short", CASES, ids=[c[1][:40].decode("latin-1") for c in CASES])
def test_the_short_way_reads_what_it_takes_as_the_general_path_and_leaves_the_rest(schema, body, short):
    assert jsontensors.eligible(schema)
    got = jsontensors.read_rows(body, schema)
    assert (got is not None) == short
    assert (jsontensors.read_rows(bytearray(body), schema) is not None) == short  # a body read in pieces
    want = general(body, schema)
    if got is None:
        return
    assert not isinstance(want, Exception), want
    n, cols = got
    assert n == len(want[next(iter(schema))])
    for c, t in schema.items():
        assert cols[c].type == t
        assert cols[c].values.dtype == want[c].dtype and cols[c].values.shape == want[c].shape
        assert np.array_equal(cols[c].values, want[c])
        assert np.array_equal(np.signbit(cols[c].values), np.signbit(want[c]))


def test_random_bodies_valid_or_nearly_are_read_the_same_or_left_to_the_general_path():
    """Bodies built from JSON numbers (and a few things that are not), in shapes that are
    sometimes ragged, for eight dtypes: whatever the short way takes, the general path
    reads into the same tensor, to the sign of a zero."""
    import random
    import warnings

    rnd = random.Random(11)
    numbers = (
        "0 -0 1 -1 7 255 256 -129 127 128 65535 65536 1.5 -2.25 1e2 1E-3 2.0 9007199254740991 9007199254740992 "
        "9007199254740993 -9007199254740993 123456789012345678 1e308 1e-320 0.30000000000000004 3.5e38 -0.0 "
        '00 +1 .5 1. NaN true null "1"'
    ).split()

    def array(shape):
        if not shape:
            return rnd.choice(numbers)
        n = shape[0] + (rnd.choice([-1, 1]) if rnd.random() < 0.03 else 0)
        return "[" + ",".join(array(shape[1:]) for _ in range(max(n, 0))) + "]"

    taken = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (a float16 overflow: refused, left by the short way)
        for _ in range(1500):
            dtype = rnd.choice([np.uint8, np.int8, np.int16, np.int64, np.uint64, np.float32, np.float64, np.float16])
            shape = tuple(rnd.randint(1, 3) for _ in range(rnd.randint(0, 3)))
            schema = {"x": ColumnType.tensor(dtype, shape) if shape else ColumnType(rnd.choice(["int", "float"]))}
            rows = ['{"x": ' + array(shape) + "}" for _ in range(rnd.choice([1, 1, 2, 3]))]
            body = (rows[0] if len(rows) == 1 and rnd.random() < 0.5 else "[" + ", ".join(rows) + "]").encode()
            got = short(body, schema)
            if got is None:
                continue
            taken += 1
            want = general(body, schema)
            assert not isinstance(want, Exception), (body, want)
            g, w = got["x"], want["x"]
            assert g.dtype == w.dtype and g.shape == w.shape, body
            assert np.array_equal(g, w) and np.array_equal(np.signbit(g), np.signbit(w)), body
    assert taken > 100  # the short way took a good share of them


def test_random_tensors_read_the_same_both_ways():
    rng = np.random.default_rng(7)
    for dtype, shape in ((np.uint8, (5, 7, 3)), (np.float32, (64,)), (np.int16, (3, 9)), (np.float64, (2, 2, 2))):
        schema = {"x": ColumnType.tensor(dtype, shape)}
        for _ in range(5):
            if np.dtype(dtype).kind == "f":
                x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8)).astype(dtype)
            else:
                info = np.iinfo(dtype)
                x = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
            body = orjson.dumps({"x": x}, option=orjson.OPT_SERIALIZE_NUMPY)
            got = short(body, schema)
            assert got is not None
            assert np.array_equal(got["x"], general(body, schema)["x"])


def test_what_the_short_way_never_takes():
    assert not jsontensors.eligible({"x": ColumnType.tensor(np.bool_, (2,))})
    assert not jsontensors.eligible({"x": ColumnType("str")}) and not jsontensors.eligible({"x": ColumnType("bool")})
    assert not jsontensors.eligible({"x": ColumnType.tensor(np.uint8, (0, 3))})
    assert not jsontensors.eligible({})


SCHEMA = {"img": ColumnType.tensor(np.uint8, (224, 224, 3))}


def _brightness(table):
    return table["img"].reshape(len(table["img"]), -1).mean(axis=1)


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(ClusterConfig(executors=1)) as c:
        yield c


@pytest.fixture(scope="module")
def images(cluster):
    f = Flow("bright", schema=SCHEMA)
    f.map(_brightness, names=["y"], batching=True)
    return f, cluster.deploy(f)


def test_json_images_over_http_are_answered_as_flow_run_and_a_bad_one_gets_the_same_400(images):
    """A 224x224x3 image as nested lists (640 KB), and a list of three, go the short way;
    one with a value out of range goes the general way and gets its 400."""
    f, d = images
    img = np.random.default_rng(1).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    body = orjson.dumps({"img": img}, option=orjson.OPT_SERIALIZE_NUMPY)
    assert len(body) > 256 * 1024 and short(body, SCHEMA) is not None
    r = httpx.post(d.url, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["rows"][0]["y"] == pytest.approx(f.run([{"img": img}])["y"][0])
    batch = np.random.default_rng(2).integers(0, 256, (3, 224, 224, 3), dtype=np.uint8)
    rows = orjson.dumps([{"img": x} for x in batch], option=orjson.OPT_SERIALIZE_NUMPY)
    assert short(rows, SCHEMA) is not None
    r = httpx.post(d.url, content=rows, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text[:300]
    got = [row["y"] for row in r.json()["rows"]]
    assert got == pytest.approx(list(f.run([{"img": x} for x in batch])["y"]))
    bad = body.rsplit(b",", 1)[0] + b",300]]]}"  # the last value out of range
    r = httpx.post(d.url, content=bad, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"] == "DataTypeError" and "'img'" in r.json()["message"] and "uint8" in r.json()["message"]


def _score(table):
    return table["k"] * 0.5 + table["x"]


def test_a_batch_of_tabular_rows_over_http_is_answered_as_flow_run(cluster):
    """3,000 rows of numbers (over 64 KB: the short way), answered as flow.run."""
    f = Flow("scores", schema={"k": ColumnType("int"), "x": ColumnType("float")})
    f.map(_score, names=["s"], batching=True)
    rng = np.random.default_rng(4)
    rows = [{"k": int(k), "x": float(x)} for k, x in zip(rng.integers(-1000, 1000, 3000), rng.standard_normal(3000))]
    body = orjson.dumps(rows)
    assert len(body) > jsontensors.MIN_BYTES and short(body, dict(f.schema)) is not None
    r = httpx.post(cluster.deploy(f).url, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text[:300]
    assert [row["s"] for row in r.json()["rows"]] == pytest.approx(list(f.run(rows)["s"]))


@pytest.mark.parametrize(
    "schema, body, says",
    [
        (F32, b'{"v": [1, 2, 3, -1e39]}', "column 'v': row 0: -1e+39 does not fit in tensor[float32"),
        (F16, b'[{"h": [1, 2]}, {"h": [1, 70000]}]', "column 'h': row 1: 70000 does not fit in tensor[float16"),
    ],
)
def test_a_number_a_narrow_float_cannot_hold_is_left_to_the_general_path_which_refuses_it(schema, body, says):
    assert jsontensors.read_rows(body, schema) is None
    refused = general(body, schema)
    assert isinstance(refused, DataError) and str(refused).startswith(says), refused


def _half_sum(table):
    return table["h"].astype(np.float64).reshape(len(table["h"]), -1).sum(axis=1)


def test_a_big_body_with_a_number_float16_cannot_hold_gets_a_400_naming_it(cluster):
    """A 100 KB body of float16 tensors goes the short way; one value over float16's range
    (an infinity if cast) sends it to the general path, which answers 400 naming it."""
    f = Flow("halves", schema={"h": ColumnType.tensor(np.float16, (128, 128))})
    f.map(_half_sum, names=["s"], batching=True)
    d = cluster.deploy(f)
    values = np.random.default_rng(3).integers(-1000, 1000, (128, 128))
    body = orjson.dumps({"h": values}, option=orjson.OPT_SERIALIZE_NUMPY)
    assert len(body) > jsontensors.MIN_BYTES and short(body, dict(f.schema)) is not None
    r = httpx.post(d.url, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200 and r.json()["rows"][0]["s"] == float(values.sum()), r.text[:300]
    values[127, 127] = 70000
    bad = orjson.dumps({"h": values}, option=orjson.OPT_SERIALIZE_NUMPY)
    assert short(bad, dict(f.schema)) is None
    r = httpx.post(d.url, content=bad, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text[:300]
    assert r.json() == {
        "error": "DataTypeError",
        "message": "column 'h': row 0: 70000 does not fit in tensor[float16, (128, 128)] (numbers within ±65504)",
    }
