"""Cluster lifecycle: the KVS server dying and coming back, graceful stop, bearer token."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import numpy as np

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow


def redis_pid(c: LocalCluster) -> int:
    return int(c.kvs.redis.info("server")["process_id"])


def wait_until(cond, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_gateway_survives_a_kvs_restart():
    with LocalCluster(ClusterConfig(executors=2, request_timeout_s=15)) as c:
        plain = Flow("plain")
        plain.map(lambda r: r.x + 1, names=["y"])
        looked = Flow("looked")
        looked.lookup(column="k", name="v").map(lambda r: float(r.v.sum()), names=["s"])
        d_plain, d_looked = c.deploy(plain), c.deploy(looked)
        c.kvs.put("vec", np.ones(3))
        assert d_looked.invoke({"k": "vec"})["s"].tolist() == [3.0]
        old = redis_pid(c)
        os.kill(old, signal.SIGKILL)
        # the data path does not go through Redis: a flow without lookups keeps answering
        assert d_plain.invoke({"x": 1})["y"].tolist() == [2]

        def back():
            try:
                return redis_pid(c) != old
            except Exception:
                return False

        wait_until(back, what="the supervisor to restart the KVS server")
        c.kvs.put("vec", np.full(3, 2.0))  # persistence is off in this cluster: data is new
        wait_until(lambda: _try_sum(d_looked) == 6.0, what="lookups to work again")
        assert d_plain.invoke({"x": 5})["y"].tolist() == [6]


def _try_sum(d):
    try:
        return d.invoke({"k": "vec"})["s"].tolist()[0]
    except Exception:
        return None


def slow_double(row):
    import time

    time.sleep(0.5)
    return row.x * 2


def test_stop_is_graceful_in_flight_requests_finish():
    c = LocalCluster(ClusterConfig(executors=2)).start()
    f = Flow("slowpoke")
    f.map(slow_double, names=["y"])
    d = c.deploy(f)
    results = []
    started = threading.Event()

    def call():
        started.set()
        results.append(httpx.post(d.url, json={"x": 21}, timeout=30))

    t = threading.Thread(target=call)
    t.start()
    started.wait()
    wait_until(lambda: _inflight(c) > 0, what="the request to be in flight")
    c.stop()
    t.join(30)
    assert results and results[0].status_code == 200, results
    assert results[0].json()["rows"][0]["y"] == 42


def _inflight(c) -> int:
    return httpx.get(c.url + "/healthz").json().get("inflight", 0)


def test_bearer_token_is_required_when_set():
    with LocalCluster(ClusterConfig(executors=2, token="s3cret-token")) as c:
        f = Flow("guarded")
        f.map(lambda r: r.x, names=["y"])
        d = c.deploy(f)
        assert httpx.post(d.url, json={"x": 1}).status_code == 401
        wrong = httpx.post(d.url, json={"x": 1}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = httpx.post(d.url, json={"x": 1}, headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200
        assert d.invoke({"x": 3})["y"].tolist() == [3]  # the Python client sends the token
        assert httpx.get(c.url + "/healthz").status_code == 200  # probes need no token
