"""Big requests and deadlines: a body of several MB is answered with the rows flow.run gives
(parsed in pieces, off the event loop), and deadlines come from the flow, the cluster and
the request, within the cluster's maximum."""

from __future__ import annotations

import time

import httpx
import numpy as np
import orjson
import pytest

from executors.errors import BadRequestError
from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import ColumnType, Flow
from flow.configuration import ConfigError
from tests.executors.conftest import unique


def sleepy(row):
    time.sleep(0.8)
    return row.x


def scaled(table):  # batching=True: the whole request at once, so the test times the serving path
    return table["x"] * 2.0 + table["k"]


@pytest.fixture(scope="module")
def roomy():
    """A cluster of its own: bodies up to 32 MiB, a 0.5 s default deadline, 3 s at most."""
    config = ClusterConfig(
        executors=1, threads=4, request_timeout_s=0.5, max_request_timeout_s=3, max_body_bytes=32 << 20
    )
    c = LocalCluster(config).start()
    yield c
    c.stop()


def test_a_big_json_request_is_answered_with_the_rows_of_flow_run(roomy):
    f = Flow(unique("big"), schema={"x": float, "k": int})
    f.map(scaled, names=["y"], batching=True)
    d = roomy.deploy(f, timeout_s=3)
    rows = [{"x": i * 0.25, "k": i % 7} for i in range(250_000)]
    body = orjson.dumps(rows)
    assert len(body) > 5_000_000  # over the piecewise and off-the-loop thresholds
    r = httpx.post(d.url, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text[:300]
    assert r.headers.get("transfer-encoding") == "chunked"  # sent as it was written
    got = r.json()["rows"]
    expected = f.run(rows[:1000]).to_pylist()
    assert len(got) == len(rows)
    start = int(r.headers["x-qid-start"])
    assert [dict(g, qid=g["qid"] - start) for g in got[:1000]] == expected
    assert np.allclose([g["y"] for g in got[-5:]], [x["x"] * 2.0 + x["k"] for x in rows[-5:]])


def test_a_big_arrow_request_is_answered_in_arrow_with_the_rows_of_flow_run(roomy):
    import pyarrow as pa

    f = Flow(unique("bigarrow"), schema={"x": float, "k": int})
    f.map(scaled, names=["y"], batching=True)
    d = roomy.deploy(f, timeout_s=3)
    n = 300_000
    table = pa.table({"x": np.arange(n) * 0.5, "k": np.arange(n) % 5})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=70_000)
    arrow = "application/vnd.apache.arrow.stream"
    r = httpx.post(
        d.url, content=sink.getvalue().to_pybytes(), headers={"content-type": arrow, "accept": arrow}, timeout=60
    )
    assert r.status_code == 200 and r.headers["content-type"] == arrow, r.text[:300]
    got = pa.ipc.open_stream(r.content).read_all()
    assert got.num_rows == n and got.column_names == ["qid", "y"]
    assert np.allclose(got.column("y").to_numpy(), np.arange(n) * 0.5 * 2.0 + np.arange(n) % 5)


def _double(table):
    return table["v"] * 2


