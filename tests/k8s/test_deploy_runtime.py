"""``flow.deploy(cluster=KubernetesCluster(...))`` end to end: the real API server (as the
documented non-admin deployer), its controllers and scheduler, and the real runtime.

There is no kubelet: the fakelet marks the scheduled pods Ready, and the test starts each
pod's process itself, the way its container starts it: executors named after the executor
pods the ReplicaSet created (KVS URL from the environment, registering themselves), a
standalone gateway (``--membership kvs``, admin token from the environment), and a Redis
with the password from the Secret ``ensure_secrets`` created. The addresses are the
out-of-cluster ones a port-forward would give.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from flow import Flow
from flow.table import Table
from k8s import KubeConfig
from kvs import RedisServer
from tests.executors.processes import Procs, health, wait_until
from tests.flowgen import assert_same_rows
from tests.k8s.test_real_backend import IMAGE, cluster_as

pytest.importorskip("kubernetes.client")
import kubernetes.client as client  # noqa: E402


def double(row):
    return row.x * 2


def test_flow_deploy_on_kubernetes_runs_on_the_pods_runtime(control_plane, k8s_namespace, tmp_path):
    base = KubeConfig(namespace=k8s_namespace, image=IMAGE, kvs_storage=None, cpu_executors=2)
    deployer = cluster_as(control_plane, "developer", base)
    deployer.ensure_secrets()
    deployer.apply()
    deployer.wait_ready(wait_s=60)
    core = client.CoreV1Api(control_plane.api_client("admin"))
    pods = sorted(
        p.metadata.name
        for p in core.list_namespaced_pod(
            k8s_namespace, label_selector="app.kubernetes.io/component=executor-cpu"
        ).items
    )
    assert len(pods) == 2

    password = deployer.read_secret("flowserve-redis", "password")  # what the pods get from the Secret
    admin = deployer.read_secret("flowserve-admin", "token")
    key = deployer.read_secret("flowserve-cluster-key", "key")  # plans are signed with it
    kvs = RedisServer(dir=tmp_path / "redis", appendonly=False, password=password)
    kvs.start()
    procs = Procs(
        f"redis://:{quote(password, safe='')}@127.0.0.1:{kvs.port}/0",
        tmp_path,
        admin_token=admin,
        env={"FLOWSERVE_CLUSTER_KEY": key},
    )
    try:
        for pod in pods:
            procs.executor(pod)
        gateway = procs.gateway("flowserve-gateway")
        wait_until("the gateway to find the executors", lambda: health(gateway).get("executors") == 2, timeout=90)

        # the password and the admin token come from the Secrets, not from the caller
        cluster = cluster_as(
            control_plane, "developer", base.replace(gateway_url=gateway, kvs_url=f"redis://127.0.0.1:{kvs.port}/0")
        )
        flow = Flow("k8s-double", schema={"x": float})
        flow.map(double, names=["y"])
        d = flow.deploy(cluster=cluster)
        rows = [{"x": 1.5}, {"x": -2.0}]
        answer = d.call(rows)
        assert_same_rows(answer.table, flow.run(Table.from_any(rows).with_qid(answer.input_qids)))
        described = d.cluster.http.get("/flows/k8s-double").json()
        assert {e for s in described["stages"] for e in s["executors"]} == set(pods)
        # deploy re-applied the plan's manifests: the executors now name the flow they serve
        dep = client.AppsV1Api(control_plane.api_client("admin")).read_namespaced_deployment(
            "flowserve-executor-cpu", k8s_namespace
        )
        assert dep.metadata.annotations["flowserve.io/flows"] == "k8s-double"
        assert {c: s["ready"] for c, s in cluster.status()["components"].items()} == {
            "kvs": 1,
            "gateway": 1,
            "executor-cpu": 2,
        }
        cluster.close()
    finally:
        procs.stop()
        kvs.stop()
