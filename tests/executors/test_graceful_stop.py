"""A graceful stop keeps answering: while in-flight requests finish, new ones get 503 with
Retry-After (never "connection refused"), then the gateway stops."""

from __future__ import annotations

import signal
import threading

import httpx

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow
from tests.executors.processes import wait_until


def slowly(row):
    import time

    time.sleep(1.5)
    return row.x + 1


def test_stop_answers_503_while_in_flight_requests_finish():
    c = LocalCluster(ClusterConfig(executors=1)).start()
    try:
        f = Flow("slow-stop")
        f.map(slowly, names=["y"])
        d = c.deploy(f)
        in_flight: dict = {}
        started = threading.Event()

        def call():
            started.set()
            in_flight["r"] = httpx.post(d.url, json={"x": 1}, timeout=30)

        t = threading.Thread(target=call)
        t.start()
        started.wait(5)
        wait_until("the slow request to be in flight", lambda: httpx.get(c.url + "/healthz").json()["inflight"])
        c.proc.send_signal(signal.SIGTERM)
        refused = None
        for _ in range(200):  # the first answers after the signal: 503 while draining
            r = httpx.post(d.url, json={"x": 2}, timeout=10)
            if r.status_code == 503:
                refused = r
                break
        assert refused is not None, "no 503 while draining"
        assert refused.json()["error"] == "ShuttingDown" and refused.headers["retry-after"] == "1"
        t.join(30)
        assert in_flight["r"].status_code == 200 and in_flight["r"].json()["rows"][0]["y"] == 2
        assert c.proc.wait(30) is not None  # then it stops
    finally:
        c.stop()
