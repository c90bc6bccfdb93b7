"""Big requests and deadlines: a body of several MB is answered with the rows flow.run gives
(parsed in pieces, off the event loop), and deadlines come from the flow, the cluster and
the request, within the cluster's maximum."""

from __future__ import annotations

import time

import httpx
import numpy as np
import orjson
import pytest

from executors.cluster import LocalCluster
from executors.config import ClusterConfig, ClusterConfigError
from executors.errors import DeployError
from flow import Flow
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
    with pytest.raises(DeployError, match=r"timeout_s 60 is over the cluster's max_request_timeout_s 3"):
        roomy.deploy(f, timeout_s=60)
    with pytest.raises(Exception, match="timeout_s must be a number of seconds > 0"):
        roomy.deploy(f, timeout_s=-1)


def test_the_cluster_default_may_not_exceed_its_maximum():
    with pytest.raises(ClusterConfigError, match="request_timeout_s must be <= max_request_timeout_s"):
        ClusterConfig(request_timeout_s=60, max_request_timeout_s=30)
