"""The backend against a real API server (kube-apiserver v1.20.2 with its controller manager
and scheduler; pods made Ready by the fakelet), as the non-admin deployer of
docs/kubernetes.md: apply, re-apply, prune, scale, status, wait, delete, errors."""

from __future__ import annotations

import pytest

from executors.hosts.autoscale import AutoscalingConfig
from flow.errors import AccessDeniedError, DeadlineExceededError, FlowValueError
from k8s import KubeConfig, render
from k8s.errors import K8sNotFoundError
from tests.k8s import realcluster as rc

pytest.importorskip("kubernetes.client")
import kubernetes.client as client  # noqa: E402

from k8s.backend import KubernetesCluster  # noqa: E402

IMAGE = "registry.example.com/flowserve:0.1.0"
INSTANCE = "app.kubernetes.io/instance"


class Fast(KubernetesCluster):
    poll_s = 0.05


def cluster_as(cp, user: str, config: KubeConfig) -> KubernetesCluster:
    """A KubernetesCluster talking to the real API server with ``user``'s token."""
    api = cp.api_client(user)
    return Fast(
        config=config,
        apps_api=client.AppsV1Api(api),
        core_api=client.CoreV1Api(api),
        networking_api=client.NetworkingV1Api(api),
        rbac_api=client.RbacAuthorizationV1Api(api),
    )


def live_objects(cp, namespace: str, instance: str = "flowserve") -> set[tuple[str, str]]:
    """(kind, name) of every object of ``instance`` in ``namespace``, read as admin."""
    out = cp.kubectl(
        "-n",
        namespace,
        "get",
        "deployments,statefulsets,services,networkpolicies,roles,rolebindings,serviceaccounts,"
        "secrets,persistentvolumeclaims,configmaps",
        "-l",
        f"{INSTANCE}={instance}",
        "-o",
        "jsonpath={range .items[*]}{.kind} {.metadata.name}{'\\n'}{end}",
    )
    return {tuple(line.split()) for line in out.splitlines() if line.strip()}


def rendered(manifests) -> set[tuple[str, str]]:
    return {(m["kind"], m["metadata"]["name"]) for m in manifests}


def config(ns: str, **kw) -> KubeConfig:
    kw.setdefault("kvs_storage", None)
    return KubeConfig(namespace=ns, image=IMAGE, **kw)


# -- server-side validation -------------------------------------------------------------------


def test_the_server_accepts_every_rendered_configuration_in_a_dry_run(control_plane, gpu_plan):
    """Each configuration of conftest.configs() (GPU, minimal, autoscaling, ...) and a
    plan-derived one: the real API server validates and admits every object (dry run)."""
    from tests.k8s.conftest import configs

    admin_core = client.CoreV1Api(control_plane.api_client("admin"))
    cases = dict(configs())
    cases["plan"] = KubeConfig(namespace="ml")
    for name, cfg in cases.items():
        ns = rc.unique_namespace(name)
        cfg = cfg.replace(namespace=ns)
        admin_core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        manifests = render(cfg, gpu_plan if name == "plan" else None)
        results = cluster_as(control_plane, "admin", cfg).apply(manifests, dry_run=True)
        assert {(r["kind"], r["name"]) for r in results} == rendered(manifests), name
        assert {r["action"] for r in results} == {"created"}, name
        assert live_objects(control_plane, ns, cfg.name) == set(), f"{name}: a dry run persisted something"


