"""Wait-for-one, continuations, batching and no-executor on a real local cluster."""

from __future__ import annotations

import json
import threading
import time

import httpx
import numpy as np

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow
from flow.table import Table
from optimizer import BatchConfig, OptimizerOptions
from tests.executors.conftest import unique
from tests.flowgen import assert_same_rows


def small(row):
    return (row.x, 0.5)  # never confident: invalid


def medium(row):
    return (row.x + 1, 0.95 if row.x % 2 else 0.1)


def large(row):
    return (row.x + 2, 0.99)


def test_anyof_first_valid_skips_invalid_results(cluster):
    f = Flow(unique("compete"))
    f.anyof(small, medium, large, names=["cls", "conf"], valid=lambda r: r.conf > 0.9)
    rows = [{"x": i} for i in range(6)]
    d = cluster.deploy(f)
    assert any(s.wait == "first_valid" for s in d.plan.stages.values())
    got = d.invoke(rows)
    # medium is valid for odd x and large always: whichever is first, never small's
    for x, cls, conf in zip(range(6), got["cls"].tolist(), got["conf"].tolist()):
        assert conf > 0.9
        assert cls in ((x + 1, x + 2) if x % 2 else (x + 2,))


def test_anyof_all_invalid_fails_the_query(cluster, http):
    f = Flow(unique("none-valid"))
    f.anyof(small, small, names=["cls", "conf"], valid=lambda r: r.conf > 0.9)
    d = cluster.deploy(f)
    r = http.post(d.url, json={"x": 1})
    assert r.status_code == 422
    assert r.json()["error"] == "NoValidResultError"


def jitter(row):
    import random
    import time

    time.sleep(random.random() * 0.002)
    return row.x * 10


def test_competitive_replicas_answer_once(cluster):
    f = Flow(unique("hv"))
    f.map(lambda r: r.x, names=["x"]).map(jitter, names=["y"], high_variance=True).map(lambda r: r.y + 1, names=["z"])
    d = cluster.deploy(f)
    assert any(s.competitive > 1 for s in d.plan.stages.values())
    got = d.invoke([{"x": i} for i in range(20)])
    assert sorted(got["z"].tolist()) == [i * 10 + 1 for i in range(20)]
    assert len(set(got.qid.tolist())) == 20  # one answer per query, no duplicates


def test_per_row_lookups_with_different_keys(cluster):
    for i in range(12):
        cluster.kvs.put(f"user:{i}", np.full(4, float(i)))
    f = Flow(unique("lookup-rows"))
    looked = f.lookup(column="user", name="vec")
    looked.map(lambda r: (r.user, float(r.vec.sum())), names=["user", "total"])
    d = cluster.deploy(f)
    cont = [s for s in d.plan.stages.values() if s.continuation]
    assert cont and cont[0].continuation == "user"
    rows = [{"user": f"user:{i}"} for i in (3, 7, 1, 11, 3, 0)]
    got = d.invoke(rows)
    assert sorted(zip(got["user"].tolist(), got["total"].tolist())) == sorted(
        (r["user"], 4.0 * int(r["user"].split(":")[1])) for r in rows
    )


def batched_sum(table):
    return table["x"] * 3


def test_batching_merges_concurrent_requests(cluster, http):
    f = Flow(unique("batched"))
    f.map(batched_sum, names=["y"], batching=True)
    d = cluster.deploy(f, options=OptimizerOptions(batch=BatchConfig(max_batch_size=16, max_wait_ms=20.0)))
    assert any(s.batch is not None for s in d.plan.stages.values())
    results, errors = {}, []
    barrier = threading.Barrier(12)

    def call(i):
        barrier.wait()
        r = http.post(d.url, json={"x": i})
        if r.status_code != 200:
            errors.append(r.text)
        else:
            results[i] = r.json()["rows"][0]["y"]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {i: 3 * i for i in range(12)}
    metrics = http.get(cluster.url + "/metrics").text
    stage = next(iter(d.plan.stages))
    count = _metric(metrics, f'flowserve_stage_batch_size_count{{flow="{f.name}",stage="{stage}"}}')
    total = _metric(metrics, f'flowserve_stage_batch_size_sum{{flow="{f.name}",stage="{stage}"}}')
    assert count == 12  # every request ran in one batch
    assert total / count > 1, f"no request was merged: mean batch size {total / count}"


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"metric {name} not found")


def test_no_live_executor_gives_503():
    c = LocalCluster(ClusterConfig(executors=1, restart_executors=False, request_timeout_s=10)).start()
    try:
        f = Flow("lonely")
        f.map(lambda r: r.x, names=["y"])
        d = c.deploy(f)
        assert httpx.post(d.url, json={"x": 1}).status_code == 200
        import os
        import signal

        ex_pid = _executor_pids(c)[0]
        os.kill(ex_pid, signal.SIGKILL)
        r = httpx.post(d.url, json={"x": 1}, timeout=15)
        assert r.status_code == 503, r.text
        assert "executor" in r.json()["message"]
    finally:
        c.stop()


