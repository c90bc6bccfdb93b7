"""KubernetesCluster.deploy end to end against the real runtime, run the way the pods run it.

Kubernetes itself cannot run here: the API side is the client's typed APIs over the
recorder (scripted Secrets and ready workloads, as in test_deploy.py). Everything after
the rollout is real: a Redis with the password from the Secret, executors started as the
executor Deployment's container starts them (KVS URL from the environment, registering
themselves), a standalone gateway as the gateway Deployment runs it (``--membership
kvs``, admin token from the environment), and the runtime's ClusterClient deploying and
invoking over HTTP. The addresses are the out-of-cluster ones a port-forward would give.
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

pytest.importorskip("kubernetes.client")
from k8s.backend import KubernetesCluster  # noqa: E402 - needs the client
from tests.k8s.test_deploy import ADMIN, PASSWORD, Workloads, deploying  # noqa: E402


class FastPolls(KubernetesCluster):
    poll_s = 0.001
    wire = None


@pytest.fixture
def kvs_with_password(tmp_path):
    server = RedisServer(dir=tmp_path / "redis", appendonly=False, password=PASSWORD)
    server.start()
    yield server
    server.stop()


def double(row):
    return row.x * 2


def test_flow_deploy_on_kubernetes_runs_on_the_pods_runtime(kvs_with_password, tmp_path):
    port = kvs_with_password.port
    inside = f"redis://:{quote(PASSWORD, safe='')}@127.0.0.1:{port}/0"  # as the pods compose it
    procs = Procs(inside, tmp_path, admin_token=ADMIN)
    try:
        procs.executor("flowserve-executor-cpu-0")
        procs.executor("flowserve-executor-cpu-1")
        gateway = procs.gateway("flowserve-gateway-0")
        wait_until("the gateway to find the executors", lambda: health(gateway).get("executors") == 2)

        # the password comes from the Secret, not from the caller
        config = KubeConfig(gateway_url=gateway, kvs_url=f"redis://127.0.0.1:{port}/0")
        cluster, wire = deploying(config, Workloads(), cls=FastPolls)
        flow = Flow("k8s-double", schema={"x": float})
        flow.map(double, names=["y"])
        d = flow.deploy(cluster=cluster)
        rows = [{"x": 1.5}, {"x": -2.0}]
        answer = d.call(rows)
        assert_same_rows(answer.table, flow.run(Table.from_any(rows).with_qid(answer.input_qids)))
        assert [r.body["metadata"]["name"] for r in wire.calls("POST")][-1] == "flowserve-executor-cpu"
        described = d.cluster.http.get("/flows/k8s-double").json()
        assert {e for s in described["stages"] for e in s["executors"]} == {
            "flowserve-executor-cpu-0", "flowserve-executor-cpu-1"}
        cluster.close()
    finally:
        procs.stop()
