"""Gateways that spawn nothing (the Kubernetes shape): executors register in the KVS,
gateways find them, several gateways serve the flows any one of them took.

Real processes throughout: the session's Redis server (flushed per test), executors started with
``python -m executors.worker.executor`` on TCP addresses, gateways with ``python -m
executors.hosts.standalone --membership kvs``, HTTP between them and the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from executors.hosts.cluster import ClusterClient
from executors.wire.membership import ALIVE_KEY, MEMBERS_KEY, Absence, Heartbeat, Member, live_members
from flow import Flow
from flow.table import Table
from kvs import KVS, RedisServer
from tests.executors.conftest import unique
from tests.executors.processes import ADMIN, Procs, health, steady_load, wait_until
from tests.flowgen import assert_same_rows


def scale(row):
    return row.x * 3.0


def flow_of(name: str) -> Flow:
    f = Flow(name, schema={"x": float})
    f.map(scale, names=["y"]).filter(lambda r: r.y >= 0)
    return f


def post(url: str, name: str, rows) -> httpx.Response:
    return httpx.post(f"{url}/flows/{name}", json=rows, timeout=30)


def test_gateways_find_executors_and_serve_every_deployed_flow(procs):
    procs.executor("e0")
    procs.executor("e1")
    a, b = procs.gateway("gw-a"), procs.gateway("gw-b")
    for url in (a, b):
        wait_until(f"{url} to find both executors", lambda url=url: health(url).get("executors") == 2)

    name = unique("members")
    flow = flow_of(name)
    client = ClusterClient(a, procs.redis_url, ADMIN)
    try:
        d = client.deploy(flow)
        rows = [{"x": float(i) - 2} for i in range(6)]
        answer = d.call(rows)
        assert_same_rows(answer.table, flow.run(Table.from_any(rows).with_qid(answer.input_qids)))
    finally:
        client.close()

    # the other gateway loads it from the registry, and answers the same
    wait_until("gateway b to serve the flow", lambda: name in health(b).get("flows", []))
    ra, rb = post(a, name, rows), post(b, name, rows)
    assert ra.status_code == rb.status_code == 200, (ra.text, rb.text)
    assert [r["y"] for r in ra.json()["rows"]] == [r["y"] for r in rb.json()["rows"]] == [0.0, 3.0, 6.0, 9.0]
    # each gateway gives out its own range of query ids
    assert ra.headers["x-qid-start"] != rb.headers["x-qid-start"]

    # undeploying through one gateway undeploys on every gateway
    r = httpx.delete(f"{b}/admin/flows/{name}", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200
    wait_until("gateway a to drop the flow", lambda: name not in health(a).get("flows", []))
    assert post(a, name, rows).status_code == 404


def test_executors_that_leave_or_die_are_dropped_and_joiners_get_work(procs):
    e0 = procs.executor("e0")
    e1 = procs.executor("e1")
    gw = procs.gateway("gw")
    wait_until("two executors", lambda: health(gw).get("executors") == 2)
    name = unique("churn")
    client = ClusterClient(gw, procs.redis_url, ADMIN)
    try:
        client.deploy(flow_of(name))
    finally:
        client.close()

    def hosts() -> set:
        stages = httpx.get(f"{gw}/flows/{name}").json()["stages"]
        return {e for s in stages for e in s["executors"]}

    assert hosts() == {"e0", "e1"}

    # a graceful stop leaves the membership at once
    e1.send_signal(signal.SIGTERM)
    wait_until("e1 to leave", lambda: health(gw).get("executors") == 1)
    assert hosts() == {"e0"}
    assert post(gw, name, {"x": 1.0}).json()["rows"][0]["y"] == 3.0

    # a newcomer is found, pinged, and given the flow's stages
    procs.executor("e2")
    wait_until("e2 to host the flow", lambda: hosts() == {"e0", "e2"})

    # kill -9: the registration expires, the gateway drops it, every request is answered
    answers = []
    e0.send_signal(signal.SIGKILL)
    e0.wait()
    deadline = time.monotonic() + 30
    while hosts() != {"e2"}:
        assert time.monotonic() < deadline, "the dead executor was never dropped"
        answers.append(post(gw, name, {"x": 2.0}))
    answers += [post(gw, name, {"x": 2.0}) for _ in range(5)]
    assert [r.status_code for r in answers] == [200] * len(answers), [r.text for r in answers if r.status_code != 200]
    assert {r.json()["rows"][0]["y"] for r in answers} == {6.0}


def test_heartbeat_registers_expires_and_deregisters(redis_server):
    store = KVS.from_url(redis_server.url)
    try:
        store.redis.flushall()
        beat = Heartbeat(store.redis, Member("hb0", "tcp://127.0.0.1:1", "gpu", 3), interval_s=0.1)
        beat.beat()
        assert live_members(store.redis) == {"hb0": Member("hb0", "tcp://127.0.0.1:1", "gpu", 3)}
        store.redis.delete(ALIVE_KEY.format(id="hb0"))  # as if it expired
        assert live_members(store.redis) == {}
        assert store.redis.hlen(MEMBERS_KEY) == 0  # expired descriptions are forgotten
        beat.start()
        wait_until("the heartbeat thread to register", lambda: "hb0" in live_members(store.redis))
        beat.stop()
        assert live_members(store.redis) == {}
    finally:
        store.close()


def test_absence_waits_out_the_grace_period():
    a = Absence(grace_s=1.0)
    assert a.gone({"x", "y"}, {"y"}, now=10.0) == []
    assert a.gone({"x", "y"}, {"y"}, now=10.5) == []
    assert a.gone({"x", "y"}, {"x", "y"}, now=10.8) == []  # came back: the clock restarts
    assert a.gone({"x", "y"}, {"y"}, now=11.0) == []
    assert a.gone({"x", "y"}, {"y"}, now=12.0) == ["x"]


@pytest.mark.parametrize(
    "cmd, env, message",
    [
        (
            ["executors.hosts.standalone", "--address", "tcp://127.0.0.1:1", "--kvs", "redis://127.0.0.1:1/0"],
            {},
            "FLOWSERVE_ADMIN_TOKEN",
        ),
        (["executors.hosts.standalone", "--address", "tcp://127.0.0.1:1"], {"FLOWSERVE_ADMIN_TOKEN": "t"}, "--kvs"),
        (
            [
                "executors.hosts.standalone",
                "--address",
                "tcp://127.0.0.1:1",
                "--kvs",
                "redis://x/0",
                "--autoscale",
                '{"nope": 1}',
            ],
            {"FLOWSERVE_ADMIN_TOKEN": "t"},
            "nope",
        ),
        (["executors.worker.executor", "--id", "e", "--address", "tcp://127.0.0.1:1"], {}, "--kvs"),
        (
            ["k8s.gateway", "--address", "tcp://127.0.0.1:1", "--kvs", "redis://x/0", "--scaler", "k8s"],
            {"FLOWSERVE_ADMIN_TOKEN": "t", "POD_NAMESPACE": ""},
            "--k8s-namespace",
        ),
        (
            ["executors.hosts.standalone", "--address", "tcp://127.0.0.1:1", "--kvs", "redis://x/0", "--scaler", "k8s"],
            {"FLOWSERVE_ADMIN_TOKEN": "t"},
            "--scaler",
        ),
    ],
)
def test_entry_points_refuse_incomplete_settings(cmd, env, message):
    clean = {k: v for k, v in os.environ.items() if k not in ("FLOWSERVE_ADMIN_TOKEN", "FLOWSERVE_KVS_URL")}
    r = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True, timeout=60, env=dict(clean, **env))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_a_gateway_started_before_the_kvs_waits_for_it(tmp_path):
    """In a cluster the gateway pod may come up before Redis: it waits, then serves."""
    from kvs.server import free_port

    port = free_port()
    procs = Procs(f"redis://127.0.0.1:{port}/0", tmp_path)
    try:
        gw = procs.gateway("early-gateway")
        procs.executor("late-e0")
        log = tmp_path / "early-gateway.log"
        wait_until("the gateway to wait for the KVS", lambda: log.exists() and "waiting for the KVS" in log.read_text())
        # neither can reach the KVS yet: the gateway does not answer, nothing crashed
        assert health(gw) == {}
        assert all(p.poll() is None for p in procs.procs)
        server = RedisServer(dir=tmp_path / "late-redis", port=port, appendonly=False)
        server.start()
        try:
            wait_until("the gateway to start and find the executor", lambda: health(gw).get("executors") == 1)
        finally:
            server.stop()
    finally:
        procs.stop()


def test_a_standalone_gateway_autoscales_the_hot_stage_across_registered_executors(procs):
    import json

    from tests.executors.test_autoscaling import busy, fast_policy

    policy = fast_policy()
    for i in range(3):
        procs.executor(f"as{i}")
    gw = procs.gateway("gw-autoscale", "--autoscale", json.dumps(policy.to_json()))
    wait_until("three executors", lambda: health(gw).get("executors") == 3)
    name = unique("hotcold")
    f = Flow(name)
    f.map(lambda r: r.x + 1, names=["x"]).map(busy, names=["y"])
    client = ClusterClient(gw, procs.redis_url, ADMIN)
    try:
        d = client.deploy(f, optimize=False)
    finally:
        client.close()
    cold, hot = list(d.plan.stages)

    def replicas() -> dict:
        return {s["name"]: s["replicas"] for s in httpx.get(f"{gw}/flows/{name}").json()["stages"]}

    assert replicas() == {cold: 1, hot: 1}
    with steady_load(f"{gw}/flows/{name}", {"x": 1}) as failures:
        wait_until("the hot stage to scale up", lambda: replicas()[hot] >= 2)
        assert replicas()[cold] == 1
    assert not failures, failures[:3]
    wait_until("the hot stage to scale back down", lambda: replicas()[hot] == 1)


def test_a_registry_read_older_than_a_local_deploy_or_undeploy_does_not_undo_it(redis_server, tmp_path):
    """The sync loop reads the registry while deploys run on the same gateway: a flow
    deployed (or undeployed) here after that read must not be dropped (or reloaded)."""
    import asyncio

    from executors.gateway.records import DeployedFlow
    from executors.hosts.cluster_config import ClusterConfig
    from executors.hosts.standalone import StandaloneGateway
    from optimizer import Plan

    gw = StandaloneGateway(ClusterConfig(), kvs_url=redis_server.url, address=f"ipc://{tmp_path}/gw", admin_token=ADMIN)
    f = Flow("raced")
    f.map(scale, names=["y"])
    flow = DeployedFlow(Plan.from_flow(f), 1, {})

    async def scenario():
        read_at = time.monotonic()  # the sync loop starts reading the registry ...
        gw.dispatcher.flows["raced"] = flow  # ... a deploy lands here meanwhile ...
        gw.gateway.deploys.changed_at["raced"] = time.monotonic()
        await gw.follower.changed({}, read_at)  # ... and the read did not list it yet
        assert gw.dispatcher.flows.get("raced") is flow
        await gw.follower.changed({}, time.monotonic())  # a later read without it: undeployed elsewhere
        assert "raced" not in gw.dispatcher.flows

        read_at = time.monotonic()  # an undeploy here after the read listed the flow:
        gw.gateway.deploys.changed_at["raced"] = time.monotonic()
        await gw.follower.changed({"raced": 1}, read_at)  # not reloaded (no load is attempted)
        assert "raced" not in gw.dispatcher.flows and not gw.follower._failed_loads

        # a read that starts after the deploy but before its registry write lands
        gw.dispatcher.flows["raced"] = flow
        reads = []
        await gw.gateway.deploys.record_change("raced", lambda: reads.append(time.monotonic()))
        await gw.follower.changed({}, reads[0])  # the read did not see the write yet
        assert gw.dispatcher.flows.get("raced") is flow

    try:
        asyncio.run(scenario())
    finally:
        gw.dispatcher.links.listener.close()  # never started: nothing else is open
        gw.store.close()


def slow_on_the_first_e0(row):
    import os
    import time

    if os.environ.get("FLOWSERVE_TEST_SLOW"):
        time.sleep(20.0)  # still running when the test kills this executor
    return row.x * 3.0


def test_an_executor_restarted_in_place_has_its_requests_rerun(procs):
    """The kubelet restarts a crashed container in the same pod: same name, same IP and port,
    and the new process registers before the old one's heartbeat has lapsed. The gateway
    must see the new incarnation and re-run what the old process held, not wait for the
    request's deadline (found on a real kubelet: tests/k8s/test_real_node.py)."""
    from kvs.server import free_port

    address = f"tcp://127.0.0.1:{free_port()}"

    def executor(**env):  # the heartbeat's key outlives the restart (5 s x 3)
        return procs._start(
            "e0",
            [
                sys.executable,
                "-m",
                "executors.worker.executor",
                "--id",
                "e0",
                "--address",
                address,
                "--threads",
                "2",
                "--heartbeat-s",
                "5",
            ],
            env={"FLOWSERVE_KVS_URL": procs.redis_url, **env},
        )

    e0 = executor(FLOWSERVE_TEST_SLOW="1")
    gw = procs.gateway("gw")
    wait_until("the gateway to find e0", lambda: health(gw).get("executors") == 1)
    client = ClusterClient(gw, procs.redis_url, ADMIN)
    try:
        f = Flow(unique("slow"), schema={"x": float})
        f.map(slow_on_the_first_e0, names=["y"])
        d = client.deploy(f)
        answer = {}

        def call():
            answer["r"] = httpx.post(d.url, json={"x": 2.0}, headers={"X-Request-Timeout": "25"}, timeout=30)

        caller = threading.Thread(target=call)
        caller.start()
        wait_until("the request in flight on e0", lambda: health(gw).get("inflight") == 1)
        procs.executor("e1")  # where the re-run can go once e1 hosts the stage too
        wait_until(
            "e1 to host the stage",
            lambda: "e1" in {e for st in httpx.get(f"{gw}/flows/{f.name}").json()["stages"] for e in st["executors"]},
        )
        e0.send_signal(signal.SIGKILL)
        e0.wait()
        executor()  # the same id and address: a new process only
        caller.join(timeout=40)
        r = answer["r"]
        # without the re-run: 504 at the request's deadline (the heartbeat never lapses)
        assert r.status_code == 200 and r.json()["rows"][0]["y"] == 6.0, r.text
    finally:
        client.close()
