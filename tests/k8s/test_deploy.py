"""KubernetesCluster.deploy: Secrets, apply, wait for the rollout, then the runtime's client.

The Kubernetes side is the real API server (v1.20.2 with its controllers and scheduler,
pods made Ready by the fakelet), driven as the documented non-admin deployer. The runtime's
``ClusterClient`` is not under test here (test_deploy_runtime.py runs the real one): the
cluster builds it in one method, ``_cluster_client``, which these tests override to record
what it is given, what it is asked to deploy, and the workloads' state at that moment.
"""

from __future__ import annotations

import pytest

from flow import Flow
from flow.configuration import ConfigError
from flow.errors import DeadlineExceededError, RetryableError, UnreachableError
from k8s import KubeConfig
from k8s.manifests import A_FLOWS
from tests.k8s.conftest import net, pre

client = pytest.importorskip("kubernetes.client")
from k8s.backend import KubernetesCluster  # noqa: E402 - needs the client

PASSWORD = "p@ss/word"  # not URL-safe on purpose: the URL must quote it
ADMIN = "admin-t0ken"
CLUSTER_KEY = "00112233445566778899aabbccddeeff"


class StubClient:
    """Stands in for executors.hosts.cluster.ClusterClient: records its arguments and deploys."""

    def __init__(self, status: dict, **kwargs):
        self.kwargs = kwargs
        self.status = status  # the workloads when the client was built
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
    poll_s = 0.05

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.made: list[StubClient] = []

    def _cluster_client(self, url, kvs_url, admin_token, token, cluster_key=None):
        c = StubClient(self.status(), url=url, kvs_url=kvs_url, admin_token=admin_token, token=token)
        c.cluster_key = cluster_key
        self.made.append(c)
        return c


@pytest.fixture
def deploying(control_plane, k8s_namespace):
    """``deploying(config, token=None, cls=RecordingCluster)``: a cluster of the developer in a
    fresh namespace whose Secrets hold PASSWORD, ADMIN (and ``token``)."""
    admin_core = client.CoreV1Api(control_plane.api_client("admin"))

    def make(config: KubeConfig | None = None, token: str | None = None, cls=RecordingCluster):
        config = (config or KubeConfig(kvs_storage=None)).replace(namespace=k8s_namespace)
        secrets = [
            (config.redis_secret_name, "password", PASSWORD),
            (config.admin_secret_name, "token", ADMIN),
            (config.cluster_key_secret_name, "key", CLUSTER_KEY),
        ]
        if token is not None:
            secrets.append((config.token_secret, "token", token))
        for name, key, value in secrets:
            try:
                admin_core.create_namespaced_secret(
                    k8s_namespace, {"metadata": {"name": name}, "stringData": {key: value}}
                )
            except client.ApiException as e:
                if e.status != 409:
                    raise
        api = control_plane.api_client("developer")
        return cls(
            config=config,
            apps_api=client.AppsV1Api(api),
            core_api=client.CoreV1Api(api),
            networking_api=client.NetworkingV1Api(api),
            rbac_api=client.RbacAuthorizationV1Api(api),
        )

    make.namespace = k8s_namespace
    make.admin_apps = client.AppsV1Api(control_plane.api_client("admin"))
    return make


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


def test_deploy_applies_waits_then_deploys_through_the_runtime_client(cpu_flow, deploying):
    cluster = deploying()
    ns = deploying.namespace
    result = cluster.deploy(cpu_flow, rules=None, options=None, wait_s=60)

    assert result == ("Deployment", "scorer")
    (made,) = cluster.made
    assert made.kwargs == {
        "url": f"http://flowserve-gateway.{ns}.svc.cluster.local:80",
        "kvs_url": f"redis://:p%40ss%2Fword@flowserve-kvs.{ns}.svc.cluster.local:6379/0",
        "admin_token": ADMIN,
        "token": None,
    }
    assert made.cluster_key == CLUSTER_KEY  # from its Secret: the client signs the plan with it
    assert made.deploys == [(cpu_flow, True, None, None)]
    # the client was built only once every workload had rolled out
    assert {c: s["rolled_out"] for c, s in made.status["components"].items()} == {
        "kvs": True,
        "gateway": True,
        "executor-cpu": True,
    }
    dep = deploying.admin_apps.read_namespaced_deployment("flowserve-executor-cpu", ns)
    assert dep.metadata.annotations[A_FLOWS] == "scorer"


