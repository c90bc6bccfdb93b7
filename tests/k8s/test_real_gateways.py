"""Opt-in (FLOWSERVE_K8S_REAL_NODE=1, root): several gateway pods of one autoscaled
instance on a real kubelet (tests/k8s/test_real_node.py has the node), one control loop
among them through the Lease ``flowserve-leader`` (k8s/leadership.py).

Three gateway pods serve under continuous load; the autoscaler of the one holding the
Lease scales the executor Deployment; that gateway's container is SIGKILLed: the clients
of the other pods lose nothing, another pod takes the Lease within seconds and its
autoscaler carries on, and the scale actions (the decision log in the store, the
Deployment's replicas) come from one leader at a time. There is no kube-proxy here, so
each pod is loaded at its IP rather than through the Service.
"""

from __future__ import annotations

import time

import httpx
import pytest
import redis

from flow import Flow
from tests.k8s import realcluster as rc

pytestmark = pytest.mark.skipif(rc.real_node_unavailable() is not None, reason=str(rc.real_node_unavailable()))
client = pytest.importorskip("kubernetes.client")
from executors.hosts.autoscale import AutoscalingConfig  # noqa: E402
from executors.hosts.scaling_board import ScalingBoard  # noqa: E402
from tests.k8s.test_real_node import applied, namespace  # noqa: E402

LEASE = "flowserve-leader"


node = rc.real_node_fixture("k8s-real-gateways")


def busy_double(row):
    import time

    time.sleep(0.02)  # the hot stage: 20 ms a request, whatever the CPU
    return row.x * 2


def policy() -> AutoscalingConfig:
    """One replica at a time, a step every 1.5 s at most."""
    return AutoscalingConfig(
        min_replicas=1,
        max_replicas=3,
        max_step_up=1.0,
        upscale_delay_s=0.5,
        upscale_cooldown_s=1.5,
        downscale_delay_s=30.0,
        smoothing_window_s=0.5,
    )


def _control(url: str) -> dict:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).json().get("control") or {}
    except (httpx.HTTPError, ValueError):
        return {}


def test_the_leader_gateway_pod_killed_under_load_another_takes_the_lease_and_nothing_is_doubled(node):
    core, ns = namespace(node, "gateways")
    admin = node.cp.api_client("admin")
    cluster, cfg = applied(node, ns, cpu_executors=1, gateway_replicas=3, autoscaling=policy())
    try:
        cluster.wait_ready(wait_s=300)
        gateways = rc.wait_for(
            "three gateway pods", lambda: (p := rc.pod_ips(core, ns, "gateway")) and len(p) == 3 and p
        )
        urls = {name: f"http://{ip}:{cfg.gateway_port}" for name, ip in gateways.items()}
        (kvs_ip,) = rc.pod_ips(core, ns, "kvs").values()
        password = cluster.read_secret(cfg.redis_secret_name, "password")
        store = redis.Redis(host=kvs_ip, port=cfg.redis_port, password=password)
        board = ScalingBoard(store)
        flow = Flow("hot", schema={"x": int})
        flow.map(busy_double, names=["y"])
        first_url = next(iter(urls.values()))
        cluster.deploy(flow, gateway_url=first_url, kvs_url=f"redis://{kvs_ip}:{cfg.redis_port}/0", wait_s=120)
        for name, url in urls.items():
            rc.wait_for(f"gateway pod {name} to serve the flow", lambda u=url: rc.serves(f"{u}/flows/hot"), timeout=60)
        leader = rc.wait_for(
            "a leader", lambda: next((n for n, u in urls.items() if _control(u).get("leader")), None), timeout=30
        )
        leases = client.CoordinationV1Api(admin)
        apps = client.AppsV1Api(admin)

        def holder() -> str | None:
            return leases.read_namespaced_lease(LEASE, ns).spec.holder_identity

        def decisions() -> list[dict]:
            return [x for x in board.decisions() if x["flow"] == "hot"]

        loads = {name: rc.Load(f"{url}/flows/hot", concurrency=2).start() for name, url in urls.items()}
        summaries: dict = {}
        try:
            rc.wait_for("a first scale-up", lambda: any(x["to"] > 1 for x in decisions()), timeout=240, every=0.2)
            old, first_token = holder(), decisions()[-1]["token"]
            assert old.startswith(f"gateway-{leader}-"), (old, leader)  # the pod /healthz named
            killed_at = time.monotonic()
            node.kill_container(core.read_namespaced_pod(leader, ns), "gateway")
            # its own clients, from the pod's IP: no Service here to send them to the others
            # (on Kubernetes the endpoints drop the pod once its readiness probe fails)
            summaries = {leader: loads.pop(leader).stop()}
            new = rc.wait_for("another pod to take the Lease", lambda: (h := holder()) != old and h, timeout=30)
            takeover_s = time.monotonic() - killed_at
            rc.wait_for(
                "a decision by the new leader",
                lambda: any(x["token"] != first_token for x in decisions()),
                timeout=180,
                every=0.2,
            )
            acted_s = time.monotonic() - killed_at
        finally:
            summaries = {**summaries, **{name: load.stop() for name, load in loads.items()}}
        print(f"takeover {takeover_s:.2f} s by {new}, its first decision {acted_s:.2f} s after the kill; {summaries}")
        assert takeover_s < 10
        for name, s in summaries.items():
            assert s["wrong"] == 0 and s["duplicated"] == 0 and s["repeated_qids"] == 0, (name, s)
            if name != leader:  # the other pods' clients: not affected at all
                assert s["lost"] == 0, (name, s)
            else:  # the killed pod's clients lost what they had in flight there; the ones they
                # sent before they were stopped met a refused connection (nothing sent, not lost)
                assert s["lost"] - s["unsent"] <= 4, s
        log = decisions()
        tokens = [x["token"] for x in log]
        assert tokens == sorted(tokens) and len(set(tokens)) == 2, tokens
        for before, after in zip(log, log[1:]):  # each decision from the replicas the one before left
            assert after["from"] == len(before["replicas"]), (before, after)
        # the Deployment holds the executors the decisions asked for, not one more: an add
        # made twice (two leaders deciding the same step) would leave an extra pod
        want = max(len(x["replicas"]) for x in log)
        assert apps.read_namespaced_deployment_scale("flowserve-executor-cpu", ns).spec.replicas <= want
    finally:
        cluster.close()
        cluster.delete()
