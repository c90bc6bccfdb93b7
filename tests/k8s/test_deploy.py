"""KubernetesCluster.deploy: Secrets, apply, wait for the rollout, then the runtime's client.

The Kubernetes side runs on the client's real typed APIs with the recorder as transport
(as in test_backend.py). The runtime's ``ClusterClient`` is not under test here: the
cluster builds it in one method, ``_cluster_client``, which these tests override to record
what it is given and what it is asked to deploy.
"""

from __future__ import annotations

import base64

import pytest

from flow import Flow
from flow.exceptions import RetryableError
from k8s import KubeConfig, render
from k8s.exceptions import K8sConfigError, K8sNotReadyError, K8sUnreachableError
from k8s.manifests import A_FLOWS
from tests.k8s.conftest import net, pre

client = pytest.importorskip("kubernetes.client")
from k8s.backend import KubernetesCluster  # noqa: E402 - needs the client
from tests.k8s.recorders import WireRecorder, recorded_cluster  # noqa: E402

NS = "flowserve"
APPS = f"/apis/apps/v1/namespaces/{NS}"
CORE = f"/api/v1/namespaces/{NS}"
PASSWORD = "p@ss/word"  # not URL-safe on purpose: the URL must quote it
ADMIN = "admin-t0ken"


class StubClient:
    """Stands in for executors.cluster.ClusterClient: records its arguments and deploys."""

    def __init__(self, wire: WireRecorder, **kwargs):
        self.kwargs = kwargs
        self.requests_before = len(wire.requests)  # how far the Kubernetes side had got
        self.deploys = []
        self.closed = False
        self.error = None

    def deploy(self, flow, *, optimize=True, rules=None, options=None):
        if self.error is not None:
            raise self.error
        self.deploys.append((flow, optimize, rules, options))
        return ("Deployment", flow.name)

    def close(self):
        self.closed = True


class RecordingCluster(KubernetesCluster):
    poll_s = 0.001

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.made: list[StubClient] = []
        self.wire = None

    def _cluster_client(self, url, kvs_url, admin_token, token):
        c = StubClient(self.wire, url=url, kvs_url=kvs_url, admin_token=admin_token, token=token)
        self.made.append(c)
        return c


def _b64(v: str) -> str:
    return base64.b64encode(v.encode()).decode()


def _secret(name: str, key: str, value: str) -> dict:
    return {"kind": "Secret", "apiVersion": "v1", "metadata": {"name": name, "namespace": NS},
            "data": {key: _b64(value)}}


class Workloads:
    """Answers the workload lists from what was applied; ``ready_after`` list calls each."""

    def __init__(self, ready_after: int = 0, never: tuple[str, ...] = ()):
        self.ready_after, self.never = ready_after, never
        self.lists = 0

    def reply(self, wire: WireRecorder, kind: str):
        def answer(req):
            self.lists += 1
            posted = [r.body for r in wire.calls("POST") if r.body.get("kind") == kind]
            return {"kind": f"{kind}List", "apiVersion": "apps/v1", "metadata": {},
                    "items": [self._with_status(m) for m in posted]}
        return answer

    def _with_status(self, m: dict) -> dict:
        n = m["spec"]["replicas"]
        ready = self.lists > self.ready_after and m["metadata"]["labels"]["app.kubernetes.io/component"] \
            not in self.never
        k = n if ready else 0
        return dict(m, metadata=dict(m["metadata"], generation=1),
                    status={"observedGeneration": 1, "replicas": n, "updatedReplicas": k, "readyReplicas": k,
                            "availableReplicas": k})


def deploying(config: KubeConfig | None = None, workloads: Workloads | None = None, token: str | None = None,
              cls=None):
    config = config or KubeConfig()
    wire = (WireRecorder()
            .reply("GET", f"{CORE}/secrets/{config.redis_secret_name}", 200,
                   _secret(config.redis_secret_name, "password", PASSWORD))
            .reply("GET", f"{CORE}/secrets/{config.admin_secret_name}", 200,
                   _secret(config.admin_secret_name, "token", ADMIN)))
    if token is not None:
        wire.reply("GET", f"{CORE}/secrets/{config.token_secret}", 200, _secret(config.token_secret, "token", token))
    workloads = workloads or Workloads()
    wire.reply("GET", f"{APPS}/deployments", 200, workloads.reply(wire, "Deployment"))
    wire.reply("GET", f"{APPS}/statefulsets", 200, workloads.reply(wire, "StatefulSet"))
    cluster, wire, apis = recorded_cluster(config, wire, cls=cls or RecordingCluster)
    cluster.wire = wire
    return cluster, wire


@pytest.fixture
def cpu_flow():
    f = Flow("scorer", schema={"raw": float})
    f.map(pre, names=["x"])
    return f


@pytest.fixture
def gpu_flow():
    f = Flow("ensemble", schema={"raw": float})
    f.map(pre, names=["x"]).map(net, names=["y"], batching=True, gpu=True)
    return f


