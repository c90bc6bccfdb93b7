"""A corpus of bad inputs over real HTTP: bodies, content types, Arrow streams, flow names,
timeouts and operator outputs. Each is answered promptly (well before the deadline) with
the right status and a JSON error naming the column, operator or limit; a good request
succeeds right after each."""

from __future__ import annotations

import base64
import io
import time

import httpx
import numpy as np
import pyarrow as pa
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import ColumnType, Flow

GOOD = {"x": 1, "f": 0.5, "s": "a", "b": base64.b64encode(b"hi").decode(), "img": [[1, 2], [3, 4]]}


def _arrow(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def _offsets_past_the_data() -> bytes:
    """A string column whose last offset points 1 GiB past its 6 bytes of data (reading
    its values crashed the gateway)."""
    import struct

    body = bytearray(_arrow(pa.table({"s": ["ab", "cd", "ef"]})))
    at = body.find(struct.pack("<4i", 0, 2, 4, 6))
    body[at : at + 16] = struct.pack("<4i", 0, 2, 4, 1 << 30)
    return bytes(body)


def _zstd_zeros(rows: int, width: int) -> bytes:
    """Rows of ``width`` zero bytes as a ZSTD-compressed Arrow stream of a few KB."""
    sink = io.BytesIO()
    table = pa.table({"z": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(rows * width, np.int8)), width)})
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    return sink.getvalue()


def plus_one(row):
    return row.x + 1


def surrogate(row):
    return "\ud800"


def nan_tensor(row):
    import numpy as np

    return np.array([np.nan, 1.0])


def exits(row):
    raise SystemExit("bye")


def raises(row):
    raise ValueError("the model broke")


def two_of_three(row):
    return 1, 2, 3


def total(row):
    return float(row.v.sum()) + float(row.h.sum())


FLOATS = {"v": ColumnType.tensor(np.float32, (2,)), "h": ColumnType.tensor(np.float16, (2,))}


@pytest.fixture(scope="module")
def c():
    with LocalCluster(ClusterConfig(executors=1, request_timeout_s=20, max_body_bytes=1 << 20)) as cluster:
        typed = Flow(
            "typed", schema={"x": int, "f": float, "s": str, "b": bytes, "img": ColumnType.tensor(np.uint8, (2, 2))}
        )
        typed.map(plus_one, names=["y"])
        cluster.deploy(typed)
        free = Flow("free")
        free.map(plus_one, names=["y"])
        cluster.deploy(free)
        floats = Flow("floats", schema=FLOATS)  # one stage: a JSON object for it is relayed
        floats.map(total, names=["y"])
        cluster.deploy(floats)
        looks = Flow("looks", schema={"k": str}, key_prefixes=["emb/"])
        looks.lookup(column="k", name="v", missing="null")
        cluster.deploy(looks)
        cluster.kvs.put("emb/1", 7)
        for fn, names in (
            (surrogate, ["s"]),
            (nan_tensor, ["t"]),
            (exits, ["y"]),
            (raises, ["y"]),
            (two_of_three, ["a", "b"]),
        ):
            f = Flow(fn.__name__.replace("_", "-"))
            f.map(fn, names=names)
            cluster.deploy(f)
        yield cluster


def J(doc):
    import json

    return {"content": json.dumps(doc).encode(), "headers": {"content-type": "application/json"}}


def RAW(body: bytes, ctype="application/json", **headers):
    return {"content": body, "headers": {"content-type": ctype, **headers}}


def bad(**changes):
    return J(dict(GOOD, **changes))