def test_the_server_rejects_a_broken_manifest_naming_the_object_and_field(control_plane, k8s_namespace):
    cfg = config(k8s_namespace)
    manifests = render(cfg)
    gw = next(m for m in manifests if m["kind"] == "Deployment")
    gw["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = 70000
    with pytest.raises(Exception) as e:
        cluster_as(control_plane, "developer", cfg).apply(manifests)
    assert "422" in str(e.value) and f"Deployment {k8s_namespace}/{gw['metadata']['name']}" in str(e.value)
    assert "containerPort" in str(e.value)


# -- apply / re-apply / scale / status / wait ---------------------------------------------------


def test_deployer_applies_waits_scales_and_reapplies_keeping_replicas(control_plane, k8s_namespace):
    cfg = config(
        k8s_namespace,
        cpu_executors=2,
        gpu_executors=1,
        autoscaling=AutoscalingConfig(max_replicas=6, target_utilisation=0.6),
    )
    cluster = cluster_as(control_plane, "developer", cfg)
    assert sorted(cluster.ensure_secrets()) == ["flowserve-admin", "flowserve-cluster-key", "flowserve-redis"]
    assert cluster.ensure_secrets() == []

    manifests = render(cfg)
    results = cluster.apply(manifests)
    assert {(r["kind"], r["name"]) for r in results} == rendered(manifests)
    assert {r["action"] for r in results} == {"created"}
    status = cluster.wait_ready(wait_s=60)  # the real controllers roll out, the scheduler binds
    assert {c: (s["ready"], s["replicas"]) for c, s in status["components"].items()} == {
        "kvs": (1, 1),
        "gateway": (1, 1),
        "executor-cpu": (2, 2),
        "executor-gpu": (1, 1),
    }
    assert status["gateway"]["type"] == "ClusterIP" and status["gateway"]["cluster_ip"].startswith("10.0.0.")
    # the real scheduler honoured the GPU request against the node's capacity
    gpu_pods = control_plane.kubectl(
        "-n",
        k8s_namespace,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/component=executor-gpu",
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    )
    assert gpu_pods == rc.NODE

    assert cluster.scale("executor-cpu", 3) == 3
    assert cluster.replicas("executor-cpu") == 3
    cluster.wait_ready(wait_s=60)
    assert cluster.status()["components"]["executor-cpu"]["ready"] == 3
    cluster_ip = cluster.status()["gateway"]["cluster_ip"]

    again = {(r["kind"], r["name"]): r for r in cluster.apply(manifests)}  # re-apply keeps the scale
    assert again[("Deployment", "flowserve-executor-cpu")]["kept_replicas"] == 3
    assert {r["action"] for r in again.values()} <= {"unchanged", "configured"}
    assert cluster.replicas("executor-cpu") == 3
    assert cluster.status()["gateway"]["cluster_ip"] == cluster_ip  # the server's fields survive
    assert cluster.baseline_replicas() == {"cpu": 2, "gpu": 1}

    cluster.apply(manifests, keep_replicas=False)
    assert cluster.replicas("executor-cpu") == 2
    cluster.wait_ready(wait_s=60)

    # a changed manifest is configured in place (server-side apply, field manager flowserve)
    changed = render(cfg.replace(image="registry.example.com/flowserve:0.2.0"))
    actions = {(r["kind"], r["name"]): r["action"] for r in cluster.apply(changed)}
    assert actions[("Deployment", "flowserve-gateway")] == "configured"
    dep = client.AppsV1Api(control_plane.api_client("admin")).read_namespaced_deployment(
        "flowserve-gateway", k8s_namespace
    )
    assert dep.spec.template.spec.containers[0].image.endswith(":0.2.0")
    assert "flowserve" in {f.manager for f in dep.metadata.managed_fields if f.operation == "Apply"}
    cluster.wait_ready(wait_s=60)


def test_reapplying_keeps_what_the_server_assigned(control_plane, k8s_namespace):
    cfg = config(k8s_namespace, service_type="NodePort", token_secret="fs-token")
    cluster = cluster_as(control_plane, "developer", cfg)
    cluster.apply()
    core = client.CoreV1Api(control_plane.api_client("admin"))
    before = core.read_namespaced_service("flowserve-gateway", k8s_namespace)
    assert before.spec.ports[0].node_port and before.spec.cluster_ip
    results = cluster.apply()
    after = core.read_namespaced_service("flowserve-gateway", k8s_namespace)
    assert (after.spec.cluster_ip, after.spec.ports[0].node_port) == (
        before.spec.cluster_ip,
        before.spec.ports[0].node_port,
    )
    assert {r["action"] for r in results} == {"unchanged"}  # a no-op apply writes nothing


def test_wait_ready_names_what_the_scheduler_cannot_place(control_plane, k8s_namespace):
    cfg = config(
        k8s_namespace,
        cpu_executors=1,
        gpu_executors=1,
        gpu_node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100"},
    )  # no such node
    cluster = cluster_as(control_plane, "developer", cfg)
    cluster.ensure_secrets()
    cluster.apply()
    with pytest.raises(DeadlineExceededError, match=r"executor-gpu: 0/1 ready") as e:
        cluster.wait_ready(wait_s=3)
    assert "executor-cpu" not in str(e.value) and "gateway" not in str(e.value)


# -- prune -------------------------------------------------------------------------------------


def test_reapplying_without_gpu_executors_or_autoscaling_prunes_them(control_plane, k8s_namespace):
    cfg = config(k8s_namespace, gpu_executors=1, autoscaling=AutoscalingConfig(max_replicas=4))
    cluster = cluster_as(control_plane, "developer", cfg)
    cluster.ensure_secrets()
    cluster.apply(render(cfg))
    before = live_objects(control_plane, k8s_namespace)
    assert {
        ("Deployment", "flowserve-executor-gpu"),
        ("Role", "flowserve-autoscaler"),
        ("RoleBinding", "flowserve-autoscaler"),
    } <= before

    smaller = cfg.replace(gpu_executors=0, autoscaling=None, network_policies=False)
    results = cluster.apply(render(smaller))
    pruned = {(r["kind"], r["name"]) for r in results if r["action"] == "pruned"}
    assert pruned == {
        ("Deployment", "flowserve-executor-gpu"),
        ("Role", "flowserve-autoscaler"),
        ("RoleBinding", "flowserve-autoscaler"),
        ("NetworkPolicy", "flowserve-kvs"),
        ("NetworkPolicy", "flowserve-executors"),
        ("NetworkPolicy", "flowserve-gateway"),
    }
    rc.wait_for(
        "the pruned objects to be gone",
        lambda: live_objects(control_plane, k8s_namespace) == (before - pruned),
        timeout=30,
    )
    # the Secrets are never pruned (they are not rendered, and hold the data's password)
    assert {("Secret", "flowserve-redis"), ("Secret", "flowserve-admin")} <= live_objects(control_plane, k8s_namespace)
    # another instance in the same namespace is left alone
    other = config(k8s_namespace, name="other")
    cluster_as(control_plane, "developer", other).apply(render(other))
    cluster.apply(render(smaller))
    assert ("Deployment", "other-gateway") in live_objects(control_plane, k8s_namespace, "other")


def test_prune_refuses_manifests_of_another_instance_before_sending_anything(control_plane, k8s_namespace):
    cluster = cluster_as(control_plane, "developer", config(k8s_namespace))
    with pytest.raises(FlowValueError, match="instance 'flowserve'.*'other'"):
        cluster.apply(render(config(k8s_namespace, name="other")))
    assert live_objects(control_plane, k8s_namespace, "other") == set()


# -- delete ------------------------------------------------------------------------------------


def test_delete_as_the_deployer_removes_everything_and_keeps_data_by_default(control_plane, k8s_namespace):
    admin_core = client.CoreV1Api(control_plane.api_client("admin"))
    # a volume for the KVS's claim (no provisioner here): pre-bound to that claim
    pv = f"pv-{k8s_namespace}"
    admin_core.create_persistent_volume(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": f"/tmp/{pv}"},
                "claimRef": {"namespace": k8s_namespace, "name": "data-flowserve-kvs-0"},
            },
        }
    )
    try:
        cfg = KubeConfig(
            namespace=k8s_namespace, image=IMAGE, gpu_executors=1, autoscaling=AutoscalingConfig(max_replicas=4)
        )
        cluster = cluster_as(control_plane, "developer", cfg)
        cluster.ensure_secrets()
        cluster.apply()
        cluster.wait_ready(wait_s=60)  # the KVS pod ran: its claim is bound
        data = {
            ("Secret", "flowserve-redis"),
            ("Secret", "flowserve-admin"),
            ("Secret", "flowserve-cluster-key"),
            ("PersistentVolumeClaim", "data-flowserve-kvs-0"),
        }
        assert data <= live_objects(control_plane, k8s_namespace)

        deleted = cluster.delete()
        assert {(d["kind"], d["name"]) for d in deleted} == rendered(render(cfg))
        rc.wait_for("only the data to be left", lambda: live_objects(control_plane, k8s_namespace) == data, timeout=60)
        rc.wait_for(
            "the pods to be gone",
            lambda: not control_plane.kubectl("-n", k8s_namespace, "get", "pods", "-o", "name"),
            timeout=60,
        )

        deleted = cluster.delete(keep_data=False)  # as the deployer: no 403 half way
        assert {(d["kind"], d["name"]) for d in deleted} == data
        rc.wait_for("nothing to be left", lambda: live_objects(control_plane, k8s_namespace) == set(), timeout=60)
        assert cluster.delete(keep_data=False) == []
    finally:
        admin_core.delete_persistent_volume(pv)


