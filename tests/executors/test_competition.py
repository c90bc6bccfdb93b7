"""Racing copies on a real cluster: a losing copy still queued when its race is won is
dropped (the winner's executor sends ``Cancel``), a losing copy that waits in ``flow.wait``
is stopped, copies on one executor run beside each other, and a crash mid-race still
answers once."""

from __future__ import annotations

import os
import re
import threading
import time

import httpx
import numpy as np
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import ColumnType, Flow, current_store, wait
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


def _relayed(d, row: dict) -> dict:
    """POST one row as a JSON object, which the gateway relays unparsed to every racing
    copy (RawInput); the answer's one row. ``invoke`` sends Arrow, which the gateway parses."""
    r = httpx.post(d.url, json=row, timeout=60)
    assert r.status_code == 200, r.text
    (out,) = r.json()["rows"]
    return out


def _is_relayed(c, d) -> bool:
    return c.http.get(f"/flows/{d.name}").json()["relay_stage"] is not None


@pytest.mark.parametrize("body", ["arrow", "relayed json"])
def test_a_crash_mid_race_still_answers_once(body):
    with LocalCluster(ClusterConfig(executors=2, threads=2, request_timeout_s=30)) as c:
        f = Flow("cancel-crash", schema={"x": int})
        f.map(crash_first, names=["y"], high_variance=True)
        d = c.deploy(f, options=TWO)
        assert _is_relayed(c, d)  # a one-stage race takes a JSON row as it came
        if body == "arrow":
            run = lambda x: d.invoke({"x": x})["y"].tolist()  # noqa: E731
        else:
            run = lambda x: [_relayed(d, {"x": x})["y"]]  # noqa: E731
        assert run(1) == [2]  # the other copy, or a re-run, answers
        for i in range(5):
            assert run(i) == [i + 1]
        (stage,) = d.plan.stages
        metrics = c.http.get("/metrics").text
        answered = _metric(metrics, f'flowserve_stage_latency_ms_count{{flow="cancel-crash",stage="{stage}"}}')
        assert answered == 6  # each request answered once: a loser's (or a re-run's) answer is dropped


def waits_on_one(row):
    """The first process to run this is the slow replica: its copy waits in ``flow.wait``
    for up to 30 s and records how long it waited; the other replica answers at once."""
    redis = current_store().redis
    redis.set(f"wait-slow:{row.tag}", os.getpid(), nx=True)
    if int(redis.get(f"wait-slow:{row.tag}")) == os.getpid():
        t0 = time.monotonic()
        stopped = wait(30.0)
        redis.set(f"wait-stopped:{row.tag}", f"{int(stopped)} {time.monotonic() - t0:.3f}")
    return row.x * 10


def _stopped(redis, tag: str, seconds: float = 20.0) -> tuple[bool, float]:
    deadline = time.monotonic() + seconds
    while (got := redis.get(f"wait-stopped:{tag}")) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert got is not None, "the slow copy still waits: nobody cancelled it"
    stopped, waited = got.decode().split()
    return stopped == "1", float(waited)


def passed_on(row):
    return row.y + 1


@pytest.mark.parametrize("where", ["sink", "inside", "sink, relayed json"])
def test_a_running_losing_copy_that_waits_is_stopped(where):
    """The race as the flow's sink, and inside a flow (a stage after it, not fused into it:
    the winner's output goes on to that stage, not to the gateway); and a JSON row relayed
    as it came to each copy, the winner answering the client's JSON."""
    with LocalCluster(ClusterConfig(executors=2, threads=1, request_timeout_s=30)) as c:
        f = Flow(f"cancel-running-{where.split(',')[0]}", schema={"x": int, "tag": str})
        raced = f.map(waits_on_one, names=["y"], high_variance=True)
        options = TWO
        if where == "inside":
            raced.map(passed_on, names=["y"])
            options = OptimizerOptions(competitive_replicas=2, fuse_into_race=False)
        d = c.deploy(f, options=options)
        racing = [s for s in d.plan.stages.values() if s.competitive > 1]
        assert len(racing) == 1 and (racing[0].name == d.plan.sink) == (where != "inside")
        plus = 1 if where == "inside" else 0
        if where.endswith("relayed json"):
            assert _is_relayed(c, d)
            run = lambda x: [_relayed(d, {"x": x, "tag": where})["y"]]  # noqa: E731
        else:
            run = lambda x: d.invoke({"x": x, "tag": where})["y"].tolist()  # noqa: E731
        assert run(4) == [40 + plus]  # the fast replica's copy
        stopped, waited = _stopped(c.kvs.redis, where)
        assert stopped and waited < 10, (stopped, waited)  # told by a Cancel, not the 30 s
        # the stopped copy's output was dropped: one answer, and the replica serves on
        assert run(5) == [50 + plus]


