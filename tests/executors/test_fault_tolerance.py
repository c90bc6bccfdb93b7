"""kill -9 of an executor under load: no request lost, none answered twice."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow
from tests.executors.test_runtime_paths import _executor_pids, _metric


def work(row):
    import time

    time.sleep(0.02)  # long enough that requests are in flight when the executor dies
    return row.x + 1


@pytest.mark.parametrize(
    "optimize, listed",
    [(False, True), (False, False), (True, False)],
    ids=["two stages, rows parsed by the gateway", "two stages, bodies relayed", "one stage, bodies relayed"],
)
def test_kill_executor_under_load_loses_nothing(optimize, listed):
    c = LocalCluster(ClusterConfig(executors=2, threads=4, request_timeout_s=20, max_retries=3)).start()
    try:
        f = Flow("survivor")
        f.map(work, names=["a"]).map(lambda r: r.a * 2, names=["b"])
        # two stages: more hops to break; a one-row object body goes to the executor of the
        # first stage unparsed (messages.RawInput), and a re-run relays it again; a list of
        # rows is parsed by the gateway
        d = c.deploy(f, optimize=optimize)
        assert httpx.get(d.url).json()["relay_stage"] == ("work+lambda" if optimize else "work")
        answers: dict[int, list] = {}
        failures: list = []
        lock = threading.Lock()
        half_done = threading.Event()
        n_threads, per_thread = 6, 25

        def client(t):
            with httpx.Client(timeout=30) as http:
                for i in range(per_thread):
                    x = t * 1000 + i
                    r = http.post(d.url, json=[{"x": x}] if listed else {"x": x})
                    with lock:
                        if r.status_code == 200:
                            answers.setdefault(x, []).extend(r.json()["rows"])
                        else:
                            failures.append((x, r.status_code, r.text))
                        if len(answers) >= n_threads * per_thread // 3:
                            half_done.set()

        threads = [threading.Thread(target=client, args=(t,)) for t in range(n_threads)]
        for t in threads:
            t.start()
        assert half_done.wait(60), "load did not get going"
        victim = _executor_pids(c)[0]
        os.kill(victim, signal.SIGKILL)
        for t in threads:
            t.join(120)
        assert not failures, failures[:3]
        assert sorted(answers) == sorted(t * 1000 + i for t in range(n_threads) for i in range(per_thread))
        for x, rows in answers.items():
            assert [r["b"] for r in rows] == [(x + 1) * 2], (x, rows)  # exactly one answer row
        qids = [r["qid"] for rows in answers.values() for r in rows]
        assert len(qids) == len(set(qids))
        metrics = httpx.get(c.url + "/metrics").text
        assert _metric(metrics, 'flowserve_retries_total{flow="survivor"}') >= 1
        # the supervisor brought the executor back
        deadline = time.monotonic() + 30
        while httpx.get(c.url + "/healthz").json()["executors"] < 2:
            assert time.monotonic() < deadline, "executor was not restarted"
            time.sleep(0.05)
        assert httpx.post(d.url, json={"x": 1}).json()["rows"][0]["b"] == 4
    finally:
        c.stop()