CASES = [
    # -- JSON bodies ---------------------------------------------------------------------------
    ("not json", "typed", RAW(b"{nope"), 400, "not valid JSON"),
    ("truncated", "typed", RAW(b'[{"x": 1'), 400, "not valid JSON"),
    ("empty body", "typed", RAW(b""), 400, "JSON object"),
    ("null body", "typed", RAW(b"null"), 400, "JSON object"),
    ("a number", "typed", RAW(b"42"), 400, "JSON object"),
    ("a string", "typed", RAW(b'"x"'), 400, "JSON object"),
    ("list of numbers", "typed", RAW(b"[1, 2]"), 400, "row 0"),
    ("list of lists", "typed", RAW(b"[[1]]"), 400, "row 0"),
    ("NaN", "typed", RAW(b'{"x": 1, "f": NaN}'), 400, "column 'f'"),
    ("Infinity", "typed", RAW(b'{"x": 1, "f": Infinity}'), 400, "column 'f'"),
    ("-Infinity", "typed", RAW(b'{"x": 1, "f": -Infinity}'), 400, "column 'f'"),
    ("overflowing float", "typed", RAW(b'{"x": 1, "f": 1e999}'), 400, "column 'f'"),
    ("NaN in a tensor", "typed", RAW(b'{"img": [[1, NaN], [3, 4]]}'), 400, "column 'img'"),
    ("NaN, no schema", "free", RAW(b'[{"x": NaN}]'), 400, "column 'x'"),
    ("lone surrogate", "typed", RAW(b'{"s": "\\ud800"}'), 400, "column 's'"),
    ("lone surrogate key", "free", RAW(b'{"\\udc00": 1}'), 400, "Unicode"),
    ("deep nesting", "typed", RAW(b"[" * 100_000 + b"]" * 100_000), 400, "nested deeper"),
    ("deep objects", "typed", RAW(b'{"a":' * 5000 + b"1" + b"}" * 5000), 400, "nested deeper"),
    ("qid given", "typed", J(dict(GOOD, qid=3)), 400, "'qid'"),
    ("reserved column", "free", J({"x": 1, "#pos": 2}), 400, "'#pos'"),
    # -- schema ------------------------------------------------------------------------------
    ("missing column", "typed", J({k: v for k, v in GOOD.items() if k != "x"}), 400, "'x'"),
    ("unknown column", "typed", bad(z=1), 400, "'z'"),
    ("str for int", "typed", bad(x="1"), 400, "'x'"),
    ("float for int", "typed", bad(x=1.5), 400, "'x'"),
    ("bool for int", "typed", bad(x=True), 400, "'x'"),
    (
        "int beyond int64",
        "typed",
        RAW(b'{"x": 123456789012345678901234567890, "f": 0.5, "s": "a", "b": "aGk=", "img": [[1, 2], [3, 4]]}'),
        400,
        "'x'",
    ),
    ("str for float", "typed", bad(f="0.5"), 400, "'f'"),
    ("int for str", "typed", bad(s=1), 400, "'s'"),
    ("bytes not base64", "typed", bad(b="***"), 400, "'b'"),
    ("bytes as a number", "typed", bad(b=3), 400, "'b'"),
    ("tensor wrong shape", "typed", bad(img=[[1, 2, 3]]), 400, "'img'"),
    ("tensor ragged", "typed", bad(img=[[1, 2], [3]]), 400, "'img'"),
    ("tensor of strings", "typed", bad(img=[["a", "b"], ["c", "d"]]), 400, "'img'"),
    ("tensor as a number", "typed", bad(img=5), 400, "'img'"),
    ("mixed row types", "free", J([{"x": 1}, {"x": "a"}]), 400, "'x'"),
    ("rows nested in a list", "typed", J([[GOOD]]), 400, "row 0"),
    ("None inside a tensor", "typed", bad(img=[[1, None], [3, 4]]), 400, "'img'"),
    ("tensor value over uint8", "typed", bad(img=[[1, 300], [3, 4]]), 400, "'img'"),
    ("tensor value under uint8", "typed", bad(img=[[1, -1], [3, 4]]), 400, "'img'"),
    ("tensor of booleans for uint8", "typed", bad(img=[[True, False], [True, True]]), 400, "'img'"),
    ("bool for float", "typed", bad(f=True), 400, "'f'"),
    ("list for str", "typed", bad(s=["a"]), 400, "'s'"),
    ("object for int", "typed", bad(x={}), 400, "'x'"),
    ("list for int", "typed", bad(x=[1]), 400, "'x'"),
    # -- content types and size ----------------------------------------------------------------
    ("text/plain", "typed", RAW(b"{}", "text/plain"), 400, "Content-Type"),
    ("xml", "typed", RAW(b"<x/>", "application/xml"), 400, "Content-Type"),
    ("multipart", "typed", RAW(b"--b\r\n", "multipart/form-data; boundary=b"), 400, "Content-Type"),
    ("form encoded", "typed", RAW(b"x=1", "application/x-www-form-urlencoded"), 400, "Content-Type"),
    ("octet stream", "typed", RAW(b"\x00\x01", "application/octet-stream"), 400, "Content-Type"),
    ("body over the limit", "typed", RAW(b"[" + b'{"x": 1},' * 200_000 + b"{}]"), 413, "limit"),
    # -- Arrow ---------------------------------------------------------------------------------
    ("arrow garbage", "typed", RAW(b"\x00garbage", "application/vnd.apache.arrow.stream"), 400, "Arrow"),
    (
        "arrow truncated",
        "free",
        RAW(_arrow(pa.table({"x": [1, 2]}))[:40], "application/vnd.apache.arrow.stream"),
        400,
        "Arrow",
    ),
    (
        "arrow qid column",
        "free",
        RAW(_arrow(pa.table({"x": [1], "qid": [3]})), "application/vnd.apache.arrow.stream"),
        400,
        "'qid'",
    ),
    (
        "arrow reserved column",
        "free",
        RAW(_arrow(pa.table({"x": [1], "#pos": [3]})), "application/vnd.apache.arrow.stream"),
        400,
        "'#pos'",
    ),
    (
        "arrow wrong type",
        "typed",
        RAW(
            _arrow(pa.table({"x": ["a"], "f": [0.5], "s": ["a"], "b": [b"h"], "img": [[1, 2, 3, 4]]})),
            "application/vnd.apache.arrow.stream",
        ),
        400,
        "'x'",
    ),
    ("arrow empty body", "free", RAW(b"", "application/vnd.apache.arrow.stream"), 400, "Arrow"),
    (
        "arrow tensor of the wrong shape",
        "typed",
        RAW(
            _arrow(pa.table({"x": [1], "f": [0.5], "s": ["a"], "b": [b"h"], "img": [[1, 2, 3, 4]], "z": [1]})),
            "application/vnd.apache.arrow.stream",
        ),
        400,
        "'img'",
    ),
    (
        "arrow missing column",
        "typed",
        RAW(_arrow(pa.table({"x": [1]})), "application/vnd.apache.arrow.stream"),
        400,
        "'f'",
    ),
    (
        "arrow offsets past the data",
        "free",
        RAW(_offsets_past_the_data(), "application/vnd.apache.arrow.stream"),
        400,
        "not a valid Arrow IPC stream: column 's'",
    ),
    (
        "arrow invalid UTF-8",
        "free",
        RAW(
            _arrow(pa.table({"s": ["ab\u00e9"]})).replace(b"ab\xc3\xa9", b"ab\xc3("),
            "application/vnd.apache.arrow.stream",
        ),
        400,
        "column 's'",
    ),
    (
        "arrow dictionary index past the dictionary",
        "free",
        RAW(
            _arrow(pa.table({"d": pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int8()), ["a", "b"])})).replace(
                b"\x00\x01\x00\x00\x00\x00\x00\x00", b"\x00\x7f\x00\x00\x00\x00\x00\x00"
            ),
            "application/vnd.apache.arrow.stream",
        ),
        400,
        "column 'd'",
    ),
    (
        "arrow union",
        "free",
        RAW(
            _arrow(
                pa.table({"u": pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array([1]), pa.array(["a"])])})
            ),
            "application/vnd.apache.arrow.stream",
        ),
        400,
        "column 'u': Arrow type sparse_union",
    ),
    (
        "arrow compressed bomb",
        "free",
        RAW(_zstd_zeros(600_000, 128), "application/vnd.apache.arrow.stream"),
        400,
        "uncompressed",
    ),
    (
        "arrow int64 tensor out of range for uint8",
        "typed",
        RAW(
            _arrow(pa.table({"x": [1], "f": [0.5], "s": ["a"], "b": [b"h"], "img": [[[1, 300], [3, 4]]]})),
            "application/vnd.apache.arrow.stream",
        ),
        400,
        "column 'img': row 0: 300 does not fit in tensor[uint8",
    ),
    # -- numbers a float32 or float16 tensor cannot hold (an infinity if cast) ------------------
    (
        "float32 overflow, relayed",
        "floats",
        RAW(b'{"v": [1e39, 1], "h": [1, 2]}'),
        400,
        "column 'v': row 0: 1e+39 does not fit in tensor[float32",
    ),
    (
        "float32 overflow in a list",
        "floats",
        RAW(b'[{"v": [1, -1e39], "h": [1, 2]}]'),
        400,
        "column 'v': row 0: -1e+39",
    ),
    (
        "float16 overflow, relayed",
        "floats",
        RAW(b'{"v": [1, 2], "h": [70000, 1]}'),
        400,
        "column 'h': row 0: 70000 does not fit in tensor[float16",
    ),
    (
        "arrow float64 overflowing float32",
        "floats",
        RAW(_arrow(pa.table({"v": [[1e39, 1.0]], "h": [[1.0, 2.0]]})), "application/vnd.apache.arrow.stream"),
        400,
        "column 'v': row 0: 1e+39 does not fit in tensor[float32",
    ),
    # -- flow names ----------------------------------------------------------------------------
    ("unknown flow", "no-such-flow", J({"x": 1}), 404, "no-such-flow"),
    ("long flow name", "n" * 5000, J({"x": 1}), 404, "UnknownFlow"),
    ("flow name with a slash", "typed/extra", J({"x": 1}), 404, "NotFound"),
    ("flow name with dots", "..%2F..%2Fetc", J({"x": 1}), 404, "NotFound"),
    ("flow name with spaces", "a%20b", J({"x": 1}), 404, "no deployed flow"),
    # -- timeouts ------------------------------------------------------------------------------
    ("timeout not a number", "typed", dict(J(GOOD), headers={"x-request-timeout": "soon"}), 400, "X-Request-Timeout"),
    ("timeout NaN", "typed", dict(J(GOOD), headers={"x-request-timeout": "nan"}), 400, "X-Request-Timeout"),
    ("timeout negative", "typed", dict(J(GOOD), headers={"x-request-timeout": "-1"}), 400, "X-Request-Timeout"),
    ("timeout zero", "typed", dict(J(GOOD), headers={"x-request-timeout": "0"}), 400, "X-Request-Timeout"),
    ("timeout infinite", "typed", dict(J(GOOD), headers={"x-request-timeout": "inf"}), 400, "X-Request-Timeout"),
    ("timeout overflowing", "typed", dict(J(GOOD), headers={"x-request-timeout": "1e999"}), 400, "X-Request-Timeout"),
    ("timeout empty", "typed", dict(J(GOOD), headers={"x-request-timeout": ""}), 400, "X-Request-Timeout"),
    ("timeout hex", "typed", dict(J(GOOD), headers={"x-request-timeout": "0x10"}), 400, "X-Request-Timeout"),
    ("flow name unicode", "%C3%A9t%C3%A9", J({"x": 1}), 404, "UnknownFlow"),
    # -- lookup keys: a flow reads its own namespace, never the runtime's keys ---------------
    ("lookup of a runtime key", "looks", J({"k": "flowserve:deployed"}), 422, "runtime's namespace"),
    ("lookup of a plan key", "looks", J({"k": "flowserve:plan:typed:1"}), 422, "runtime's namespace"),
    ("lookup outside the prefixes", "looks", J({"k": "other/1"}), 422, "outside this flow's key namespace"),
    ("lookup with a bytes-like key", "looks", J({"k": 5}), 400, "'k'"),
    # -- operator outputs ----------------------------------------------------------------------
    ("output lone surrogate", "surrogate", J({"x": 1}), 500, "operator 'surrogate'"),
    ("output NaN in a tensor", "nan-tensor", J({"x": 1}), 500, "NaN or infinity"),
    ("operator SystemExit", "exits", J({"x": 1}), 500, "SystemExit"),
    ("operator raises", "raises", J({"x": 1}), 500, "the model broke"),
    ("operator wrong arity", "two-of-three", J({"x": 1}), 500, "two_of_three"),
    # -- methods -------------------------------------------------------------------------------
    ("GET a flow path with a body", "typed", {"method": "PUT", **J(GOOD)}, 405, "MethodNotAllowed"),
]

