"""The Lease that elects the gateway replica running the control loop (k8s/leadership.py),
against the real API server v1.20.2, with what a gateway pod gets: the ServiceAccount
``flowserve``'s token under the Role the manifests render with autoscaling (applied by the
documented non-admin deployer).

* two replicas' leases: one holds it, the other takes it only once the holder stopped
  renewing for ``leaseDurationSeconds`` as it observed, or at once when the holder gives it
  up; the store's fencing counter refuses the old term;
* the Role allows this Lease and nothing more of its kind;
* gateway processes (``python -m k8s.gateway --leader-election k8s``, started as its
  pods start it) under load: one leads; kill -9 it and another takes the Lease within
  seconds, the others answer throughout, and the decision log holds one leader at a time.

There is no kubelet here: the processes run beside the API server (tests/k8s/conftest.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import sys
import time
from urllib.parse import quote

import httpx
import pytest
import redis

from executors.hosts.autoscale import AutoscalingConfig
from executors.hosts.cluster import ClusterClient
from executors.hosts.leadership import Fence
from executors.hosts.scaling_board import ScalingBoard
from flow import Flow
from flow.errors import AccessDeniedError
from k8s import KubeConfig
from kvs import RedisServer
from kvs.server import free_port
from tests.executors.processes import Procs, wait_until
from tests.k8s import realcluster as rc
from tests.k8s.test_real_backend import IMAGE, cluster_as

pytest.importorskip("kubernetes.client")
import kubernetes.client as client  # noqa: E402

from k8s.leadership import KubeLease  # noqa: E402

LEASE = "flowserve-leader"


def policy() -> AutoscalingConfig:
    """One replica at a time, a step every 1.5 s at most: a load step takes a few decisions."""
    return AutoscalingConfig(
        min_replicas=1,
        max_replicas=3,
        max_step_up=1.0,
        upscale_delay_s=0.5,
        upscale_cooldown_s=1.5,
        downscale_delay_s=2.0,
        downscale_cooldown_s=1.0,
        smoothing_window_s=0.5,
    )


@pytest.fixture
def instance(control_plane, k8s_namespace):
    """An autoscaled instance with three gateway replicas, applied by the deployer; the
    ServiceAccount token its gateway pods get."""
    cfg = KubeConfig(
        namespace=k8s_namespace,
        image=IMAGE,
        kvs_storage=None,
        cpu_executors=0,
        gateway_replicas=3,
        autoscaling=policy(),
    )
    deployer = cluster_as(control_plane, "developer", cfg)
    deployer.ensure_secrets()
    deployer.apply()
    core = client.CoreV1Api(control_plane.api_client("admin"))
    secret = rc.wait_for(
        "the ServiceAccount's token",
        lambda: next(iter(core.read_namespaced_service_account("flowserve", k8s_namespace).secrets or []), None),
        timeout=30,
    ).name
    token = base64.b64decode(core.read_namespaced_secret(secret, k8s_namespace).data["token"]).decode()
    return deployer, token


@pytest.fixture
def in_a_pod(control_plane, instance, monkeypatch, tmp_path):
    """What a gateway pod sees: its ServiceAccount's token and the cluster CA at the
    in-cluster paths, KUBERNETES_SERVICE_HOST/PORT pointing at the API server."""
    import kubernetes.config.incluster_config as incluster

    (tmp_path / "token").write_text(instance[1])
    monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", control_plane.env["K8S_CA"])
    host, port = control_plane.url.removeprefix("https://").split(":")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    return instance[0].namespace


def test_a_replica_takes_the_lease_only_when_the_holder_stopped_renewing_or_gave_it_up(control_plane, in_a_pod, kvs):
    ns = in_a_pod
    fence = Fence(kvs.redis)
    a = KubeLease.from_incluster(ns, LEASE, "gw-a", fence, lease_s=1.0)
    b = KubeLease.from_incluster(ns, LEASE, "gw-b", fence, lease_s=1.0)
    sent = time.monotonic()
    a.step()  # creates the Lease
    assert a.fence() == 1
    b.step()
    assert b.fence() is None and b.holder == "gw-a"
    a.step()  # a renews
    assert a.fence() == 1

    # a stops renewing (its pod died): b takes it once the record stood still for its duration
    def b_took_it():
        b.step()
        return b.fence()

    assert wait_until("b to take the Lease", b_took_it, timeout=30) == 2
    assert time.monotonic() - sent >= 1.0
    assert a.fence() is None and fence.admits(2) and not fence.admits(1)
    assert a.try_renew(1) is None and a.holder == "gw-b"  # a learns it lost the Lease
    lease = client.CoordinationV1Api(control_plane.api_client("admin")).read_namespaced_lease(LEASE, ns)
    assert (lease.spec.holder_identity, lease.spec.lease_transitions, lease.spec.lease_duration_seconds) == (
        "gw-b",
        1,
        1,
    )

    # b gives it up (a graceful stop): a takes it at its next try, without waiting
    asyncio.run(b.resign())
    a.step()
    assert a.fence() == 3


def test_the_rendered_role_allows_this_lease_and_no_other(control_plane, in_a_pod, kvs):
    ns = in_a_pod
    mine = KubeLease.from_incluster(ns, LEASE, "gw-a", Fence(kvs.redis), lease_s=1.0)
    mine.step()
    assert mine.fence() is not None
    api = mine.api
    other = KubeLease(api, ns, "someone-elses-lease", "gw-a", Fence(kvs.redis), lease_s=1.0)
    client.CoordinationV1Api(control_plane.api_client("admin")).create_namespaced_lease(
        ns, {"metadata": {"name": "someone-elses-lease"}, "spec": {"holderIdentity": "x"}}
    )
    with pytest.raises(AccessDeniedError, match="get Lease .*/someone-elses-lease failed: 403"):
        other.step()
    with pytest.raises(client.exceptions.ApiException) as e:
        api.delete_namespaced_lease(LEASE, ns)
    assert e.value.status == 403


def double_slowly(row):
    import time

    time.sleep(0.02)  # the hot stage: 20 ms a request, whatever the CPU
    return row.x * 2


def test_gateway_processes_elect_one_leader_and_another_takes_over_when_it_is_killed(control_plane, instance, tmp_path):
    deployer, token = instance
    ns = deployer.namespace
    password = deployer.read_secret("flowserve-redis", "password")
    admin = deployer.read_secret("flowserve-admin", "token")
    key = deployer.read_secret("flowserve-cluster-key", "key")
    (tmp_path / "token").write_text(token)
    host, port = control_plane.url.removeprefix("https://").split(":")
    store = RedisServer(dir=tmp_path / "redis", appendonly=False, password=password)
    store.start()
    kvs_url = f"redis://:{quote(password, safe='')}@127.0.0.1:{store.port}/0"
    procs = Procs(kvs_url, tmp_path, admin_token=admin, env={"FLOWSERVE_CLUSTER_KEY": key})
    gateways: dict[str, tuple] = {}  # url -> (process, port)
    try:
        for i in range(3):
            procs.executor(f"executor-{i}")
        for i in range(3):
            http_port = free_port()
            proc = procs._start(
                f"gateway-{i}",
                [
                    sys.executable,
                    "-m",
                    "tests.k8s.incluster_gateway",
                    "--port",
                    str(http_port),
                    "--address",
                    f"tcp://127.0.0.1:{free_port()}",
                    "--poll-s",
                    "0.1",
                    "--autoscale",
                    json.dumps(policy().to_json(), separators=(",", ":")),
                    "--leader-election",
                    "k8s",
                    "--k8s-namespace",
                    ns,
                    "--k8s-instance",
                    "flowserve",
                ],
                env={
                    "FLOWSERVE_ADMIN_TOKEN": admin,
                    "FLOWSERVE_KVS_URL": kvs_url,
                    "TEST_SA_TOKEN_FILE": str(tmp_path / "token"),
                    "TEST_SA_CA_FILE": control_plane.env["K8S_CA"],
                    "KUBERNETES_SERVICE_HOST": host,
                    "KUBERNETES_SERVICE_PORT": port,
                },
            )
            gateways[f"http://127.0.0.1:{http_port}"] = (proc, http_port)
        urls = list(gateways)
        for url in urls:
            wait_until(f"{url} to see 3 executors", lambda u=url: _executors(u) == 3, timeout=60)
        board = ScalingBoard(redis.Redis.from_url(kvs_url))
        f = Flow("k8s-hotspot", schema={"x": int})
        f.map(double_slowly, names=["y"])
        cc = ClusterClient(urls[0], kvs_url, admin, cluster_key=key)
        d = cc.deploy(f, optimize=False)
        for url in urls:
            wait_until(f"{url} to serve the flow", lambda u=url: _answers(u), timeout=60)
        leases = client.CoordinationV1Api(control_plane.api_client("admin"))

        def holder():
            return leases.read_namespaced_lease(LEASE, ns).spec.holder_identity

        leader_url = wait_until("a leader", lambda: _leader(urls), timeout=30)

        def decisions():
            return [x for x in board.decisions() if x["flow"] == d.name]

        loads = {url: rc.Load(f"{url}/flows/{d.name}", concurrency=2).start() for url in urls}
        summaries: dict = {}
        try:
            wait_until("a first scale-up", lambda: any(x["to"] > 1 for x in decisions()), timeout=60)
            old = holder()
            first_token = decisions()[-1]["token"]
            killed_at = time.monotonic()
            gateways[leader_url][0].send_signal(signal.SIGKILL)
            # its own clients: no Service here to send them elsewhere (on Kubernetes it does)
            summaries = {leader_url: loads.pop(leader_url).stop()}
            new = wait_until("another replica to take the Lease", lambda: (h := holder()) != old and h, timeout=30)
            takeover_s = time.monotonic() - killed_at
            wait_until(
                "a decision by the new leader",
                lambda: any(x["token"] != first_token for x in decisions()),
                timeout=60,
            )
            acted_s = time.monotonic() - killed_at
        finally:
            summaries = {**summaries, **{url: load.stop() for url, load in loads.items()}}
        print(f"takeover {takeover_s:.2f} s by {new}, its first decision {acted_s:.2f} s after the kill; {summaries}")
        assert takeover_s < 10
        for url, s in summaries.items():
            assert s["wrong"] == 0 and s["duplicated"] == 0 and s["repeated_qids"] == 0, (url, s)
            if url != leader_url:  # the other replicas' clients were not affected at all
                assert s["lost"] == 0, (url, s)
            else:  # the killed one's lost what they had in flight there
                assert s["lost"] <= 4, s
        tokens = [x["token"] for x in decisions()]
        assert tokens == sorted(tokens) and len(set(tokens)) == 2, tokens
        for before, after in zip(decisions(), decisions()[1:]):
            assert after["from"] == len(before["replicas"]), (before, after)
        cc.close()
    finally:
        procs.stop()
        store.stop()


def _executors(url: str) -> int:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).json().get("executors", 0)
    except (httpx.HTTPError, ValueError):
        return 0


def _answers(url: str) -> bool:
    try:
        return httpx.post(f"{url}/flows/k8s-hotspot", json={"x": 1}, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _leader(urls: list[str]) -> str | None:
    for url in urls:
        try:
            if (httpx.get(f"{url}/healthz", timeout=2).json().get("control") or {}).get("leader"):
                return url
        except (httpx.HTTPError, ValueError):
            continue
    return None
