"""Hardening of the cluster's state, on real clusters: real Redis,
real executor processes, real HTTP.

* redeploys and undeploys free the old versions' replicas (executor RSS falls back);
* a KVS that restarts empty: versions stay unique, gateways re-publish their flows,
  restarted executors rebuild them, lookups of lost keys answer 503 (not 422);
* with persistence (the default) a KVS kill loses nothing, and a cluster whose store takes
  longer to load its data than the start's timeout starts, telling its progress;
* concurrent deploys of one name end in one agreed state: the newest version is served,
  registered and listed; the others got 409.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading

import httpx
import numpy as np
import pytest

from executors.errors import DeployConflictError
from executors.hosts.cluster import LocalCluster, _Starting
from executors.hosts.cluster_config import ClusterConfig
from executors.plans import DEPLOYED_KEY
from flow import Flow
from kvs import find_server_binary
from kvs.server import ENV_BINARY
from tests.executors.conftest import unique
from tests.executors.processes import wait_until
from tests.kvs.helpers import SLOW_KEYS, SLOW_LOAD

MODEL_BYTES = 50 * 1024 * 1024


def model_class(offset: float):
    """An operator class holding a 50 MB model built in code; ``offset`` changes its code."""

    class Model:
        def __init__(self):
            self.w = np.full(MODEL_BYTES // 8, offset)  # touched: resident, not just reserved

        def __call__(self, table):
            return table["x"] + self.w[-1]

    return Model


def started(config: ClusterConfig) -> LocalCluster:
    """A started cluster whose gateway answers: the state file is written during the
    app's startup, a moment before uvicorn listens (a race outside this test's subject)."""
    c = LocalCluster(config).start()

    def answers():
        try:
            return c.http.get("/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until("the gateway to listen", answers, timeout=30)
    return c


def executor_pids(c: LocalCluster) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"executors.worker.executor .*{c.dir}"], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def rss_all(c: LocalCluster) -> dict[int, float]:
    return {p: rss_mb(p) for p in executor_pids(c)}


def served(c, name: str) -> int | None:
    flows = {f["name"]: f["version"] for f in c.http.get("/flows").json()["flows"]}
    return flows.get(name)


def registered(c, name: str) -> int | None:
    v = c.kvs.redis.hget(DEPLOYED_KEY, name)
    return None if v is None else int(v)


def post(d, row: dict) -> httpx.Response:
    return d.cluster.http.post(d.url, json=row, timeout=30)


# -- item 3: redeploy and undeploy free memory -------------------------------------------------


def test_redeploys_and_undeploy_give_the_models_memory_back():
    with started(ClusterConfig(executors=2, request_timeout_s=20)) as c:
        # the same code paths once without a model: what a fresh executor that has served weighs
        warm = Flow("warm", schema={"x": float})
        warm.map(lambda t: t["x"], names=["y"], batching=True)
        d = c.deploy(warm)
        assert post(d, {"x": 1.0}).status_code == 200
        d.undeploy()
        cold = rss_all(c)
        assert len(cold) == 2
        ceiling = {p: mb + 1.6 * MODEL_BYTES / 2**20 for p, mb in cold.items()}  # one model, and slack
        seen = []
        for i in range(8):
            f = Flow("big", schema={"x": float})
            f.map(model_class(float(i)), names=["y"], batching=True)
            d = c.deploy(f)
            assert post(d, {"x": 1.0}).json()["rows"][0]["y"] == 1.0 + i  # the new code answers
            # the old version is released once idle: each executor holds one model, not i + 1
            wait_until(
                f"redeploy {i}: executors back to one model",
                lambda: all(rss_mb(p) < ceiling[p] for p in cold),
                timeout=30,
            )
            seen.append(rss_all(c))
        d.undeploy()
        wait_until(
            "undeploy: executors back to a fresh executor's size",
            lambda: all(rss_mb(p) <= 1.10 * cold[p] for p in cold),
            timeout=30,
        )
        after = rss_all(c)
        print(
            f"RSS MB fresh {cold}; peak while redeploying {max(max(s.values()) for s in seen):.0f}; "
            f"after undeploy {after}"
        )
        assert executor_pids(c) == sorted(cold)  # the same processes: memory was freed, not restarted


def test_an_unloaded_version_is_gone_and_is_not_rebuilt_by_a_late_message(kvs, redis_url, tmp_path):
    from dataclasses import replace

    from executors.plans import PLAN_KEY
    from executors.wire.messages import Load, StageInput, Unload
    from executors.worker.executor import Executor
    from optimizer import optimize

    f = Flow("unloaded", schema={"x": float})
    f.map(model_class(1.0), names=["y"], batching=True)
    plan = optimize(f)  # the batching rule gives the stage its batcher
    for v in (1, 2):
        kvs.put_trusted(PLAN_KEY.format(flow="unloaded", version=v), plan)
    stage = next(iter(plan.stages))
    ex = Executor("u0", f"ipc://{tmp_path}/u0", redis_url, threads=1)
    nobody = f"ipc://{tmp_path}/nobody"  # replies go nowhere: this test reads the executor itself
    try:
        for v in (1, 2):
            ex.stages.load(Load("unloaded", v, None, nobody, f"load-{v}"))
        batcher = ex.stages.hosted[("unloaded", 1, stage)].batcher
        assert batcher is not None and batcher.thread.is_alive()

        ex.stages.unload(Unload("unloaded", 1))
        assert [k for k in ex.stages.hosted if k[1] == 1] == [] and ("unloaded", 2, stage) in ex.stages.hosted
        batcher.thread.join(5)
        assert not batcher.thread.is_alive()  # its batcher thread ended

        run = StageInput(1, 0, "unloaded", 1, stage, "__input__", {}, nobody)
        assert ex.inputs.gather(run) == [] and ("unloaded", 1, stage) not in ex.stages.hosted  # not rebuilt
        assert ex.inputs.gather(replace(run, version=3)) == []  # no plan in the store: an error, not an exception

        # an executor that restarted (it retired nothing) still rebuilds from the store
        fresh = Executor("u1", f"ipc://{tmp_path}/u1", redis_url, threads=1)
        try:
            fresh.inputs.gather(replace(run, version=2))
            assert ("unloaded", 2, stage) in fresh.stages.hosted
        finally:
            _close(fresh)
    finally:
        _close(ex)


def _close(ex) -> None:
    ex.stop()
    for hosted in ex.stages.hosted.values():
        hosted.retired.set()
    ex.pool.shutdown(wait=True)
    ex.listener.close()
    ex.outbox.close()
    ex.store.close()


# -- item 4: the store restarts empty, or keeps its data ---------------------------------------


def restart_kvs(c: LocalCluster) -> None:
    """kill -9 the KVS server; returns once the supervisor has restarted it and it has
    loaded its data (INFO answers while it loads; other commands get LOADING then)."""
    old = int(c.kvs.redis.info("server")["process_id"])
    os.kill(old, signal.SIGKILL)

    def back():
        try:
            info = c.kvs.redis.info()  # the server and persistence sections
            return int(info["process_id"]) != old and int(info.get("loading", 1)) == 0
        except Exception:
            return False

    wait_until("the supervisor to restart the KVS server", back, timeout=30)


def kill_executors(c: LocalCluster) -> None:
    """kill -9 every executor; returns once the supervisor has restarted them all."""
    old = executor_pids(c)
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    wait_until("the executors to be restarted", lambda: len(set(executor_pids(c)) - set(old)) == len(old), timeout=60)


def answers(d, rows: list[dict]) -> list:
    return [post(d, r) for r in rows]


def test_a_kvs_that_restarts_empty_loses_no_flow_and_reuses_no_version():
    with started(ClusterConfig(executors=2, persistence=False, request_timeout_s=10)) as c:
        name = unique("code")
        old = Flow(name, schema={"x": float})
        old.map(lambda r: r.x + 1, names=["y"])
        d_old = c.deploy(old)
        looked = Flow(unique("looked"))
        looked.lookup(column="k", name="v").map(lambda r: float(r.v.sum()), names=["s"])
        d_looked = c.deploy(looked)
        c.kvs.put("vec", np.ones(3))
        assert post(d_looked, {"k": "vec"}).json()["rows"][0]["s"] == 3.0
        assert post(d_looked, {"k": "nope"}).status_code == 422  # intact store: a missing key is the row's

        restart_kvs(c)  # persistence off: the store comes back empty
        # the gateway notices (its marker is gone) and re-publishes what it serves
        wait_until(
            "the flows to be re-published",
            lambda: registered(c, name) == d_old.version and registered(c, looked.name) == d_looked.version,
        )

        # redeploying changed code under the same name serves the new code, every time
        new = Flow(name, schema={"x": float})
        new.map(lambda r: r.x + 100, names=["y"])
        d_new = c.deploy(new)
        assert d_new.version > d_old.version
        got = [r.json()["rows"][0]["y"] for r in answers(d_new, [{"x": float(i)} for i in range(20)])]
        assert got == [i + 100.0 for i in range(20)]
        assert served(c, name) == registered(c, name) == d_new.version

        # lost lookup data: a server-side loss (503, retryable), not a missing key (422)
        r = post(d_looked, {"k": "vec"})
        assert r.status_code == 503 and r.json()["error"] == "StoreLostError", r.text
        assert "lost its data" in r.json()["message"]

        # restarted executors rebuild every flow from what was re-published
        kill_executors(c)
        wait_until(
            "every flow to answer from the restarted executors",
            lambda: post(d_new, {"x": 1.0}).status_code == 200 and post(d_looked, {"k": "vec"}).status_code == 503,
            timeout=60,
        )
        assert [r.json()["rows"][0]["y"] for r in answers(d_new, [{"x": 2.0}] * 10)] == [102.0] * 10
        c.kvs.put("vec", np.full(3, 2.0))  # data written again: lookups answer, missing keys are 422 again
        assert post(d_looked, {"k": "vec"}).json()["rows"][0]["s"] == 6.0
        assert post(d_looked, {"k": "nope"}).status_code == 422


def test_with_persistence_a_kvs_kill_loses_neither_data_nor_flows():
    assert ClusterConfig().persistence is True  # the default, as for `flowserve up`
    with started(ClusterConfig(executors=2, request_timeout_s=10)) as c:
        looked = Flow(unique("kept"))
        looked.lookup(column="k", name="v").map(lambda r: float(r.v.sum()), names=["s"])
        d = c.deploy(looked)
        c.kvs.put("vec", np.full(3, 4.0))
        restart_kvs(c)
        assert registered(c, looked.name) == d.version
        assert c.kvs.exists(f"flowserve:plan:{looked.name}:{d.version}")
        wait_until("lookups after the restart", lambda: post(d, {"k": "vec"}).status_code == 200)
        assert post(d, {"k": "vec"}).json()["rows"][0]["s"] == 12.0
        kill_executors(c)
        wait_until("the restarted executors to answer", lambda: post(d, {"k": "vec"}).status_code == 200, timeout=60)
        assert post(d, {"k": "nope"}).status_code == 422


def test_a_cluster_whose_store_loads_for_longer_than_its_start_timeout_starts_with_its_data(
    tmp_path, monkeypatch, capsys
):
    """A big store reads its data back for minutes before it serves: `flowserve up` on it
    must wait as long as the load moves on, and say how far it is, not give up."""
    cluster_dir = tmp_path / "cluster"
    # about 12 s to load: four times the start's timeout and more than the rest of the start
    data = {f"k{i}": np.frombuffer(os.urandom(2048), dtype=np.uint8) for i in range(4 * SLOW_KEYS)}
    c = started(ClusterConfig(dir=str(cluster_dir), executors=1))
    try:
        c.kvs.mput(data)
        looked = Flow(unique("kept"))
        looked.lookup(column="k", name="v").map(lambda r: int(r.v.sum()), names=["s"])
        c.deploy(looked)
        c.kvs.redis.bgrewriteaof()  # the data in the AOF's base file, where the load's delay applies
        wait_until("the AOF rewrite", lambda: aof_rewritten(c), timeout=30)
    finally:
        c.stop()
    # the same real server, told to take 40 ms a key to read its data back
    slow = tmp_path / "slow-redis-server"
    slow.write_text(f'#!/bin/sh\nexec {find_server_binary()} "$@" {" ".join("--" + o for o in SLOW_LOAD)}\n')
    slow.chmod(0o755)
    monkeypatch.setenv(ENV_BINARY, str(slow))
    monkeypatch.delenv("FLOWSERVE_QUIET", raising=False)
    monkeypatch.setattr(_Starting, "SAY_S", 0.5)
    capsys.readouterr()
    c = LocalCluster(ClusterConfig(dir=str(cluster_dir), executors=1)).start(timeout=3.0)
    try:
        said = capsys.readouterr().err
        assert "the store is loading its data: " in said, said
        got = c.kvs.mget(list(data))
        assert all(np.array_equal(a, b) for a, b in zip(got, data.values()))

        def ask():
            return c.http.post(f"/flows/{looked.name}", json={"k": "k3"}, timeout=30)

        wait_until("the flow to answer", lambda: ask().status_code == 200, timeout=30)
        assert ask().json()["rows"][0]["s"] == int(data["k3"].sum())
    finally:
        c.stop()


def test_a_start_waits_on_a_load_that_gets_further_not_on_one_that_stands_still(tmp_path):
    path = tmp_path / "starting.json"
    starting = _Starting(path)

    def report(percent: float, elapsed: float) -> None:
        path.write_text(json.dumps({"step": "the store is loading its data", "percent": percent, "elapsed_s": elapsed}))

    assert not starting.moved()  # no report: the usual start
    report(10.0, 1.0)
    assert starting.moved() and not starting.moved()  # a report counts once
    report(10.0, 2.0)
    assert not starting.moved()  # answering, but no further: the deadline stays
    report(35.0, 3.0)
    assert starting.moved()
    assert "the store is loading its data: 35% after 3 s" in starting.last()
    path.unlink()
    assert starting.moved() and not starting.moved()  # the load is over: once


def aof_rewritten(c: LocalCluster) -> bool:
    p = c.kvs.redis.info("persistence")
    return not int(p["aof_rewrite_in_progress"]) and not int(p["aof_rewrite_scheduled"])


# -- item 5: concurrent deploys ----------------------------------------------------------------


@pytest.mark.parametrize("rounds", [4])
def test_concurrent_deploys_of_one_name_agree_on_the_newest(rounds):
    with started(ClusterConfig(executors=2, request_timeout_s=20)) as c:
        cold = rss_all(c)
        _race_deploys(c, rounds)
        # what the losers built, and the replaced versions, were released: one model each
        try:
            wait_until(
                "the executors to hold the winner's model only",
                lambda: all(rss_mb(p) < mb + 1.6 * MODEL_BYTES / 2**20 for p, mb in cold.items()),
            )
        except AssertionError:
            raise AssertionError(f"RSS MB before {cold}, now {rss_all(c)}") from None


def _race_deploys(cluster: LocalCluster, rounds: int) -> None:
    name = unique("raced")
    for _ in range(rounds):
        outcomes: dict[int, object] = {}
        barrier = threading.Barrier(4)

        def deploy(i: int, barrier=barrier, outcomes=outcomes):
            f = Flow(name, schema={"x": float})
            f.map(model_class(float(i)), names=["y"], batching=True)  # code i answers x + i
            barrier.wait()
            try:
                outcomes[i] = cluster.deploy(f)
            except DeployConflictError as e:
                outcomes[i] = e  # noqa: B023  (the except clause's own e)

        threads = [threading.Thread(target=deploy, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        won = {i: d.version for i, d in outcomes.items() if not isinstance(d, Exception)}
        lost = {i: e for i, e in outcomes.items() if isinstance(e, Exception)}
        assert len(won) + len(lost) == 4 and won
        print(f"round: {len(won)} acknowledged, {len(lost)} got 409")
        # the newest acknowledged deploy is served, registered and listed, and its code answers
        winner = max(won, key=won.get)
        version = won[winner]
        assert served(cluster, name) == registered(cluster, name) == version
        d = outcomes[winner]
        assert {post(d, {"x": 0.0}).json()["rows"][0]["y"] for _ in range(6)} == {float(winner)}
        for _i, e in lost.items():  # each loser was told which version beat it
            assert e.version < e.winner and f"v{e.version}" in str(e) and f"v{e.winner}" in str(e)
        assert all(e.version < version for e in lost.values())
    # asking again for the served version (a client retrying its deploy) is not a conflict
    r = httpx.post(
        f"{cluster.url}/admin/deploy",
        json={"flow": name, "version": version},
        headers={"Authorization": f"Bearer {cluster.state['admin_token']}"},
        timeout=60,
    )
    assert r.status_code == 200 and served(cluster, name) == registered(cluster, name) == version, r.text
    assert {post(d, {"x": 0.0}).json()["rows"][0]["y"] for _ in range(3)} == {float(winner)}


# -- the same on the standalone (Kubernetes) gateway ------------------------------------------


def test_standalone_gateway_releases_old_versions_and_republishes_a_lost_store(tmp_path):
    """Executors and a gateway started as pods start them, on a KVS without persistence
    (a Redis pod without a volume): redeploys free the executors' memory, and after the
    KVS restarts empty the gateway puts its flows back, so a restarted executor rebuilds
    them; lost lookup data answers 503."""
    from executors.hosts.cluster import ClusterClient
    from kvs import RedisServer
    from tests.executors.processes import ADMIN, Procs, health

    with RedisServer(dir=tmp_path / "redis", appendonly=False) as server:
        procs = Procs(server.url, tmp_path)
        client = ClusterClient("http://unset", server.url, ADMIN)
        try:
            e0, e1 = procs.executor("e0"), procs.executor("e1")
            gw = procs.gateway("gw")
            client.state["url"] = gw
            wait_until("two executors", lambda: health(gw).get("executors") == 2)
            cold = {p.pid: rss_mb(p.pid) for p in (e0, e1)}
            for i in range(4):
                f = Flow("big", schema={"x": float})
                f.map(model_class(float(i)), names=["y"], batching=True)
                d = client.deploy(f)
                assert post(d, {"x": 1.0}).json()["rows"][0]["y"] == 1.0 + i
                wait_until(
                    f"redeploy {i}: one model per executor",
                    lambda: all(rss_mb(p) < mb + 1.6 * MODEL_BYTES / 2**20 for p, mb in cold.items()),
                )
            looked = Flow(unique("looked"))
            looked.lookup(column="k", name="v").map(lambda r: float(r.v.sum()), names=["s"])
            d_looked = client.deploy(looked)
            client.kvs.put("vec", np.ones(2))
            assert post(d_looked, {"k": "vec"}).status_code == 200

            server.kill()
            server.restart()  # empty: no persistence
            wait_until(
                "the gateway to re-publish its flows",
                lambda: registered(client, "big") == d.version and registered(client, looked.name) == d_looked.version,
            )
            e0.send_signal(signal.SIGKILL)
            e0.wait()
            procs.executor("e0")  # the pod restarts under its name, with a new address
            wait_until(
                "a restarted executor to serve the flows again",
                lambda: all(post(d, {"x": 1.0}).status_code == 200 for _ in range(6)),
                timeout=60,
            )
            assert post(d, {"x": 2.0}).json()["rows"][0]["y"] == 5.0
            r = post(d_looked, {"k": "vec"})
            assert r.status_code == 503 and r.json()["error"] == "StoreLostError", r.text

            client.undeploy("big")
            wait_until(
                "undeploy: the surviving executor back to its size", lambda: rss_mb(e1.pid) <= 1.10 * cold[e1.pid]
            )
        finally:
            client.close()
            procs.stop()