GOOD_REQUEST = {
    "typed": J(GOOD),
    "floats": J({"v": [3.4028235e38, 1], "h": [65504, 1]}),
    "free": J({"x": 1}),
    "looks": J({"k": "emb/1"}),
    "surrogate": J({"x": 1}),
    "nan-tensor": J({"x": 1}),
    "exits": J({"x": 1}),
    "raises": J({"x": 1}),
    "two-of-three": J({"x": 1}),
}


def test_the_corpus_is_large():
    assert len(CASES) >= 80


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_bad_input_gets_a_prompt_named_error_and_the_next_request_succeeds(c, case):
    _, flow, request, status, needle = case
    request = dict(request)
    method = request.pop("method", "POST")
    t0 = time.monotonic()
    r = httpx.request(method, f"{c.url}/flows/{flow}", timeout=30, **request)
    elapsed = time.monotonic() - t0
    assert r.status_code == status, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) >= {"error", "message"}, body
    assert needle in body["message"] or needle == body["error"], body
    assert elapsed < 5, f"answered after {elapsed:.1f} s (the deadline is 20 s)"
    good_flow = flow if flow in ("typed", "free", "looks", "floats") else "free"
    ok = httpx.post(f"{c.url}/flows/{good_flow}", timeout=30, **GOOD_REQUEST[good_flow])
    assert ok.status_code == 200, ok.text