def test_deploy_applies_waits_then_deploys_through_the_runtime_client(cpu_flow):
    cluster, wire = deploying(workloads=Workloads(ready_after=2))
    result = cluster.deploy(cpu_flow, rules=None, options=None)

    assert result == ("Deployment", "scorer")
    (made,) = cluster.made
    assert made.kwargs == {
        "url": "http://flowserve-gateway.flowserve.svc.cluster.local:80",
        "kvs_url": "redis://:p%40ss%2Fword@flowserve-kvs.flowserve.svc.cluster.local:6379/0",
        "admin_token": ADMIN, "token": None}
    assert made.deploys == [(cpu_flow, True, None, None)]
    # the order on the wire: Secrets, then every object, then status polls, then the client
    seq = [(r.method, r.path) for r in wire.requests]
    assert seq[:2] == [("GET", f"{CORE}/secrets/flowserve-redis"), ("GET", f"{CORE}/secrets/flowserve-admin")]
    posts = [i for i, (m, _) in enumerate(seq) if m == "POST"]
    assert [wire.requests[i].body["metadata"]["name"] for i in posts] == [
        m["metadata"]["name"] for m in render(KubeConfig())]
    polls = [i for i, (m, p) in enumerate(seq) if (m, p) == ("GET", f"{APPS}/deployments")]
    assert len(polls) == 2 and min(polls) > max(posts)  # not ready at first: polled again
    assert made.requests_before == len(wire.requests)  # nothing sent after the client was built
    reads = seq[max(polls) + 1:]
    assert ("GET", f"{CORE}/secrets/flowserve-admin") in reads and ("GET", f"{CORE}/secrets/flowserve-redis") in reads


def test_deploy_renders_for_the_plan_and_waits_for_the_gpu_executors(gpu_flow):
    cluster, wire = deploying(workloads=Workloads(never=("executor-gpu",)))
    with pytest.raises(K8sNotReadyError) as info:
        cluster.deploy(gpu_flow, wait_s=0.05)
    msg = str(info.value)
    assert msg.startswith("flowserve in namespace flowserve not ready after 0.05 s: executor-gpu: 0/1 ready, "
                          "0 updated (see kubectl -n flowserve get pods -l app.kubernetes.io/name=flowserve,"
                          "app.kubernetes.io/instance=flowserve")
    assert "gateway" not in msg.split("(see")[0]  # only what is short is named
    gpu = [r.body for r in wire.calls("POST") if r.body["metadata"]["name"] == "flowserve-executor-gpu"]
    assert gpu and gpu[0]["metadata"]["annotations"]["flowserve.io/gpu-stages"] == "ensemble/net"
    assert cluster.made == []  # never deployed to a cluster that is not ready


def test_a_workload_that_does_not_exist_is_named_when_waiting(cpu_flow):
    cluster, wire = deploying()
    wire.reply("GET", f"{APPS}/statefulsets", 200, {"kind": "StatefulSetList", "apiVersion": "apps/v1",
                                                     "metadata": {}, "items": []})
    with pytest.raises(K8sNotReadyError, match=r"not ready after 0 s: kvs: not found \(see"):
        cluster.deploy(cpu_flow, wait_s=0)


def test_deploy_without_optimizing_and_with_options(cpu_flow):
    from optimizer import OptimizerOptions

    options = OptimizerOptions()
    cluster, _ = deploying()
    cluster.deploy(cpu_flow, optimize=False, options=options)
    assert cluster.made[0].deploys == [(cpu_flow, False, None, options)]


def test_addresses_from_the_call_or_the_config_get_the_password_from_the_secret(cpu_flow):
    cluster, _ = deploying()
    cluster.deploy(cpu_flow, gateway_url="http://localhost:8080/", kvs_url="redis://localhost:6379/0")
    assert (cluster.made[0].kwargs["url"], cluster.made[0].kwargs["kvs_url"]) == (
        "http://localhost:8080", "redis://:p%40ss%2Fword@localhost:6379/0")

    cfg = KubeConfig(gateway_url="https://gw.example.com", kvs_url="rediss://default@kvs.example.com:6380/1")
    cluster, _ = deploying(cfg)
    cluster.deploy(cpu_flow)
    assert (cluster.made[0].kwargs["url"], cluster.made[0].kwargs["kvs_url"]) == (
        "https://gw.example.com", "rediss://default:p%40ss%2Fword@kvs.example.com:6380/1")


def test_a_kvs_url_with_a_password_is_used_as_given(cpu_flow):
    cluster, wire = deploying()
    cluster.deploy(cpu_flow, kvs_url="redis://:other@localhost:6379/0")
    assert cluster.made[0].kwargs["kvs_url"] == "redis://:other@localhost:6379/0"
    # the redis Secret was read once, by ensure_secrets, and not for the URL
    assert len(wire.calls("GET", f"{CORE}/secrets/flowserve-redis")) == 1