def test_deploy_renders_for_the_plan_and_waits_for_the_gpu_executors(gpu_flow, deploying):
    # no node has this accelerator: the GPU executor stays Pending
    cluster = deploying(KubeConfig(kvs_storage=None, gpu_node_selector={"example.com/accelerator": "none"}))
    ns = deploying.namespace
    with pytest.raises(DeadlineExceededError) as info:
        cluster.deploy(gpu_flow, wait_s=3)
    msg = str(info.value)
    assert msg.startswith(
        f"flowserve in namespace {ns} not ready after 3 s: executor-gpu: 0/1 ready, "
        f"1 updated (see kubectl -n {ns} get pods -l app.kubernetes.io/name=flowserve,"
        "app.kubernetes.io/instance=flowserve"
    )
    assert "gateway" not in msg.split("(see")[0]  # only what is short is named
    gpu = deploying.admin_apps.read_namespaced_deployment("flowserve-executor-gpu", ns)
    assert gpu.metadata.annotations["flowserve.io/gpu-stages"] == "ensemble/net"
    assert cluster.made == []  # never deployed to a cluster that is not ready


def test_deploy_without_optimizing_and_with_options(cpu_flow, deploying):
    from optimizer import OptimizerOptions

    options = OptimizerOptions()
    cluster = deploying()
    cluster.deploy(cpu_flow, optimize=False, options=options, wait_s=60)
    assert cluster.made[0].deploys == [(cpu_flow, False, None, options)]


def test_addresses_from_the_call_or_the_config_get_the_password_from_the_secret(cpu_flow, deploying):
    cluster = deploying()
    cluster.deploy(cpu_flow, gateway_url="http://localhost:8080/", kvs_url="redis://localhost:6379/0", wait_s=60)
    assert (cluster.made[0].kwargs["url"], cluster.made[0].kwargs["kvs_url"]) == (
        "http://localhost:8080",
        "redis://:p%40ss%2Fword@localhost:6379/0",
    )

    cfg = KubeConfig(
        kvs_storage=None, gateway_url="https://gw.example.com", kvs_url="rediss://default@kvs.example.com:6380/1"
    )
    cluster = deploying(cfg)
    cluster.deploy(cpu_flow, wait_s=60)
    assert (cluster.made[0].kwargs["url"], cluster.made[0].kwargs["kvs_url"]) == (
        "https://gw.example.com",
        "rediss://default:p%40ss%2Fword@kvs.example.com:6380/1",
    )
    # a KVS URL that carries a password is used as given
    cluster.deploy(cpu_flow, kvs_url="redis://:other@localhost:6379/0", wait_s=60)
    assert cluster.made[-1].kwargs["kvs_url"] == "redis://:other@localhost:6379/0"


def test_the_public_token_is_passed_when_the_gateway_requires_one(cpu_flow, deploying):
    cluster = deploying(KubeConfig(kvs_storage=None, token_secret="api-token"), token="public-t0ken")
    cluster.deploy(cpu_flow, wait_s=60)
    assert cluster.made[0].kwargs["token"] == "public-t0ken"


def test_deploying_again_reuses_the_client_and_renders_for_every_flow(cpu_flow, gpu_flow, deploying):
    cluster = deploying()
    cluster.deploy(gpu_flow, wait_s=60)
    cluster.deploy(cpu_flow, wait_s=60)
    assert len(cluster.made) == 1 and [d[0].name for d in cluster.made[0].deploys] == ["ensemble", "scorer"]
    cpu = deploying.admin_apps.read_namespaced_deployment("flowserve-executor-cpu", deploying.namespace)
    assert cpu.metadata.annotations[A_FLOWS] == "ensemble,scorer"
    # the GPU executors the first flow needs are still there (deploy renders for every flow)
    gpu = deploying.admin_apps.read_namespaced_deployment("flowserve-executor-gpu", deploying.namespace)
    assert gpu.metadata.annotations[A_FLOWS] == "ensemble,scorer"
    cluster.close()
    assert cluster.made[0].closed is True