def test_a_big_one_row_answer_comes_whole_in_arrow_and_in_json(roomy):
    """A one-row answer of 3 MiB (over WRITE_SLICE): Arrow pieces and a JSON body both
    leave in slices over the lean path, and arrive as flow.run's rows."""
    import pyarrow as pa

    from executors.codec.bodies import WRITE_SLICE

    n = 3 * WRITE_SLICE // 4
    f = Flow(unique("wide"), schema={"v": ColumnType.tensor(np.float32, (n,))})
    f.map(_double, names=["w"], batching=True)
    d = roomy.deploy(f, timeout_s=3)
    v = np.arange(n, dtype=np.float32)
    expected = f.run([{"v": v}])["w"][0]
    t = pa.table({"v": pa.FixedSizeListArray.from_arrays(pa.array(v), n)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    arrow = "application/vnd.apache.arrow.stream"
    r = httpx.post(
        d.url, content=sink.getvalue().to_pybytes(), headers={"content-type": arrow, "accept": arrow}, timeout=60
    )
    assert r.status_code == 200, r.text[:300]
    assert int(r.headers["content-length"]) == len(r.content) > WRITE_SLICE
    got = pa.ipc.open_stream(r.content).read_all().column("w").combine_chunks().to_numpy_ndarray()[0]
    assert np.array_equal(got, expected)
    r = httpx.post(d.url, content=sink.getvalue().to_pybytes(), headers={"content-type": arrow}, timeout=60)
    assert r.status_code == 200 and len(r.content) > WRITE_SLICE, r.text[:300]
    assert np.array_equal(np.asarray(r.json()["rows"][0]["w"], dtype=np.float32), expected)


def test_a_big_answer_is_sent_in_slices_with_the_event_loop_running_others_between():
    """gateway._send as uvicorn calls it: the messages carry the answer's bytes in order,
    none over WRITE_SLICE, the length declared up front; another task runs between slices."""
    import asyncio

    from executors.codec.bodies import WRITE_SLICE
    from executors.gateway.invoke import Streamed, _send

    big = np.random.default_rng(3).integers(0, 255, 2 * WRITE_SLICE + 12345, dtype=np.uint8)

    def run(body):
        log: list = []

        async def send(message):
            log.append(message)

        async def other():
            while True:
                log.append("other")
                await asyncio.sleep(0)

        async def main():
            task = asyncio.ensure_future(other())
            await asyncio.sleep(0)
            await _send(send, 200, body, [(b"x-a", b"1")])
            task.cancel()

        asyncio.run(main())
        return log

    for body in ([b"head", memoryview(big), b"tail"], big.tobytes()):
        log = run(body)
        messages = [m for m in log if m != "other"]
        start, parts = messages[0], messages[1:]
        sent = b"".join(bytes(m["body"]) for m in parts)
        whole = b"head" + big.tobytes() + b"tail" if isinstance(body, list) else big.tobytes()
        assert sent == whole
        assert dict(start["headers"])[b"content-length"] == str(len(whole)).encode()
        assert all(len(bytes(m["body"])) <= WRITE_SLICE for m in parts)
        assert [m["more_body"] for m in parts] == [True] * (len(parts) - 1) + [False]
        bodies = [i for i, m in enumerate(log) if m != "other" and m["type"] == "http.response.body"]
        assert any("other" in log[a:b] for a, b in zip(bodies, bodies[1:]))  # the loop ran others between

    pieces = iter([big[WRITE_SLICE + 1 :].tobytes()])
    log = run(Streamed(big[: WRITE_SLICE + 1].tobytes(), pieces))
    parts = [m for m in log if m != "other"][1:]
    assert b"".join(bytes(m["body"]) for m in parts) == big.tobytes()
    assert all(len(bytes(m["body"])) <= WRITE_SLICE for m in parts) and parts[-1] == {
        "type": "http.response.body",
        "body": b"",
    }


def test_the_flows_deadline_and_a_request_asking_for_more_or_less(roomy):
    f = Flow(unique("deadline"), schema={"x": int})
    f.map(sleepy, names=["y"])
    d = roomy.deploy(f, timeout_s=0.3)
    assert "deadline: 0.3 s" in d.explain() and httpx.get(d.url).json()["timeout_s"] == 0.3
    late = httpx.post(d.url, json={"x": 1}, timeout=30)
    assert late.status_code == 504 and late.json()["operator"] == "sleepy"
    more = httpx.post(d.url, json={"x": 1}, headers={"X-Request-Timeout": "2.5"}, timeout=30)
    assert more.status_code == 200 and more.json()["rows"][0]["y"] == 1
    # asking for more than the cluster's maximum (3 s) gets the maximum, not what was asked
    f2 = Flow(unique("slower"), schema={"x": int})
    f2.map(lambda r: time.sleep(4.5) or r.x, names=["y"])
    d2 = roomy.deploy(f2)
    capped = httpx.post(d2.url, json={"x": 1}, headers={"X-Request-Timeout": "60"}, timeout=30)
    assert capped.status_code == 504


def test_a_flow_deadline_over_the_cluster_maximum_is_refused(roomy):
    f = Flow(unique("greedy"), schema={"x": int})
    f.map(lambda r: r.x, names=["y"])
    with pytest.raises(BadRequestError, match=r"timeout_s 60 is over the cluster's max_request_timeout_s 3") as e:
        roomy.deploy(f, timeout_s=60)
    assert e.value.status == 400  # fix the request: the gateway named the class, the client raised it
    with pytest.raises(Exception, match="timeout_s must be a number of seconds > 0"):
        roomy.deploy(f, timeout_s=-1)


def test_the_cluster_default_may_not_exceed_its_maximum():
    with pytest.raises(ConfigError, match="request_timeout_s must be <= max_request_timeout_s"):
        ClusterConfig(request_timeout_s=60, max_request_timeout_s=30)