def _executor_pids(c: LocalCluster) -> list[int]:
    import subprocess

    out = subprocess.run(["pgrep", "-f", f"executors.worker.executor .*{c.dir}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_spread_stages_cross_executors_and_answer_the_same():
    """colocate=False sends consecutive stages to different executors (the research's
    setting); answers do not change, only where stages run."""
    with LocalCluster(ClusterConfig(executors=2, colocate=False)) as c:
        f = Flow("spread")
        f.map(lambda r: r.x + 1, names=["x"]).map(lambda r: r.x * 2, names=["x"]).map(lambda r: r.x - 3, names=["y"])
        d = c.deploy(f, optimize=False)
        assert d.invoke([{"x": i} for i in range(5)])["y"].tolist() == [(i + 1) * 2 - 3 for i in range(5)]
        for _ in range(5):
            trace = json.loads(c.http.post(d.url, json={"x": 1}).headers["x-flowserve-trace"])
            where = [executor for _stage, executor, _ms, _batch in trace]
            assert len(where) == 3 and where[0] != where[1] != where[2], trace


def test_busy_polling_off_answers_the_same():
    """busy_poll_ms=0 reaches the executors (they then sleep between messages) and the
    gateway; answers do not change."""
    with LocalCluster(ClusterConfig(executors=1, busy_poll_ms=0)) as c:
        (pid,) = _executor_pids(c)
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().split(b"\0")
        assert args[args.index(b"--busy-poll-ms") + 1] == b"0.0"
        f = Flow("unpolled")
        f.map(lambda r: r.x * 3, names=["y"]).filter(lambda r: r.y > 2)
        d = c.deploy(f)
        rows = [{"x": float(i)} for i in range(5)]
        answer = d.call(rows)
        assert_same_rows(answer.table, f.run(Table.from_any(rows).with_qid(answer.input_qids)))


def test_colocated_stages_stay_on_one_executor_at_light_load(cluster, http):
    f = Flow(unique("together"))
    f.map(lambda r: r.x + 1, names=["x"]).map(lambda r: r.x * 2, names=["x"]).map(lambda r: r.x - 3, names=["y"])
    d = cluster.deploy(f, optimize=False)
    for _ in range(5):  # one request at a time: every executor equally idle
        trace = json.loads(http.post(d.url, json={"x": 1}).headers["x-flowserve-trace"])
        assert len({executor for _s, executor, _ms, _b in trace}) == 1, trace


def ident(x):
    return x


def test_consecutive_cheap_batching_stages_on_one_executor_never_stall():
    """A batch that makes the next batching stage's work ready on the same executor runs
    it at once (it used to wait for the next message: 504s at light load)."""
    f = Flow("stall", schema={"x": float})
    f.map(ident, names=["x"], col="x", batching=True).map(ident, names=["x"], col="x", batching=True)
    with LocalCluster(ClusterConfig(executors=1, request_timeout_s=3)) as c:
        d = c.deploy(f, rules=["batching"])  # batching, no fusion: two batching stages
        assert sum(s.batch is not None for s in d.plan.stages.values()) == 2
        for i in range(20):
            assert d.invoke({"x": float(i)})["x"].tolist() == [float(i)]


def counted(row):
    from flow import current_store

    redis = current_store().redis
    redis.incr("race3-runs")  # every copy that runs counts itself
    # each copy waits until all 3 of its request have started, so none is still queued when
    # the race is won (a queued loser is dropped: test_competition.py); and each costs 5 ms
    # of work, so the stage stays on the worker threads (a cheap one runs on the IO thread,
    # one copy after the other, and the first would wait for the second in vain)
    redis.incr(f"race3-started:{row.x}")
    deadline = time.monotonic() + 10
    while int(redis.get(f"race3-started:{row.x}")) < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.005)
    return row.x * 10


def test_racing_copies_on_one_executor_all_run():
    """competitive=3 on 2 executors: the third copy shares an executor and still runs
    (its copy number keeps it apart from the other copy there)."""
    with LocalCluster(ClusterConfig(executors=2, threads=4)) as c:
        f = Flow("race3")
        f.map(counted, names=["y"], high_variance=True)
        d = c.deploy(f)
        assert [s.competitive for s in d.plan.stages.values()] == [3]
        for i in range(10):
            assert c.http.post(d.url, json={"x": i}).json()["rows"][0]["y"] == i * 10
        deadline = time.monotonic() + 10
        while int(c.kvs.redis.get("race3-runs") or 0) < 30:  # the losers may still be running
            assert time.monotonic() < deadline, f"only {c.kvs.redis.get('race3-runs')} of 30 copies ran"
            time.sleep(0.02)
        assert int(c.kvs.redis.get("race3-runs")) == 30
        metrics = c.http.get("/metrics").text
        (stage,) = d.plan.stages
        answered = _metric(metrics, f'flowserve_stage_latency_ms_count{{flow="race3",stage="{stage}"}}')
        assert answered == 10  # the losers' answers are dropped, not counted


def doubled(table):
    return table["x"] * 2


def test_racing_copies_batched_together_keep_their_rows():
    """Racing copies of one request share its qids; batched together on one executor they
    used to be split back by qid, so one copy got every row and another none, and an empty
    answer could win the race."""
    f = Flow("race-batch", schema={"x": float})
    f.map(doubled, names=["y"], batching=True, high_variance=True)
    with LocalCluster(ClusterConfig(executors=1, threads=4)) as c:
        d = c.deploy(f)
        (stage,) = d.plan.stages.values()
        assert stage.competitive == 3 and stage.batch is not None
        for i in range(30):
            xs = [float(i), float(i) + 0.5, float(i) + 0.25]
            answer = d.invoke([{"x": x} for x in xs])
            assert sorted(answer["y"].tolist()) == sorted(2 * x for x in xs), f"request {i}"