def test_an_unreachable_gateway_says_how_to_reach_it_from_outside(cpu_flow, deploying):
    import httpx

    class Unreachable(RecordingCluster):
        def _cluster_client(self, *args):
            c = super()._cluster_client(*args)
            c.error = httpx.ConnectError("[Errno -2] Name or service not known")
            return c

    cluster = deploying(cls=Unreachable)
    ns = deploying.namespace
    with pytest.raises(UnreachableError) as info:
        cluster.deploy(cpu_flow, wait_s=60)
    msg = str(info.value)
    assert f"gateway http://flowserve-gateway.{ns}.svc.cluster.local:80 or KVS redis://:***@flowserve-kvs" in msg
    assert f"kubectl -n {ns} port-forward svc/flowserve-gateway 8080:80" in msg
    assert f"kubectl -n {ns} port-forward svc/flowserve-kvs 6379" in msg
    assert "gateway_url='http://localhost:8080'" in msg
    assert PASSWORD not in msg and "p%40ss" not in msg
    assert isinstance(info.value, RetryableError)
    assert isinstance(info.value.__cause__, httpx.ConnectError)


def test_other_runtime_errors_pass_through(cpu_flow, deploying):
    from executors.errors import DeployError

    class Refusing(RecordingCluster):
        def _cluster_client(self, *args):
            c = super()._cluster_client(*args)
            c.error = DeployError("flow 'scorer': stage x failed to build")
            return c

    cluster = deploying(cls=Refusing)
    with pytest.raises(DeployError, match="failed to build"):
        cluster.deploy(cpu_flow, wait_s=60)


@pytest.mark.parametrize("wait_s", [-1, "300", float("nan"), True])
def test_a_bad_wait_is_refused_before_anything_is_sent(cpu_flow, wait_s):
    class Unreachable(RecordingCluster):
        def _api(self, which):
            raise AssertionError("nothing may be sent")

    cluster = Unreachable(config=KubeConfig())
    with pytest.raises(ConfigError, match=r"wait_s must be a number of seconds >= 0, got"):
        cluster.deploy(cpu_flow, wait_s=wait_s)


def test_flow_deploy_with_a_kubernetes_cluster(cpu_flow, deploying):
    cluster = deploying()
    assert cpu_flow.deploy(cluster=cluster) == ("Deployment", "scorer")
    assert cluster.made[0].deploys == [(cpu_flow, True, None, None)]


def test_the_runtime_client_is_built_from_executors_cluster(monkeypatch):
    import executors.hosts.cluster

    class Recorded:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    # ClusterClient is the runtime's; here only what the backend passes it matters
    monkeypatch.setattr(executors.hosts.cluster, "ClusterClient", Recorded, raising=False)
    made = KubernetesCluster()._cluster_client("http://gw:80", "redis://:pw@kvs:6379/0", "adm", None, "ab" * 16)
    assert isinstance(made, Recorded)
    assert made.kwargs == {
        "url": "http://gw:80",
        "kvs_url": "redis://:pw@kvs:6379/0",
        "admin_token": "adm",
        "token": None,
        "cluster_key": "ab" * 16,
    }


def test_wait_ready_alone_waits_for_what_exists(deploying):
    cluster = deploying()
    with pytest.raises(DeadlineExceededError, match="kvs: not found; gateway: not found; executor-cpu: not found"):
        cluster.wait_ready(wait_s=0)  # nothing applied: the required ones are missing
    cluster.apply()
    status = cluster.wait_ready(wait_s=60)  # no GPU Deployment: not waited for
    assert set(status["components"]) == {"kvs", "gateway", "executor-cpu"}
