"""Racing copies on a real cluster: a losing copy still queued when its race is won is
dropped (the winner's executor sends ``Cancel``), and a crash mid-race still answers once."""

from __future__ import annotations

import os
import time

from executors.cluster import LocalCluster
from executors.config import ClusterConfig
from flow import Flow, current_store
from optimizer import OptimizerOptions
from tests.executors.test_runtime_paths import _metric

TWO = OptimizerOptions(competitive_replicas=2)


def _wait_for(redis, key: str, value: int, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while int(redis.get(key) or 0) < value and time.monotonic() < deadline:
        time.sleep(0.001)


def one_slow_replica(row):
    """The first process to run this becomes the slow replica: it counts its runs, and its
    first run holds its only worker thread until the test releases it. The other replica
    answers at once, so it wins every race."""
    redis = current_store().redis
    redis.set("cancel-slow", os.getpid(), nx=True)
    if int(redis.get("cancel-slow")) == os.getpid():
        if redis.incr("cancel-slow-runs") == 1:
            _wait_for(redis, "cancel-release", 1)
    return row.x * 10


def both_copies(row):
    """Both copies wait for each other: when this answers, each replica has run its copy
    (FIFO: a replica's queue before it is drained)."""
    redis = current_store().redis
    redis.incr(f"cancel-both:{row.x}")
    _wait_for(redis, f"cancel-both:{row.x}", 2)
    return row.x


def test_a_queued_losing_copy_is_dropped():
    with LocalCluster(ClusterConfig(executors=2, threads=1, request_timeout_s=30)) as c:
        f = Flow("cancel-queued", schema={"x": int})
        f.map(one_slow_replica, names=["y"], high_variance=True)
        d = c.deploy(f, options=TWO)
        g = Flow("cancel-sentinel", schema={"x": int})
        g.map(both_copies, names=["x"], high_variance=True)
        sentinel = c.deploy(g, options=TWO)
        n = 8
        for i in range(n):
            # the fast replica answers each; the slow one holds request 0's copy running and
            # the others' copies queued behind it
            assert d.invoke({"x": i})["y"].tolist() == [i * 10]
        c.kvs.redis.set("cancel-release", 1)
        assert sentinel.invoke({"x": 1})["x"].tolist() == [1]  # the slow replica's queue drained
        runs = int(c.kvs.redis.get("cancel-slow-runs"))
        # request 0's copy was running (never interrupted); of the n - 1 queued ones, all but
        # a last one whose cancel might still have been on its way were dropped (without
        # cancelling all n run)
        assert 1 <= runs <= 2, f"the slow replica ran {runs} of {n} copies"
        # and it still serves: a request whose copy runs there answers
        c.kvs.redis.set("cancel-slow-runs", 100)
        assert d.invoke({"x": 99})["y"].tolist() == [990]


def crash_first(row):
    """The first copy to start kills its executor mid-race; every later copy answers."""
    redis = current_store().redis
    if redis.set("crash-race", os.getpid(), nx=True):
        os._exit(1)
    redis.incr("crash-race-answers")
    return row.x + 1


def test_a_crash_mid_race_still_answers_once():
    with LocalCluster(ClusterConfig(executors=2, threads=2, request_timeout_s=30)) as c:
        f = Flow("cancel-crash", schema={"x": int})
        f.map(crash_first, names=["y"], high_variance=True)
        d = c.deploy(f, options=TWO)
        assert d.invoke({"x": 1})["y"].tolist() == [2]  # the other copy, or a re-run, answers
        for i in range(5):
            assert d.invoke({"x": i})["y"].tolist() == [i + 1]
        (stage,) = d.plan.stages
        metrics = c.http.get("/metrics").text
        answered = _metric(metrics, f'flowserve_stage_latency_ms_count{{flow="cancel-crash",stage="{stage}"}}')
        assert answered == 6  # each request answered once: a loser's (or a re-run's) answer is dropped