# -- RBAC --------------------------------------------------------------------------------------


def test_a_user_without_the_deployer_role_is_refused_naming_verb_and_object(control_plane, k8s_namespace):
    cluster = cluster_as(control_plane, "outsider", config(k8s_namespace))
    with pytest.raises(AccessDeniedError) as e:
        cluster.apply()
    msg = str(e.value)
    assert f"read ServiceAccount {k8s_namespace}/flowserve failed: 403" in msg
    assert 'User "outsider" cannot get resource "serviceaccounts"' in msg
    assert e.value.verb == "read" and e.value.kind == "ServiceAccount" and e.value.status == 403
    with pytest.raises(AccessDeniedError, match=f"list Deployment in namespace {k8s_namespace} failed: 403"):
        cluster.delete()


def test_each_verb_of_the_documented_role_is_needed(control_plane, k8s_namespace):
    """Take one rule's verb away from the deployer: the call that needs it is refused."""
    rbac = client.RbacAuthorizationV1Api(control_plane.api_client("admin"))
    cfg = config(k8s_namespace)
    cluster = cluster_as(control_plane, "developer", cfg)
    cluster.ensure_secrets()
    cluster.apply()
    role = rbac.read_namespaced_role("flowserve-deployer", k8s_namespace)
    for rule in role.rules:
        if "deployments" in rule.resources:
            rule.verbs = [v for v in rule.verbs if v != "delete"]
    rbac.replace_namespaced_role("flowserve-deployer", k8s_namespace, role)
    with pytest.raises(AccessDeniedError, match=rf"delete Deployment {k8s_namespace}/flowserve-\S+ failed: 403"):
        cluster.delete()
    with pytest.raises(K8sNotFoundError):
        cluster.scale("executor-gpu", 1)  # not rendered: named as missing, not forbidden