def copies_beside_each_other(row):
    """Quick while ``row.k`` is 0 (the stage looks cheap); otherwise each copy waits until
    ``row.k`` copies have started (or 3 s) and returns how many it saw. Either way, with
    the thread it ran on (an executor's IO thread is named ``<id>-io<n>``)."""
    thread = threading.current_thread().name
    if row.k == 0:
        return 0, thread
    redis = current_store().redis
    key = f"beside:{row.x}"
    redis.incr(key)
    _wait_for(redis, key, row.k, seconds=3.0)
    return int(redis.get(key)), thread


def test_copies_on_one_executor_run_beside_each_other():
    """A racing stage never runs on the IO thread, however quick it has been: there the
    copies sent to one executor would run one after another, and a waiting copy could not
    read the Cancel that stops it. Copies of a relayed JSON row too: each RawInput says
    which copy it is (without that, one executor would take the others for duplicates)."""
    with LocalCluster(ClusterConfig(executors=1, threads=4, request_timeout_s=30)) as c:
        f = Flow("race-beside", schema={"x": int, "k": int})
        f.map(copies_beside_each_other, names=["seen", "thread"], high_variance=True)
        d = c.deploy(f, options=OptimizerOptions(competitive_replicas=3))
        for i in range(30):  # quick runs: a plain stage this quick would move to the IO thread
            out = d.invoke({"x": i, "k": 0})
            assert out["seen"].tolist() == [0] and not re.search(r"-io\d+$", out["thread"][0]), out["thread"][0]
            row = _relayed(d, {"x": 1000 + i, "k": 0})
            assert row["seen"] == 0 and not re.search(r"-io\d+$", row["thread"]), row["thread"]
        out = d.invoke({"x": 100, "k": 3})
        assert out["seen"].tolist() == [3] and not re.search(r"-io\d+$", out["thread"][0]), out["thread"][0]
        assert _is_relayed(c, d)
        row = _relayed(d, {"x": 101, "k": 3})
        assert row["seen"] == 3 and not re.search(r"-io\d+$", row["thread"]), row["thread"]


def test_a_bad_relayed_row_to_a_race_is_one_400_naming_the_column():
    """Every copy parses the relayed row and finds it bad: the first Failure answers (the
    parsed path's 400), the others are dropped, and the race serves on."""
    with LocalCluster(ClusterConfig(executors=2, threads=2, request_timeout_s=30)) as c:
        f = Flow("race-bad", schema={"x": int})
        f.map(passed_on_x, names=["y"], high_variance=True)
        d = c.deploy(f, options=OptimizerOptions(competitive_replicas=3))
        assert _is_relayed(c, d)
        r = httpx.post(d.url, json={"x": "seven"}, timeout=60)
        assert r.status_code == 400, r.text
        assert "'x'" in r.json()["message"], r.json()
        parsed = httpx.post(d.url, json=[{"x": "seven"}], timeout=60)  # a list: parsed by the gateway
        assert parsed.status_code == 400 and parsed.json()["error"] == r.json()["error"], parsed.text
        assert _relayed(d, {"x": 6})["y"] == 7
        metrics = c.http.get("/metrics").text
        assert _metric(metrics, 'flowserve_requests_total{flow="race-bad",status="400"}') == 2


