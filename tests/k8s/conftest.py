"""Shared fixtures of the Kubernetes tests: configs to render, small optimized plans, and a
real control plane (``control_plane``, ``k8s_namespace``: tests/k8s/realcluster.py).

Manifests are validated against the official schemas (kubernetes-validate, offline) and by
a real kube-apiserver v1.20.2 (server-side dry run); the backend runs against that API
server with its controllers and scheduler. The recorders in ``recorders.py`` remain for
what a real server cannot produce on demand (5xx, 429, no answer, malformed objects).
"""

from __future__ import annotations

import numpy as np
import pytest

from executors.hosts.autoscale import AutoscalingConfig
from flow import Flow
from k8s import KubeConfig, Resources, Toleration
from optimizer import optimize

# the oldest Kubernetes the declared client range (kubernetes>=29) targets, and the newest
# schema set kubernetes-validate ships
K8S_VERSIONS = ("1.29.0", "1.37.0")


def pre(row):
    return row.raw * 2.0


def net(table):
    return [np.zeros(len(table))]


@pytest.fixture(scope="session")
def gpu_plan():
    """pre (cpu) -> net (gpu): an optimized plan with one GPU stage."""
    f = Flow("ensemble", schema={"raw": float})
    f.map(pre, names=["x"]).map(net, names=["y"], batching=True, gpu=True)
    return optimize(f)


@pytest.fixture(scope="session")
def cpu_plan():
    f = Flow("scorer", schema={"raw": float})
    f.map(pre, names=["x"])
    return optimize(f)


def configs() -> dict[str, KubeConfig]:
    """Configs covering the options: defaults (CPU only), a GPU cluster, a minimal one,
    autoscaling ones (from the dataclass and from plain data, as a --config file gives it),
    and one on an external store (no KVS of its own)."""
    return {
        "cpu-default": KubeConfig(),
        "gpu": KubeConfig(
            name="vision",
            namespace="ml-serving",
            image="registry.example.com/team/flowserve:0.1.0",
            gateway_replicas=2,
            cpu_executors=3,
            gpu_executors=2,
            gpus_per_executor=2,
            gpu_executor_resources=Resources(cpu="4", memory="16Gi", cpu_limit="8", memory_limit="32Gi"),
            gpu_node_selector={"cloud.google.com/gke-accelerator": "nvidia-l4"},
            gpu_tolerations=[
                Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),
                {
                    "key": "dedicated",
                    "operator": "Equal",
                    "value": "ml",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            service_type="LoadBalancer",
            token_secret="vision-api-token",
            s3_endpoint="http://minio.storage:9000",
            s3_secret="vision-s3",
            image_pull_secrets=("regcred",),
            storage_class="fast-ssd",
            kvs_storage="20Gi",
            env={"FLOWSERVE_LOG_LEVEL": "INFO"},
        ),
        "minimal": KubeConfig(
            name="fs",
            namespace="default",
            kvs_storage=None,
            network_policies=False,
            cpu_executors=1,
            gpu_executors=0,
            image="localhost:5000/flowserve@sha256:" + "a" * 64,
            version="dev-1",
            service_type="NodePort",
            token_secret="fs-token",
            cpu_executor_resources=Resources(cpu="100m", memory="128Mi"),
        ),
        "autoscaling": KubeConfig(
            name="scaled",
            namespace="ml",
            cpu_executors=2,
            gpu_executors=1,
            autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=4, target_utilisation=0.6),
        ),
        "autoscaling-minimal": KubeConfig.from_dict(
            {
                "name": "tiny",
                "namespace": "default",
                "network_policies": False,
                "cpu_executors": 0,
                "gpu_executors": 0,
                "autoscaling": {"target_utilisation": None, "target_queue_per_replica": 4},
            }
        ),
        "external-store": KubeConfig(
            name="shared",
            namespace="ml",
            external_kvs="redis+sentinel://sentinel-0.db:26379,sentinel-1.db:26379/flowserve/0",
        ),
    }


# -- the real control plane (tests/k8s/realcluster.py) --------------------------------------


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory):
    """etcd + kube-apiserver + controller manager + scheduler v1.20.2 on 127.0.0.1, with a
    fakelet Node. Skips only when the binaries are not built and $FLOWSERVE_K8S_REQUIRED is
    unset; in CI (.ci/run sets it) a missing or broken control plane fails the tests."""
    from tests.k8s import realcluster as rc

    try:
        import kubernetes.client  # noqa: F401
    except ImportError as e:
        if rc.env_requires_real():
            pytest.fail(f"${rc.REQUIRE_ENV} is set but the kubernetes client is missing: {e}")
        pytest.skip(f"the kubernetes client is missing: {e}")

    bindir, why = rc.binaries()
    if bindir is None:
        if rc.env_requires_real():
            pytest.fail(
                f"${rc.REQUIRE_ENV} is set but the control plane is not built: {why} "
                f"(run scripts/k8s/control-plane.sh build)"
            )
        pytest.skip(
            f"no Kubernetes control plane built ({why}); build it with scripts/k8s/control-plane.sh "
            f"build, or set ${rc.REQUIRE_ENV}=1 to make this a failure"
        )
    cp = rc.ControlPlane(tmp_path_factory.mktemp("k8s-control-plane"))
    fakelet = rc.Fakelet(cp.api_client("admin"))
    try:
        fakelet.register()
        fakelet.start()
        cp.fakelet = fakelet
        yield cp
    finally:
        fakelet.stop()
        cp.stop()


@pytest.fixture
def k8s_namespace(control_plane, request):
    """A fresh namespace in which the user ``developer`` holds exactly the deployer Role of
    docs/kubernetes.md; deleted afterwards."""
    import kubernetes.client as client

    from tests.k8s import realcluster as rc

    admin = control_plane.api_client("admin")
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    ns = rc.unique_namespace()
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    for doc in rc.deployer_rbac_from_docs(ns):
        create = rbac.create_namespaced_role if doc["kind"] == "Role" else rbac.create_namespaced_role_binding
        create(ns, doc)
    yield ns
    core.delete_namespace(ns, propagation_policy="Background")