def test_the_public_token_is_passed_when_the_gateway_requires_one(cpu_flow):
    cluster, _ = deploying(KubeConfig(token_secret="api-token"), token="public-t0ken")
    cluster.deploy(cpu_flow)
    assert cluster.made[0].kwargs["token"] == "public-t0ken"


def test_deploying_again_reuses_the_client_and_renders_for_every_flow(cpu_flow, gpu_flow):
    cluster, wire = deploying()
    cluster.deploy(gpu_flow)
    first = len(wire.requests)
    cluster.deploy(cpu_flow)
    assert len(cluster.made) == 1 and [d[0].name for d in cluster.made[0].deploys] == ["ensemble", "scorer"]
    second = [r.body for r in wire.requests[first:] if r.method in ("POST", "PUT")]
    cpu = [m for m in second if m["metadata"]["name"] == "flowserve-executor-cpu"]
    assert cpu[0]["metadata"]["annotations"][A_FLOWS] == "ensemble,scorer"
    # the GPU executors the first flow needs are still rendered (and waited for)
    assert "flowserve-executor-gpu" in {m["metadata"]["name"] for m in second}
    cluster.close()
    assert cluster.made[0].closed is True


def test_an_unreachable_gateway_says_how_to_reach_it_from_outside(cpu_flow):
    import httpx

    class Unreachable(RecordingCluster):
        def _cluster_client(self, *args):
            c = super()._cluster_client(*args)
            c.error = httpx.ConnectError("[Errno -2] Name or service not known")
            return c

    cluster, _ = deploying(cls=Unreachable)
    with pytest.raises(K8sUnreachableError) as info:
        cluster.deploy(cpu_flow)
    msg = str(info.value)
    assert "gateway http://flowserve-gateway.flowserve.svc.cluster.local:80 or KVS redis://:***@flowserve-kvs" in msg
    assert "kubectl -n flowserve port-forward svc/flowserve-gateway 8080:80" in msg
    assert "kubectl -n flowserve port-forward svc/flowserve-kvs 6379" in msg
    assert "gateway_url='http://localhost:8080'" in msg
    assert PASSWORD not in msg and "p%40ss" not in msg
    assert isinstance(info.value, RetryableError)
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_other_runtime_errors_pass_through(cpu_flow):
    from executors.errors import DeployError

    class Refusing(RecordingCluster):
        def _cluster_client(self, *args):
            c = super()._cluster_client(*args)
            c.error = DeployError("flow 'scorer': stage x failed to build")
            return c

    cluster, _ = deploying(cls=Refusing)
    with pytest.raises(DeployError, match="failed to build"):
        cluster.deploy(cpu_flow)


@pytest.mark.parametrize("wait_s", [-1, "300", float("nan"), True])
def test_a_bad_wait_is_refused_before_anything_is_sent(cpu_flow, wait_s):
    cluster, wire = deploying()
    with pytest.raises(K8sConfigError, match=r"wait_s must be a number of seconds >= 0, got"):
        cluster.deploy(cpu_flow, wait_s=wait_s)
    assert wire.requests == []


def test_flow_deploy_with_a_kubernetes_cluster(cpu_flow):
    cluster, _ = deploying()
    assert cpu_flow.deploy(cluster=cluster) == ("Deployment", "scorer")
    assert cluster.made[0].deploys == [(cpu_flow, True, None, None)]


def test_the_runtime_client_is_built_from_executors_cluster(monkeypatch):
    import executors.cluster

    class Recorded:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    # ClusterClient is the runtime's; here only what the backend passes it matters
    monkeypatch.setattr(executors.cluster, "ClusterClient", Recorded, raising=False)
    made = KubernetesCluster()._cluster_client("http://gw:80", "redis://:pw@kvs:6379/0", "adm", None)
    assert isinstance(made, Recorded)
    assert made.kwargs == {"url": "http://gw:80", "kvs_url": "redis://:pw@kvs:6379/0", "admin_token": "adm",
                           "token": None}


def test_wait_ready_alone_waits_for_what_exists():
    cluster, wire = deploying()
    cluster.apply(render(KubeConfig()))
    status = cluster.wait_ready(wait_s=1)  # no GPU Deployment: not waited for
    assert set(status["components"]) == {"kvs", "gateway", "executor-cpu"}
    cluster, wire = deploying(workloads=Workloads(never=("executor-gpu",)))
    cluster.apply(render(KubeConfig(gpu_executors=1)))
    with pytest.raises(K8sNotReadyError, match=r"not ready after 0.02 s: executor-gpu: 0/1 ready, 0 updated \(see"):
        cluster.wait_ready(wait_s=0.02)
    cluster, _ = deploying()  # nothing applied: the required ones are missing
    with pytest.raises(K8sNotReadyError, match="kvs: not found; gateway: not found; executor-cpu: not found"):
        cluster.wait_ready(wait_s=0)
