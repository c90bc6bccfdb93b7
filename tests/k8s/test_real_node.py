"""Opt-in (FLOWSERVE_K8S_REAL_NODE=1, root): real pods on a real kubelet.

A control plane of its own (control-plane.sh) and a real node (real-node.sh: kubelet
v1.20.2, containerd 1.6, runc, the CNI bridge plugin; svc-dns.py stands in for CoreDNS and
kube-proxy). FlowServe's image is built without pulling anything (flowserve-image.sh: a
debootstrap rootfs, the project pip-installed) and imported into the node's containerd.

* a rendered executor pod (busybox, its command swapped) gets what the spec promises:
  non-root uid, read-only root filesystem, the downward API, the KVS URL from the Secret;
* a flow is served by the rendered KVS, gateway and executor pods, applied by
  ``KubernetesCluster`` as the documented deployer and invoked over HTTP from the host (pod
  IP via the bridge); an executor container is SIGKILLed, then an executor pod is deleted,
  under continuous load: no request is lost, wrong or answered twice;
* with autoscaling, a load step makes the gateway's autoscaler (in-cluster credentials,
  the rendered Role) add an executor pod, which then answers requests.
"""

from __future__ import annotations

import glob

import pytest

from flow import Flow
from k8s import KubeConfig, render
from k8s.kube_config import Resources
from tests.k8s import realcluster as rc

pytestmark = pytest.mark.skipif(rc.real_node_unavailable() is not None, reason=str(rc.real_node_unavailable()))
client = pytest.importorskip("kubernetes.client")
from k8s.backend import KubernetesCluster  # noqa: E402
from tests.k8s.test_real_backend import cluster_as  # noqa: E402

# two cores here: the pods request little, so the scheduler places all of them on the one node
SMALL = Resources(cpu="50m", memory="128Mi", cpu_limit="1", memory_limit="1Gi")


def double(row):
    return row.x * 2


def double_flow() -> Flow:
    flow = Flow("double")
    flow.map(double, names=["y"])
    return flow


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = rc.RealNode(tmp_path_factory.mktemp("k8s-real-node"))
    try:
        yield n
    finally:
        n.stop()


def namespace(node, prefix: str):
    core = client.CoreV1Api(node.cp.api_client("admin"))
    ns = rc.unique_namespace(prefix)
    core.create_namespace({"metadata": {"name": ns}})
    rc.wait_namespace_ready(core, ns)
    return core, ns


def test_a_rendered_executor_pod_runs_on_a_real_kubelet(node):
    core, ns = namespace(node, "node")
    api = node.cp.api_client("admin")
    cfg = KubeConfig(
        namespace=ns,
        image="localhost/busybox:1",
        image_pull_policy="Never",
        kvs_storage=None,
        cpu_executors=1,
        cpu_executor_resources=SMALL,
    )
    cluster = KubernetesCluster(
        config=cfg,
        apps_api=client.AppsV1Api(api),
        core_api=core,
        networking_api=client.NetworkingV1Api(api),
        rbac_api=client.RbacAuthorizationV1Api(api),
    )
    cluster.ensure_secrets()
    manifests = render(cfg)
    executor = next(m for m in manifests if m["metadata"]["name"] == "flowserve-executor-cpu")
    c = executor["spec"]["template"]["spec"]["containers"][0]
    c["command"] = [
        "/bin/sh",
        "-c",
        "echo POD_IP=$POD_IP; echo KVS=${FLOWSERVE_KVS_URL#*@}; "
        "echo PASSWORD_SET=${REDIS_PASSWORD:+yes}; echo UID=$(id -u); touch /x; sleep 3600",
    ]
    c.pop("args", None)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        c.pop(probe, None)
    cluster.apply([m for m in manifests if m["kind"] == "ServiceAccount"] + [executor], prune=False)
    status = cluster.wait_ready(["executor-cpu"], wait_s=90)
    assert status["components"]["executor-cpu"]["ready"] == 1
    (pod,) = core.list_namespaced_pod(ns).items
    assert pod.spec.node_name == rc.REAL_NODE and pod.status.pod_ip.startswith("10.88.0.")
    logs = rc.wait_for(
        "the container's output",
        lambda: "".join(open(f).read() for f in glob.glob(f"/var/log/pods/{ns}_*/executor/0.log")).count("\n") >= 5,
        timeout=30,
    )
    text = "".join(open(f).read() for f in glob.glob(f"/var/log/pods/{ns}_*/executor/0.log"))
    assert logs and f"POD_IP={pod.status.pod_ip}" in text
    assert f"KVS=flowserve-kvs.{ns}.svc:6379/0" in text and "PASSWORD_SET=yes" in text
    assert "UID=10001" in text and "Read-only file system" in text
    cluster.delete()
    # the garbage collector deletes the pod; the kubelet then stops it within its grace
    # period (the shell ignores SIGTERM, so that is the whole grace period)
    rc.wait_for(
        "the pod to be terminating",
        lambda: all(p.metadata.deletion_timestamp for p in core.list_namespaced_pod(ns).items),
        timeout=30,
    )