def test_unencodable_json_answers_are_fine_as_arrow(c):
    r = httpx.post(
        f"{c.url}/flows/nan-tensor", json={"x": 1}, headers={"Accept": "application/vnd.apache.arrow.stream"}
    )
    assert r.status_code == 200
    from flow.table import Table

    t = Table.from_arrow(pa.ipc.open_stream(r.content).read_all(), qid="qid")
    assert np.isnan(t["t"][0][0]) and t["t"][0][1] == 1.0


def test_a_float_overflow_is_the_same_400_relayed_and_parsed(c):
    """A one-row JSON body for the one-stage flow is parsed by its executor (relayed); the
    same body from a client that takes Arrow is parsed by the gateway: the same 400."""
    assert httpx.get(f"{c.url}/flows/floats").json()["relay_stage"] is not None
    for body in (b'{"v": [1e39, 1], "h": [1, 2]}', b'{"v": [1, 2], "h": [1, -65520.0]}'):
        relayed = httpx.post(f"{c.url}/flows/floats", content=body, headers={"content-type": "application/json"})
        parsed = httpx.post(
            f"{c.url}/flows/floats",
            content=body,
            headers={"content-type": "application/json", "accept": "application/vnd.apache.arrow.stream"},
        )
        assert relayed.status_code == parsed.status_code == 400 and relayed.content == parsed.content, relayed.text
        assert "does not fit in tensor[float" in relayed.json()["message"]
    ok = httpx.post(f"{c.url}/flows/floats", json={"v": [3.4028235e38, 0], "h": [65504, 0]})
    assert ok.status_code == 200 and ok.json()["rows"][0]["y"] == pytest.approx(3.4028235e38 + 65504), ok.text