def passed_on_x(row):
    return row.x + 1


def test_a_hedge_cancels_the_copy_that_lost():
    with LocalCluster(ClusterConfig(executors=2, threads=2, request_timeout_s=30)) as c:
        f = Flow("cancel-hedge", schema={"x": int, "tag": str})
        f.map(waits_on_one, names=["y"], hedge=0.05)
        d = c.deploy(f)
        for i in range(4):  # routed to each replica in turn: the slow one's are hedged
            assert d.invoke({"x": i, "tag": "hedge"})["y"].tolist() == [10 * i]
        # the primary on the slow replica waited until its backup answered and told it so
        stopped, waited = _stopped(c.kvs.redis, "hedge")
        assert stopped and waited < 10, (stopped, waited)
        assert outside_a_deployment_wait_sleeps()


def outside_a_deployment_wait_sleeps() -> bool:
    """flow.wait outside a racing copy (here, in the test process) sleeps its time."""
    t0 = time.monotonic()
    return wait(0.02) is False and time.monotonic() - t0 >= 0.02


def bump_in_place(row):
    """Adds one to its input tensor in place (bad manners, but an operator may: a row's
    tensor is a view of its column), then waits until every copy of the race has done so
    (or 3 s) before it answers."""
    v = row.v
    v += 1
    redis = current_store().redis
    key = f"bumped:{row.tag}"
    redis.incr(key)
    _wait_for(redis, key, 3, seconds=3.0)
    return int(v[0]), int(redis.get(key))


def bump_batch_in_place(table):
    """``bump_in_place`` on a batch: the column's storage itself, changed in place where it
    may be (a column decoded from an Arrow body's frames is read-only)."""
    v = table["v"]
    if v.flags.writeable:
        v += 1
    else:
        v = v + 1
    redis = current_store().redis
    key = f"bumped:{int(table['tag'][0])}"
    redis.incr(key)
    _wait_for(redis, key, 3, seconds=3.0)
    return v[:, 0].copy(), np.full(len(v), int(redis.get(key)))


@pytest.mark.parametrize("body", ["arrow", "relayed json"])
def test_copies_of_a_batching_race_on_one_executor_run_side_by_side(body):
    """Copies of one request share its qids, so a batching stage runs them in batches of
    their own: side by side (the later ones on the pool), not one after another behind the
    batcher, each on rows of its own."""
    with LocalCluster(ClusterConfig(executors=1, threads=4, request_timeout_s=30)) as c:
        f = Flow("race-batched", schema={"v": ColumnType.tensor(np.int64, (2,)), "tag": int})
        f.map(bump_batch_in_place, names=["y", "seen"], batching=True, high_variance=True)
        d = c.deploy(f, options=OptimizerOptions(competitive_replicas=3))
        for tag in range(100, 103):
            if body == "arrow":
                out = d.invoke({"v": np.array([5, 5]), "tag": tag})
                row = {"y": out["y"][0], "seen": out["seen"][0]}
            else:
                row = _relayed(d, {"v": [5, 5], "tag": tag})
            assert row["seen"] == 3, row  # the three copies ran at once (one after another: 1)
            assert row["y"] == 6, row


def test_copies_of_a_relayed_row_on_one_executor_have_rows_of_their_own():
    """The executor parses a race's relayed row once for the copies it runs, and gives each
    copy rows of its own: a copy that changes its input in place changes no other's."""
    with LocalCluster(ClusterConfig(executors=1, threads=4, request_timeout_s=30)) as c:
        f = Flow("race-own-rows", schema={"v": ColumnType.tensor(np.int64, (2,)), "tag": int})
        f.map(bump_in_place, names=["y", "seen"], high_variance=True)
        d = c.deploy(f, options=OptimizerOptions(competitive_replicas=3))
        assert _is_relayed(c, d)
        for tag in range(3):
            row = _relayed(d, {"v": [5, 5], "tag": tag})
            assert row["seen"] == 3, row  # all three copies ran, side by side
            assert row["y"] == 6, row  # not 7 or 8: no other copy's increment in its rows
