"""A gateway SIGTERMed under load loses no request: it stops taking new ones (503
ShuttingDown + Retry-After, and /readyz 503, so a balancer sends them elsewhere), answers
every one in flight, closes each connection after its last answer, then exits. Real
processes as on Kubernetes: executors and two standalone gateways over the session's Redis,
closed-loop clients that go to the other gateway when one refuses (what a Service does once
the readiness probe fails)."""

from __future__ import annotations

import collections
import signal
import threading

import httpx

from executors.hosts.cluster import ClusterClient
from flow import Flow
from tests.executors.conftest import unique
from tests.executors.processes import ADMIN, health, wait_until


def busy(row):
    import time

    time.sleep(0.05)  # the workload: requests stay in flight long enough to be caught by the signal
    return row.x * 2


def test_sigterm_under_load_answers_every_request_in_flight_and_loses_none(procs):
    procs.executor("e0")
    procs.executor("e1")
    a, b = procs.gateway("gw-a"), procs.gateway("gw-b")
    for url in (a, b):
        wait_until(f"{url} to find both executors", lambda url=url: health(url).get("executors") == 2)
    name = unique("drained")
    f = Flow(name, schema={"x": int})
    f.map(busy, names=["y"])
    client = ClusterClient(a, procs.redis_url, ADMIN)
    try:
        client.deploy(f)
    finally:
        client.close()
    wait_until("gateway b to serve the flow", lambda: name in health(b).get("flows", []))
    gw_a = procs.procs[-2]  # gw-a's process

    stop, signalled = threading.Event(), threading.Event()
    outcomes: collections.Counter = collections.Counter()
    lost: list[str] = []
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            outcomes[what] += 1

    def client_loop(i: int) -> None:
        with httpx.Client(timeout=30) as http:
            n = 0
            while not stop.is_set():
                n += 1
                x = i * 100_000 + n
                try:
                    r = http.post(f"{a}/flows/{name}", json={"x": x})
                except httpx.ConnectError:  # a has exited: nothing was sent
                    r = None
                except httpx.HTTPError as e:  # sent, and cut: this one is lost
                    with lock:
                        lost.append(f"{type(e).__name__}: {e}")
                    continue
                if r is not None and r.status_code == 200:
                    if r.json()["rows"][0]["y"] != 2 * x:
                        lost.append(f"a answered {r.text} for x={x}")
                    note("a after the signal" if signalled.is_set() else "a")
                    continue
                if r is not None and not (r.status_code == 503 and r.json()["error"] == "ShuttingDown"):
                    lost.append(f"a answered {r.status_code} {r.text}")
                    continue
                if r is not None:
                    if r.headers.get("retry-after") != "1" or r.headers.get("connection") != "close":
                        lost.append(f"a refused without Retry-After and Connection: close: {r.headers}")
                    note("refused by a")
                rb = http.post(f"{b}/flows/{name}", json={"x": x})  # the balancer's next choice
                if rb.status_code != 200 or rb.json()["rows"][0]["y"] != 2 * x:
                    lost.append(f"b answered {rb.status_code} {rb.text}")
                else:
                    note("b")

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        wait_until("requests in flight on gateway a", lambda: health(a).get("inflight", 0) >= 4)
        gw_a.send_signal(signal.SIGTERM)
        signalled.set()
        assert gw_a.wait(60) == 0  # drained, then a clean exit
        wait_until("clients to reach gateway b", lambda: outcomes["b"] >= 20)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert lost == []
    # the requests in flight at the signal (4 or more) were answered by a, which refused the new ones
    assert outcomes["a after the signal"] >= 1 and outcomes["a"] + outcomes["a after the signal"] >= 4, outcomes
    assert outcomes["refused by a"] >= 1, outcomes