def applied(node, ns: str, **config) -> tuple[KubernetesCluster, KubeConfig]:
    """The rendered manifests applied in ``ns`` by the docs' deployer (its RBAC created
    first), the FlowServe image for every pod, small resources and no KVS volume unless
    ``config`` says otherwise: (cluster, its config). Not waited for."""
    admin = node.cp.api_client("admin")
    from kubernetes import utils

    for doc in rc.deployer_rbac_from_docs(ns):
        utils.create_from_dict(admin, doc, namespace=ns)
    config = {
        "kvs_storage": None,
        "cpu_executors": 2,
        "kvs_resources": SMALL,
        "gateway_resources": SMALL,
        "cpu_executor_resources": SMALL,
        **config,
    }
    cfg = KubeConfig(
        namespace=ns, image=rc.FLOWSERVE_IMAGE, redis_image=rc.FLOWSERVE_IMAGE, image_pull_policy="Never", **config
    )
    cluster = cluster_as(node.cp, rc.DEVELOPER, cfg)
    cluster.ensure_secrets()
    cluster.apply(render(cfg))
    return cluster, cfg


def serve(node, ns: str, flow: Flow, **config):
    """The flow served by the rendered pods in ``ns``, applied by the docs' deployer:
    (cluster, Deployment, gateway URL). The host reaches the pods at their IPs."""
    cluster, cfg = applied(node, ns, **config)
    cluster.wait_ready(wait_s=240)
    core = client.CoreV1Api(node.cp.api_client("admin"))
    (gateway_ip,) = rc.pod_ips(core, ns, "gateway").values()
    (kvs_ip,) = rc.pod_ips(core, ns, "kvs").values()
    url = f"http://{gateway_ip}:{cfg.gateway_port}"
    d = cluster.deploy(flow, gateway_url=url, kvs_url=f"redis://{kvs_ip}:{cfg.redis_port}/0", wait_s=120)
    return cluster, d, core


def test_a_flow_served_by_real_pods_loses_nothing_when_an_executor_pod_dies(node):
    core, ns = namespace(node, "serve")
    cluster, d, core = serve(node, ns, double_flow())
    try:
        assert d.invoke({"x": 21}).to_pylist()[0]["y"] == 42
        executors = rc.pod_ips(core, ns, "executor-cpu")
        assert len(executors) == 2 and all(ip.startswith("10.88.0.") for ip in executors.values())

        load = rc.Load(d.url, concurrency=4).start()
        rc.wait_for("answers before the fault", lambda: load.count() >= 30, timeout=60)
        # 1. a crash: the executor's process is SIGKILLed; the kubelet restarts the container
        crashed = sorted(executors)[0]
        node.kill_container(core.read_namespaced_pod(crashed, ns), "executor")
        rc.wait_for(
            "the kubelet to restart the killed container",
            lambda: (
                lambda p: p.status.container_statuses[0].restart_count >= 1 and p.status.container_statuses[0].ready
            )(core.read_namespaced_pod(crashed, ns)),
            timeout=120,
        )
        after_crash = load.count()
        rc.wait_for("answers after the restart", lambda: load.count() >= after_crash + 30, timeout=60)
        # 2. an eviction: the other executor pod is deleted (SIGTERM, its grace period); the
        # ReplicaSet creates a replacement
        evicted = sorted(executors)[1]
        core.delete_namespaced_pod(evicted, ns)
        rc.wait_for(
            "a replacement executor pod ready",
            lambda: (
                len(set(rc.pod_ips(core, ns, "executor-cpu")) - {crashed, evicted}) == 1
                and cluster.status()["components"]["executor-cpu"]["ready"] == 2
            ),
            timeout=180,
        )
        after_evict = load.count()
        rc.wait_for("answers after the replacement", lambda: load.count() >= after_evict + 30, timeout=60)
        summary = load.stop()
        assert summary["lost"] == 0, summary
        assert summary["wrong"] == 0 and summary["duplicated"] == 0 and summary["repeated_qids"] == 0, summary
        assert summary["answered"] >= 90
    finally:
        cluster.close()
        cluster.delete()


def slow_double(row):
    import os
    import time

    time.sleep(0.02)  # one client keeps an executor ~busy: a few make the stage short of replicas
    return row.x * 2, os.environ.get("POD_NAME", "?")


def test_a_load_step_makes_the_autoscaler_add_an_executor_pod_that_serves(node):
    from executors.hosts.autoscale import AutoscalingConfig

    core, ns = namespace(node, "scale")
    flow = Flow("slow")
    flow.map(slow_double, names=["y", "pod"])
    cluster, d, core = serve(
        node, ns, flow, cpu_executors=1, autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=2)
    )
    apps = client.AppsV1Api(node.cp.api_client("admin"))
    try:
        (first,) = rc.pod_ips(core, ns, "executor-cpu")
        load = rc.Load(d.url, concurrency=6).start()
        # the gateway's autoscaler patches the Deployment's scale with its ServiceAccount's
        # token, through the `kubernetes` Service's address; the new pod registers, is given
        # the stage and answers
        rc.wait_for(
            "an answer from a second executor pod",
            lambda: any(
                s == 200 and rows and rows[0]["pod"] not in (first, "?")
                for s, rows, _, _ in list(load.answers.values())
            ),
            timeout=180,
            every=0.2,
        )
        summary = load.stop()
        assert summary["lost"] == 0 and summary["wrong"] == 0 and summary["duplicated"] == 0, summary
        assert apps.read_namespaced_deployment_scale("flowserve-executor-cpu", ns).spec.replicas == 2
        assert len(rc.pod_ips(core, ns, "executor-cpu")) == 2
    finally:
        cluster.close()
        cluster.delete()
