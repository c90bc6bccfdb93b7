"""Opt-in (FLOWSERVE_K8S_REAL_NODE=1, root): a real pod from a rendered pod spec.

A control plane of its own (control-plane.sh) and a real node (real-node.sh: kubelet
v1.20.2, containerd 1.6, runc, the CNI bridge plugin). FlowServe's image is not built
here, so the executor Deployment runs ``localhost/busybox:1`` (built from busybox-static,
nothing pulled) with its command swapped for one that prints what the pod got; everything
else is the rendered pod spec: non-root uid, read-only root filesystem, RuntimeDefault
seccomp, all capabilities dropped, the downward API, the KVS URL from the Secret.
"""

from __future__ import annotations

import glob
import os
import subprocess

import pytest

from k8s import KubeConfig, render
from tests.k8s import realcluster as rc

pytestmark = pytest.mark.skipif(
    os.environ.get("FLOWSERVE_K8S_REAL_NODE") != "1" or os.geteuid() != 0,
    reason="opt-in: FLOWSERVE_K8S_REAL_NODE=1 as root (starts containerd and a kubelet)",
)
client = pytest.importorskip("kubernetes.client")
from k8s.backend import KubernetesCluster  # noqa: E402

NODE_SCRIPT = rc.ROOT / "scripts" / "k8s" / "real-node.sh"


@pytest.fixture(scope="module")
def real_node(tmp_path_factory):
    bindir, why = rc.binaries()
    if bindir is None:
        pytest.skip(why)
    cp = rc.ControlPlane(tmp_path_factory.mktemp("k8s-real-node-cp"))
    node_dir = tmp_path_factory.mktemp("k8s-real-node")
    try:
        r = subprocess.run(
            ["bash", str(NODE_SCRIPT), "start", str(node_dir), str(cp.dir)], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr[-3000:]
        yield cp
    finally:
        subprocess.run(["bash", str(NODE_SCRIPT), "stop", str(node_dir)], capture_output=True)
        cp.stop()


def test_a_rendered_executor_pod_runs_on_a_real_kubelet(real_node):
    api = real_node.api_client("admin")
    core = client.CoreV1Api(api)
    ns = rc.unique_namespace("node")
    core.create_namespace({"metadata": {"name": ns}})
    cfg = KubeConfig(
        namespace=ns, image="localhost/busybox:1", image_pull_policy="Never", kvs_storage=None, cpu_executors=1
    )
    cluster = KubernetesCluster(
        config=cfg,
        apps_api=client.AppsV1Api(api),
        core_api=core,
        networking_api=client.NetworkingV1Api(api),
        rbac_api=client.RbacAuthorizationV1Api(api),
    )

    def default_token():
        try:
            return core.read_namespaced_service_account("default", ns).secrets
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    rc.wait_for("the namespace's ServiceAccount token (admission needs it)", default_token, timeout=30)
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
    assert pod.spec.node_name == "realnode" and pod.status.pod_ip.startswith("10.88.0.")
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
