"""The autoscaler's backend (k8s.scaling) against the real API server, with the credentials
the gateway pod gets: the ServiceAccount ``flowserve``'s token under the rendered Role.
The ReplicaSet controller creates and removes the pods; the fakelet makes them Ready."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass

import pytest

from executors.hosts.autoscale import AutoscalingConfig
from flow.errors import AccessDeniedError
from k8s import KubeConfig
from tests.k8s import realcluster as rc
from tests.k8s.test_real_backend import IMAGE, cluster_as

pytest.importorskip("kubernetes.client")
import kubernetes.client as client  # noqa: E402

from k8s.backend import DELETION_COST  # noqa: E402
from k8s.scaling import REMOVE_COST, KubernetesExecutors  # noqa: E402


@dataclass
class Info:
    id: str
    device: str
    alive: bool = True


class PodDispatcher:
    """Stands in for the gateway's dispatcher (the runtime's part, tested on its own in
    tests/executors): an executor "registers" when its pod is Ready on the API server."""

    def __init__(self, core, namespace: str):
        self.core, self.namespace = core, namespace
        self.executors = {p: Info(p, d) for d in ("cpu", "gpu") for p in self.ready_pods(d)}

    def ready_pods(self, device: str) -> list[str]:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"app.kubernetes.io/component=executor-{device}"
        ).items
        ready = [p for p in pods if p.metadata.deletion_timestamp is None and p.status.phase == "Running"]
        return [p.metadata.name for p in sorted(ready, key=lambda p: p.metadata.creation_timestamp)]

    async def wait_for_executor(self, device: str, known: set[str], timeout: float) -> str | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            new = [p for p in await loop.run_in_executor(None, self.ready_pods, device) if p not in known]
            if new:
                self.executors[new[0]] = Info(new[0], device)
                return new[0]
            await asyncio.sleep(0.05)  # a bounded poll of the API server's state
        return None


@pytest.fixture
def incluster_as_service_account(control_plane, monkeypatch, tmp_path):
    """What a pod of the ServiceAccount ``flowserve`` sees: its token and the cluster CA at the
    in-cluster paths, KUBERNETES_SERVICE_HOST/PORT pointing at the API server."""
    import kubernetes.config.incluster_config as incluster

    def use(namespace: str, sa: str = "flowserve"):
        core = client.CoreV1Api(control_plane.api_client("admin"))
        name = rc.wait_for(
            f"the token of ServiceAccount {namespace}/{sa}",
            lambda: next(iter(core.read_namespaced_service_account(sa, namespace).secrets or []), None),
            timeout=30,
        ).name
        token = base64.b64decode(core.read_namespaced_secret(name, namespace).data["token"])
        (tmp_path / "token").write_bytes(token)
        monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
        monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", control_plane.env["K8S_CA"])
        host, port = control_plane.url.removeprefix("https://").split(":")
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)

    return use


def test_the_autoscaler_adds_and_removes_executors_under_its_role(
    control_plane, k8s_namespace, incluster_as_service_account
):
    cfg = KubeConfig(
        namespace=k8s_namespace,
        image=IMAGE,
        kvs_storage=None,
        cpu_executors=2,
        gpu_executors=1,
        autoscaling=AutoscalingConfig(max_replicas=6),
    )
    deployer = cluster_as(control_plane, "developer", cfg)
    deployer.ensure_secrets()
    deployer.apply()
    deployer.wait_ready(wait_s=60)
    incluster_as_service_account(k8s_namespace)
    core = client.CoreV1Api(control_plane.api_client("admin"))
    dispatcher = PodDispatcher(core, k8s_namespace)
    baseline_pods = dispatcher.ready_pods("cpu")
    assert len(baseline_pods) == 2

    backend = KubernetesExecutors.from_incluster(k8s_namespace, "flowserve", dispatcher, wait_s=30)
    assert backend.baseline == {"cpu": 2, "gpu": 1}  # read by the ServiceAccount from the annotations
    new = asyncio.run(backend.add_executor("cpu"))
    assert new is not None and new not in baseline_pods
    assert backend.cluster.replicas("executor-cpu") == 3
    assert backend.removable() == [new]

    asyncio.run(backend.remove_executor(new))
    assert backend.cluster.replicas("executor-cpu") == 2
    rc.wait_for("two executor pods again", lambda: len(dispatcher.ready_pods("cpu")) == 2, timeout=30)
    # the drained pod carries the lowest deletion cost. v1.20's ReplicaSet ignores that
    # annotation (honoured from 1.22): here it removed whichever pod it ranked first, which
    # was a baseline pod in our runs; if the drained pod is still there, it carries the cost
    left = dispatcher.ready_pods("cpu")
    if new in left:
        pod = core.read_namespaced_pod(new, k8s_namespace)
        assert pod.metadata.annotations[DELETION_COST] == str(REMOVE_COST)
    backend.cluster.set_deletion_cost(left[0], REMOVE_COST)  # the ServiceAccount may annotate pods
    assert core.read_namespaced_pod(left[0], k8s_namespace).metadata.annotations[DELETION_COST] == "-1000"

    # and nothing more: the Role is least privilege
    for what, call, verb in [
        ("scale the gateway", lambda: backend.cluster.scale("gateway", 3), "patch"),
        ("read a Secret", lambda: backend.cluster.read_secret("flowserve-redis", "password"), "read"),
        ("list the workloads", backend.cluster.status, "list"),
        ("apply", backend.cluster.apply, "read"),
    ]:
        with pytest.raises(AccessDeniedError) as e:
            call()
        assert e.value.verb == verb, what
        assert f'User "system:serviceaccount:{k8s_namespace}:flowserve" cannot' in str(e.value), what
