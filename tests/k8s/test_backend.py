"""KubernetesCluster against the kubernetes client's API objects (no API server).

The backend gets real ``AppsV1Api``/``CoreV1Api``/``NetworkingV1Api`` objects whose HTTP
transport is a recorder: the tests assert the typed objects built (``V1Deployment``...),
the methods called, and the requests that would go on the wire. Responses the branches
need (409 on create, the live object on read, 403...) are scripted per test.
"""

from __future__ import annotations

import json
import warnings

import pytest

from flow.exceptions import RetryableError
from k8s import KubeConfig, render
from k8s.exceptions import (
    K8sApiError,
    K8sConfigError,
    K8sConfigTypeError,
    K8sError,
    K8sForbiddenError,
    K8sInvalidError,
    K8sNotFoundError,
    K8sUnavailableError,
    ManifestError,
)
from tests.k8s.conftest import configs

client = pytest.importorskip("kubernetes.client")
from k8s.backend import KINDS, KubernetesCluster, to_api_object  # noqa: E402 - needs the client
from tests.k8s.recorders import WireRecorder, recorded_cluster, status_body  # noqa: E402

SERIALIZE = client.ApiClient().sanitize_for_serialization
NS = "flowserve"
APPS = f"/apis/apps/v1/namespaces/{NS}"
CORE = f"/api/v1/namespaces/{NS}"
NET = f"/apis/networking.k8s.io/v1/namespaces/{NS}"
MODEL = {"ServiceAccount": client.V1ServiceAccount, "Service": client.V1Service,
         "StatefulSet": client.V1StatefulSet, "Deployment": client.V1Deployment,
         "NetworkPolicy": client.V1NetworkPolicy, "Secret": client.V1Secret, "Role": client.V1Role,
         "RoleBinding": client.V1RoleBinding}


def cluster_with(config: KubeConfig | None = None, wire: WireRecorder | None = None):
    return recorded_cluster(config, wire)


def all_calls(apis) -> list:
    return [c for a in apis.values() for c in a.calls]


def _quiet_render(cfg, plan=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return render(cfg, plan)


# -- manifests -> API objects ----------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(configs()))
def test_every_rendered_manifest_is_a_valid_api_object(name):
    for m in _quiet_render(configs()[name]):
        obj, kind = to_api_object(m)
        assert isinstance(obj, MODEL[m["kind"]])
        assert SERIALIZE(obj) == m  # nothing lost or changed on the way to the typed model


def test_a_field_the_model_does_not_know_is_refused_not_dropped():
    m = render()[-1]
    m["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    with pytest.raises(ManifestError, match=r"Deployment flowserve/flowserve-executor-cpu: field "
                                            r"'spec.template.spec.containers\[0\].resource' is not part of V1Deployment"):
        to_api_object(m)


def test_unsupported_kind_and_missing_name_are_manifest_errors():
    with pytest.raises(ManifestError, match=r"unsupported apiVersion/kind 'batch/v1'/'Job'; supported: .*Deployment"):
        to_api_object({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}})
    with pytest.raises(ManifestError, match="metadata.name is missing"):
        to_api_object({"apiVersion": "v1", "kind": "Service", "metadata": {}})
    with pytest.raises(ManifestError, match="not a valid V1Deployment"):
        bad = render()[-1]
        del bad["spec"]["selector"]
        to_api_object(bad)


# -- apply -----------------------------------------------------------------------------------


def test_apply_creates_each_object_with_the_typed_api_in_order(gpu_plan):
    cfg = KubeConfig(gpu_executors=1)
    manifests = render(cfg, gpu_plan)
    cluster, wire, apis = cluster_with(cfg)
    result = cluster.apply(manifests)

    assert [r["action"] for r in result] == ["created"] * len(manifests)
    assert [(r["kind"], r["name"]) for r in result] == [(m["kind"], m["metadata"]["name"]) for m in manifests]
    calls = all_calls(apis)
    expected_methods = {"ServiceAccount": "create_namespaced_service_account",
                        "NetworkPolicy": "create_namespaced_network_policy",
                        "Service": "create_namespaced_service", "StatefulSet": "create_namespaced_stateful_set",
                        "Deployment": "create_namespaced_deployment"}
    # each object went to the right typed API as the right model, equal to its manifest
    def key(call):
        return call[2]["metadata"]["name"], call[2]["kind"]

    sent = sorted(((name, args[0], SERIALIZE(args[1])) for name, args, _ in calls), key=key)
    want = sorted(((expected_methods[m["kind"]], NS, m) for m in manifests), key=key)
    assert sent == want
    for name, args, _ in calls:
        assert type(args[1]).__name__.startswith("V1")
    # and on the wire: POSTs to the collection URLs, in render (dependency) order
    assert [(r.method, r.path) for r in wire.requests] == [
        ("POST", f"{CORE}/serviceaccounts"),
        ("POST", f"{NET}/networkpolicies"), ("POST", f"{NET}/networkpolicies"), ("POST", f"{NET}/networkpolicies"),
        ("POST", f"{CORE}/services"), ("POST", f"{APPS}/statefulsets"),
        ("POST", f"{CORE}/services"), ("POST", f"{APPS}/deployments"),
        ("POST", f"{APPS}/deployments"), ("POST", f"{APPS}/deployments"),
    ]
    assert [r.body for r in wire.requests] == manifests


def test_apply_replaces_existing_objects_keeping_server_owned_fields_and_live_replicas():
    cfg = KubeConfig()
    manifests = render(cfg)
    live_svc = dict(manifests[6], metadata=dict(manifests[6]["metadata"], resourceVersion="41"),
                    spec=dict(manifests[6]["spec"], clusterIP="10.96.0.7", clusterIPs=["10.96.0.7"]))
    live_dep = dict(manifests[7], metadata=dict(manifests[7]["metadata"], resourceVersion="7"),
                    spec=dict(manifests[7]["spec"], replicas=5))
    wire = (WireRecorder()
            .reply("POST", f"{CORE}/services", 409, status_body(409, 'services "x" already exists', "AlreadyExists"))
            .reply("POST", f"{APPS}/deployments", 409, status_body(409, "already exists", "AlreadyExists"))
            .reply("GET", f"{CORE}/services/flowserve-gateway", 200, live_svc)
            .reply("GET", f"{CORE}/services/flowserve-kvs", 200,
                   dict(manifests[4], metadata=dict(manifests[4]["metadata"], resourceVersion="3"),
                        spec=dict(manifests[4]["spec"], clusterIP="10.96.0.3")))
            .reply("GET", f"{APPS}/deployments/flowserve-gateway", 200, live_dep)
            .reply("GET", f"{APPS}/deployments/flowserve-executor-cpu", 200,
                   dict(manifests[8], metadata=dict(manifests[8]["metadata"], resourceVersion="8"))))
    cluster, wire, apis = cluster_with(cfg, wire)
    result = {r["name"] + "/" + r["kind"]: r for r in cluster.apply(manifests)}

    assert result["flowserve-gateway/Deployment"] == {"kind": "Deployment", "name": "flowserve-gateway",
                                                      "namespace": NS, "action": "replaced", "kept_replicas": 5}
    assert result["flowserve-executor-cpu/Deployment"]["action"] == "replaced"
    assert "kept_replicas" not in result["flowserve-executor-cpu/Deployment"]  # live == manifest
    assert result["flowserve-kvs/StatefulSet"]["action"] == "created"
    puts = {r.path: r.body for r in wire.calls("PUT")}
    assert set(puts) == {f"{CORE}/services/flowserve-gateway", f"{CORE}/services/flowserve-kvs",
                         f"{APPS}/deployments/flowserve-gateway", f"{APPS}/deployments/flowserve-executor-cpu"}
    svc = puts[f"{CORE}/services/flowserve-gateway"]
    assert svc["metadata"]["resourceVersion"] == "41"
    assert svc["spec"]["clusterIP"] == "10.96.0.7" and svc["spec"]["clusterIPs"] == ["10.96.0.7"]
    dep = puts[f"{APPS}/deployments/flowserve-gateway"]
    assert dep["metadata"]["resourceVersion"] == "7"
    assert dep["spec"]["replicas"] == 5  # the autoscaler's count survives a re-apply
    assert dep["spec"]["template"] == manifests[7]["spec"]["template"]  # the new pod spec goes out
    # typed calls: create refused -> read -> replace(name, namespace, V1Deployment)
    names = apis["apps"].names()
    i = names.index("read_namespaced_deployment")
    assert names[i - 1:i + 2] == ["create_namespaced_deployment", "read_namespaced_deployment",
                                  "replace_namespaced_deployment"]
    _, args, _ = apis["apps"].calls[i + 1]
    assert args[:2] == ("flowserve-gateway", NS) and isinstance(args[2], client.V1Deployment)


def test_apply_can_reset_replicas_to_the_manifest():
    manifests = render()
    live = dict(manifests[7], metadata=dict(manifests[7]["metadata"], resourceVersion="7"),
                spec=dict(manifests[7]["spec"], replicas=5))
    wire = (WireRecorder().reply("POST", f"{APPS}/deployments", 409, status_body(409, "exists"))
            .reply("GET", f"{APPS}/deployments/.*", 200, live))
    cluster, wire, _ = cluster_with(wire=wire)
    cluster.apply(manifests, keep_replicas=False)
    put = wire.calls("PUT", f"{APPS}/deployments/flowserve-gateway")[0]
    assert put.body["spec"]["replicas"] == 1


def test_replacing_a_node_port_service_keeps_its_node_ports():
    cfg = KubeConfig(service_type="NodePort", token_secret="api-token")
    manifests = render(cfg)
    svc = next(m for m in manifests if m["metadata"]["name"] == "flowserve-gateway" and m["kind"] == "Service")
    live = dict(svc, metadata=dict(svc["metadata"], resourceVersion="9"),
                spec=dict(svc["spec"], clusterIP="10.96.1.1",
                          ports=[dict(svc["spec"]["ports"][0], nodePort=30080)]))
    wire = (WireRecorder().reply("POST", f"{CORE}/services", 409, status_body(409, "exists"))
            .reply("GET", f"{CORE}/services/flowserve-gateway", 200, live)
            .reply("GET", f"{CORE}/services/flowserve-kvs", 200, dict(live, metadata=dict(live["metadata"],
                                                                                         name="flowserve-kvs"))))
    cluster, wire, _ = cluster_with(cfg, wire)
    cluster.apply([svc])
    (put,) = wire.calls("PUT")
    assert put.body["spec"]["ports"][0]["nodePort"] == 30080


def test_apply_converts_everything_before_sending_anything():
    manifests = render()
    manifests[-1]["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    cluster, wire, apis = cluster_with()
    with pytest.raises(ManifestError, match=r"Deployment flowserve/flowserve-executor-cpu: field "
                                            r"'spec.template.spec.containers\[0\].imagePulPolicy'"):
        cluster.apply(manifests)
    assert wire.requests == [] and all_calls(apis) == []


def test_apply_puts_namespace_less_manifests_in_the_configured_namespace():
    m = render(KubeConfig(namespace="ml"))[0]
    del m["metadata"]["namespace"]
    cluster, wire, _ = cluster_with(KubeConfig(namespace="ml"))
    cluster.apply([m])
    assert wire.requests[0].path == "/api/v1/namespaces/ml/serviceaccounts"
    assert wire.requests[0].body["metadata"]["namespace"] == "ml"


@pytest.mark.parametrize("status,error,retryable", [
    (403, K8sForbiddenError, False), (422, K8sInvalidError, False), (503, K8sUnavailableError, True),
    (500, K8sUnavailableError, True),
])
def test_api_errors_name_the_verb_and_the_object(status, error, retryable):
    msg = 'deployments.apps is forbidden: User "ci" cannot create resource "deployments"'
    wire = WireRecorder().reply("POST", f"{APPS}/deployments", status, status_body(status, msg))
    cluster, _, _ = cluster_with(wire=wire)
    with pytest.raises(error) as info:
        cluster.apply(render())
    e = info.value
    assert f"create Deployment {NS}/flowserve-gateway failed: {status}" in str(e)
    assert msg in str(e)
    assert (e.verb, e.kind, e.namespace, e.name, e.status) == ("create", "Deployment", NS, "flowserve-gateway",
                                                               status)
    assert isinstance(e, RetryableError) is retryable
    assert isinstance(e, K8sError)


def test_no_answer_from_the_api_server_is_retryable():
    import urllib3

    class Refusing(WireRecorder):
        def request(self, method, url, **kw):
            raise urllib3.exceptions.MaxRetryError(None, url, "connection refused")

    cluster, _, _ = cluster_with(wire=Refusing())
    with pytest.raises(K8sUnavailableError, match=r"scale|patch Deployment flowserve/flowserve-gateway failed: "
                                                  r"no answer .*is the API server reachable") as info:
        cluster.scale("gateway", 2)
    assert info.value.status == 0


# -- scale ----------------------------------------------------------------------------------


def test_scale_patches_the_scale_subresource():
    scale = {"kind": "Scale", "apiVersion": "autoscaling/v1",
             "metadata": {"name": "flowserve-executor-gpu", "namespace": NS},
             "spec": {"replicas": 3}, "status": {"replicas": 1}}
    wire = WireRecorder().reply("PATCH", f"{APPS}/deployments/flowserve-executor-gpu/scale", 200, scale)
    cluster, wire, apis = cluster_with(wire=wire)
    assert cluster.scale("executor-gpu", 3) == 3
    assert apis["apps"].calls == [("patch_namespaced_deployment_scale",
                                   ("flowserve-executor-gpu", NS, {"spec": {"replicas": 3}}), {})]
    (req,) = wire.requests
    assert (req.method, req.path) == ("PATCH", f"{APPS}/deployments/flowserve-executor-gpu/scale")
    assert req.content_type == "application/strategic-merge-patch+json"
    assert req.body == {"spec": {"replicas": 3}}


def test_scale_accepts_the_deployment_name_and_zero():
    cluster, wire, _ = cluster_with(KubeConfig(name="vision"))
    cluster.scale("vision-executor-cpu", 0)
    assert wire.requests[0].path == f"{APPS}/deployments/vision-executor-cpu/scale"
    assert wire.requests[0].body == {"spec": {"replicas": 0}}


@pytest.mark.parametrize("target,replicas,error,match", [
    ("kvs", 2, K8sConfigError, r"cannot scale 'kvs': expected one of \['gateway', 'executor-cpu'"),
    ("other-gateway", 2, K8sConfigError, r"cannot scale 'other-gateway'"),
    ("gateway", -1, K8sConfigError, r"replicas must be in 0..1000, got -1"),
    ("gateway", "3", K8sConfigTypeError, r"replicas must be an int, got str '3'"),
    ("gateway", True, K8sConfigTypeError, r"replicas must be an int, got bool True"),
    (3, 1, K8sConfigTypeError, r"component must be a string, got int 3"),
])
def test_scale_rejects_bad_targets_and_counts_before_calling(target, replicas, error, match):
    cluster, wire, _ = cluster_with()
    with pytest.raises(error, match=match):
        cluster.scale(target, replicas)
    assert wire.requests == []


def test_scaling_a_missing_deployment_names_it():
    wire = WireRecorder().reply("PATCH", f"{APPS}/deployments/.*", 404,
                                status_body(404, 'deployments.apps "flowserve-executor-gpu" not found', "NotFound"))
    cluster, _, _ = cluster_with(wire=wire)
    with pytest.raises(K8sNotFoundError, match=r"patch Deployment flowserve/flowserve-executor-gpu failed: 404 "
                                               r"Not Found: deployments.apps \"flowserve-executor-gpu\" not found"):
        cluster.scale("executor-gpu", 1)


# -- delete ---------------------------------------------------------------------------------


def _list(kind: str, *names: str) -> dict:
    return {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {},
            "items": [{"metadata": {"name": n, "namespace": NS}} for n in names]}


def test_delete_removes_every_labelled_object_and_keeps_data_by_default():
    wire = (WireRecorder()
            .reply("GET", f"{APPS}/deployments", 200, _list("Deployment", "flowserve-gateway", "flowserve-executor-cpu"))
            .reply("GET", f"{APPS}/statefulsets", 200, _list("StatefulSet", "flowserve-kvs"))
            .reply("GET", f"{CORE}/services", 200, _list("Service", "flowserve-kvs", "flowserve-gateway"))
            .reply("GET", f"{NET}/networkpolicies", 200, _list("NetworkPolicy", "flowserve-kvs"))
            .reply("GET", f"{CORE}/serviceaccounts", 200, _list("ServiceAccount", "flowserve"))
            # deleted by someone else meanwhile: skipped, not an error
            .reply("DELETE", f"{CORE}/services/flowserve-kvs", 404, status_body(404, "not found")))
    cluster, wire, apis = cluster_with(wire=wire)
    deleted = cluster.delete()

    for r in wire.calls("GET"):
        assert r.query == {"labelSelector": "app.kubernetes.io/name=flowserve,app.kubernetes.io/instance=flowserve"}
    assert [r.path.split(f"{NS}/")[1] for r in wire.calls("GET")] == [
        "deployments", "statefulsets", "services", "networkpolicies", "configmaps", "rolebindings", "roles",
        "serviceaccounts"]
    assert [(d["kind"], d["name"]) for d in deleted] == [
        ("Deployment", "flowserve-gateway"), ("Deployment", "flowserve-executor-cpu"),
        ("StatefulSet", "flowserve-kvs"), ("Service", "flowserve-gateway"),
        ("NetworkPolicy", "flowserve-kvs"), ("ServiceAccount", "flowserve")]
    dels = wire.calls("DELETE")
    assert dels[0].path == f"{APPS}/deployments/flowserve-gateway"
    assert dels[0].query == {"propagationPolicy": "Foreground"}
    assert not any("persistentvolumeclaims" in r.path or "secrets" in r.path for r in wire.requests)
    assert "delete_namespaced_stateful_set" in apis["apps"].names()


def test_delete_without_keep_data_also_removes_volumes_and_secrets():
    wire = (WireRecorder()
            .reply("GET", f"{CORE}/persistentvolumeclaims", 200,
                   _list("PersistentVolumeClaim", "data-flowserve-kvs-0"))
            .reply("GET", f"{CORE}/secrets", 200, _list("Secret", "flowserve-redis")))
    cluster, wire, _ = cluster_with(wire=wire)
    deleted = cluster.delete(keep_data=False)
    assert [(d["kind"], d["name"]) for d in deleted] == [("PersistentVolumeClaim", "data-flowserve-kvs-0"),
                                                         ("Secret", "flowserve-redis")]
    assert [r.path for r in wire.calls("DELETE")] == [f"{CORE}/persistentvolumeclaims/data-flowserve-kvs-0",
                                                      f"{CORE}/secrets/flowserve-redis"]


def test_delete_stops_on_refusal_naming_the_object():
    wire = (WireRecorder().reply("GET", f"{APPS}/deployments", 200, _list("Deployment", "flowserve-gateway"))
            .reply("DELETE", f"{APPS}/deployments/flowserve-gateway", 403, status_body(403, "forbidden")))
    cluster, _, _ = cluster_with(wire=wire)
    with pytest.raises(K8sForbiddenError, match="delete Deployment flowserve/flowserve-gateway failed: 403.*RBAC"):
        cluster.delete()


# -- status ---------------------------------------------------------------------------------


def test_status_reports_replicas_per_component_and_the_gateway_address():
    manifests = render(KubeConfig(service_type="LoadBalancer", token_secret="api-token"))
    deps = [m for m in manifests if m["kind"] == "Deployment"]
    sts = next(m for m in manifests if m["kind"] == "StatefulSet")
    svc = next(m for m in manifests if m["kind"] == "Service" and m["metadata"]["name"] == "flowserve-gateway")
    wire = (WireRecorder()
            .reply("GET", f"{APPS}/deployments", 200, {
                "kind": "DeploymentList", "apiVersion": "apps/v1", "metadata": {},
                "items": [dict(deps[0], status={"replicas": 1, "readyReplicas": 1, "availableReplicas": 1,
                                                "updatedReplicas": 1}),
                          dict(deps[1], status={"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2})]})
            .reply("GET", f"{APPS}/statefulsets", 200, {"kind": "StatefulSetList", "apiVersion": "apps/v1",
                                                         "metadata": {}, "items": [dict(sts, status={"replicas": 1})]})
            .reply("GET", f"{CORE}/services/flowserve-gateway", 200,
                   dict(svc, spec=dict(svc["spec"], clusterIP="10.96.0.9"),
                        status={"loadBalancer": {"ingress": [{"ip": "203.0.113.5"}]}})))
    cluster, _, _ = cluster_with(wire=wire)
    st = cluster.status()
    assert st["namespace"] == NS and st["instance"] == "flowserve"
    assert st["components"] == {
        "kvs": {"kind": "StatefulSet", "name": "flowserve-kvs", "replicas": 1, "ready": 0, "available": 0,
                "updated": 0, "rolled_out": False},
        "gateway": {"kind": "Deployment", "name": "flowserve-gateway", "replicas": 1, "ready": 1, "available": 1,
                    "updated": 1, "rolled_out": True},
        "executor-cpu": {"kind": "Deployment", "name": "flowserve-executor-cpu", "replicas": 2, "ready": 1,
                         "available": 0, "updated": 2, "rolled_out": False},
    }
    assert st["gateway"] == {"type": "LoadBalancer", "cluster_ip": "10.96.0.9", "external": ["203.0.113.5"],
                             "port": 80}
    json.dumps(st)  # plain data


def test_status_of_an_empty_namespace():
    cluster, _, _ = cluster_with()
    assert cluster.status() == {"namespace": NS, "instance": "flowserve", "components": {}, "gateway": None}


# -- secrets --------------------------------------------------------------------------------


def test_ensure_secrets_creates_only_missing_ones_with_random_values():
    wire = WireRecorder().reply("GET", f"{CORE}/secrets/flowserve-admin", 200, {
        "kind": "Secret", "apiVersion": "v1", "metadata": {"name": "flowserve-admin", "namespace": NS}})
    cluster, wire, apis = cluster_with(wire=wire)
    assert cluster.ensure_secrets() == ["flowserve-redis"]
    (post,) = wire.calls("POST")
    assert post.path == f"{CORE}/secrets"
    assert post.body["metadata"]["name"] == "flowserve-redis"
    assert post.body["metadata"]["labels"]["app.kubernetes.io/instance"] == "flowserve"
    password = post.body["stringData"]["password"]
    assert len(password) >= 32 and password.replace("-", "").replace("_", "").isalnum()  # URL-safe
    create = next(c for c in apis["core"].calls if c[0] == "create_namespaced_secret")
    assert isinstance(create[1][1], client.V1Secret)
    cluster2, wire2, _ = cluster_with()
    cluster2.ensure_secrets()
    values = [r.body["stringData"] for r in wire2.calls("POST")]
    assert len(values) == 2 and values[0]["password"] != password  # fresh randomness each time


# -- construction ----------------------------------------------------------------------------


def test_namespace_and_image_override_the_config():
    c = KubernetesCluster(namespace="ml", image="reg.example.com/flowserve:2.0.0",
                          config=KubeConfig(name="vision"))
    assert (c.config.namespace, c.config.image, c.config.name) == ("ml", "reg.example.com/flowserve:2.0.0", "vision")
    with pytest.raises(K8sConfigError, match="namespace must be .*got 'Bad_NS'"):
        KubernetesCluster(namespace="Bad_NS")
    with pytest.raises(K8sConfigTypeError, match="config must be a k8s.KubeConfig, got dict"):
        KubernetesCluster(config={"namespace": "ml"})


def test_without_credentials_the_default_client_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    cluster = KubernetesCluster()  # nothing is contacted yet
    with pytest.raises(K8sError, match="no Kubernetes credentials"):
        cluster.status()


def test_the_package_exports_the_backend_lazily():
    import k8s

    assert k8s.KubernetesCluster is KubernetesCluster
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        k8s.Nope  # noqa: B018


def test_every_kind_maps_to_real_client_methods():
    apis = {"apps": client.AppsV1Api, "core": client.CoreV1Api, "networking": client.NetworkingV1Api,
            "rbac": client.RbacAuthorizationV1Api}
    for (version, kind_name), kind in KINDS.items():
        for verb in ("create", "read", "replace", "delete", "list"):
            assert callable(getattr(apis[kind.api], f"{verb}_{kind.suffix}")), (kind_name, verb)
        assert hasattr(client, kind.model)
    assert isinstance(K8sApiError("x"), K8sError)


# -- autoscaling: RBAC objects, replicas, baseline, pod deletion cost ---------------------------

RBAC = "/apis/rbac.authorization.k8s.io/v1/namespaces/ml"


def test_apply_sends_the_role_and_binding_through_the_rbac_api():
    cfg = configs()["autoscaling"]
    manifests = render(cfg)
    cluster, wire, apis = cluster_with(cfg)
    cluster.apply(manifests)
    assert [(r.method, r.path) for r in wire.requests[:3]] == [
        ("POST", "/api/v1/namespaces/ml/serviceaccounts"), ("POST", f"{RBAC}/roles"), ("POST", f"{RBAC}/rolebindings")]
    assert wire.requests[1].body == manifests[1] and wire.requests[2].body == manifests[2]
    assert [(name, type(args[1]).__name__) for name, args, _ in apis["rbac"].calls] == [
        ("create_namespaced_role", "V1Role"), ("create_namespaced_role_binding", "V1RoleBinding")]


def test_an_existing_role_is_replaced():
    cfg = configs()["autoscaling"]
    role = render(cfg)[1]
    wire = (WireRecorder().reply("POST", f"{RBAC}/roles", 409, status_body(409, "exists", "AlreadyExists"))
            .reply("GET", f"{RBAC}/roles/scaled-autoscaler", 200,
                   dict(role, metadata=dict(role["metadata"], resourceVersion="12"))))
    cluster, wire, _ = cluster_with(cfg, wire)
    assert cluster.apply([role])[0]["action"] == "replaced"
    (put,) = wire.calls("PUT")
    assert put.path == f"{RBAC}/roles/scaled-autoscaler" and put.body["metadata"]["resourceVersion"] == "12"


def test_delete_removes_the_rbac_objects_before_the_service_account():
    wire = (WireRecorder().reply("GET", f"{CORE}/serviceaccounts", 200, _list("ServiceAccount", "flowserve"))
            .reply("GET", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles", 200,
                   _list("Role", "flowserve-autoscaler"))
            .reply("GET", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings", 200,
                   dict(_list("RoleBinding", "flowserve-autoscaler"), items=[{  # the model requires roleRef
                       "metadata": {"name": "flowserve-autoscaler", "namespace": NS},
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                   "name": "flowserve-autoscaler"}}])))
    cluster, wire, _ = cluster_with(wire=wire)
    assert [(d["kind"], d["name"]) for d in cluster.delete()] == [
        ("RoleBinding", "flowserve-autoscaler"), ("Role", "flowserve-autoscaler"), ("ServiceAccount", "flowserve")]


def _scale(name: str, replicas) -> dict:
    spec = {} if replicas is None else {"replicas": replicas}
    return {"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": {"name": name, "namespace": NS},
            "spec": spec, "status": {"replicas": 0}}


def test_replicas_reads_the_scale_subresource():
    wire = (WireRecorder().reply("GET", f"{APPS}/deployments/flowserve-executor-cpu/scale", 200,
                                 _scale("flowserve-executor-cpu", 3))
            .reply("GET", f"{APPS}/deployments/flowserve-executor-gpu/scale", 200,
                   _scale("flowserve-executor-gpu", None)))
    cluster, wire, apis = cluster_with(wire=wire)
    assert cluster.replicas("executor-cpu") == 3
    assert cluster.replicas("flowserve-executor-gpu") == 0  # scaled to zero: the server omits the field
    assert apis["apps"].calls[0] == ("read_namespaced_deployment_scale", ("flowserve-executor-cpu", NS), {})
    assert [(r.method, r.path) for r in wire.requests] == [
        ("GET", f"{APPS}/deployments/flowserve-executor-cpu/scale"),
        ("GET", f"{APPS}/deployments/flowserve-executor-gpu/scale")]


def test_replicas_of_a_missing_deployment_or_a_bad_component():
    cluster, wire, _ = cluster_with()  # default answer to a GET of one object: 404
    with pytest.raises(K8sNotFoundError, match="read Deployment flowserve/flowserve-executor-gpu failed: 404"):
        cluster.replicas("executor-gpu")
    with pytest.raises(K8sConfigError, match="cannot scale 'kvs'"):
        cluster.replicas("kvs")
    assert len(wire.requests) == 1


def _deployment(name: str, replicas: int, annotations: dict | None = None) -> dict:
    md = {"name": name, "namespace": NS}
    if annotations:
        md["annotations"] = annotations
    return {"kind": "Deployment", "apiVersion": "apps/v1", "metadata": md,
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"a": "b"}},
                     "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}}}}


def test_baseline_replicas_come_from_the_annotation_else_the_live_count():
    wire = WireRecorder().reply("GET", f"{APPS}/deployments/flowserve-executor-cpu", 200, _deployment(
        "flowserve-executor-cpu", 5, {"flowserve.io/baseline-replicas": "2"}))
    cluster, _, _ = cluster_with(wire=wire)
    assert cluster.baseline_replicas() == {"cpu": 2, "gpu": 0}  # no GPU Deployment: 0
    wire = WireRecorder().reply("GET", f"{APPS}/deployments/flowserve-executor-.*", 200,
                                lambda req: _deployment(req.path.rsplit("/", 1)[1], 3))
    cluster, _, _ = cluster_with(wire=wire)
    assert cluster.baseline_replicas() == {"cpu": 3, "gpu": 3}


def test_a_bad_baseline_annotation_is_named():
    wire = WireRecorder().reply("GET", f"{APPS}/deployments/flowserve-executor-cpu", 200, _deployment(
        "flowserve-executor-cpu", 5, {"flowserve.io/baseline-replicas": "two"}))
    cluster, _, _ = cluster_with(wire=wire)
    with pytest.raises(K8sError, match=r"Deployment flowserve/flowserve-executor-cpu: annotation "
                                       r"flowserve.io/baseline-replicas='two' is not a replica count"):
        cluster.baseline_replicas()


def test_set_deletion_cost_patches_the_pod_annotation():
    cluster, wire, apis = cluster_with()
    cluster.set_deletion_cost("flowserve-executor-cpu-5d8c9-abcde", -1000)
    body = {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1000"}}}
    assert apis["core"].calls == [("patch_namespaced_pod", ("flowserve-executor-cpu-5d8c9-abcde", NS, body), {})]
    (req,) = wire.requests
    assert (req.method, req.path) == ("PATCH", f"{CORE}/pods/flowserve-executor-cpu-5d8c9-abcde")
    assert req.content_type == "application/strategic-merge-patch+json"
    assert req.body == body


def test_set_deletion_cost_errors():
    wire = WireRecorder().reply("PATCH", f"{CORE}/pods/.*", 404, status_body(404, 'pods "gone" not found', "NotFound"))
    cluster, wire, _ = cluster_with(wire=wire)
    with pytest.raises(K8sNotFoundError,
                       match=r'patch Pod flowserve/gone failed: 404 Not Found: pods "gone" not found'):
        cluster.set_deletion_cost("gone", -1000)
    with pytest.raises(K8sConfigTypeError, match="cost must be an int, got str '-1000'"):
        cluster.set_deletion_cost("p", "-1000")
    with pytest.raises(K8sConfigTypeError, match="pod must be a pod name, got str ''"):
        cluster.set_deletion_cost("", -1000)
    assert len(wire.requests) == 1


# -- reading Secrets, status rollout -------------------------------------------------------


def _secret(name: str, data: dict) -> dict:
    return {"kind": "Secret", "apiVersion": "v1", "metadata": {"name": name, "namespace": NS}, "data": data}


def test_read_secret_decodes_the_base64_value():
    import base64

    wire = WireRecorder().reply("GET", f"{CORE}/secrets/flowserve-admin", 200, _secret(
        "flowserve-admin", {"token": base64.b64encode("s3cret-tøken".encode()).decode()}))
    cluster, wire, apis = cluster_with(wire=wire)
    assert cluster.read_secret("flowserve-admin", "token") == "s3cret-tøken"
    assert apis["core"].calls == [("read_namespaced_secret", ("flowserve-admin", NS), {})]


def test_read_secret_errors_name_the_secret_and_key():
    wire = (WireRecorder().reply("GET", f"{CORE}/secrets/a", 200, _secret("a", {"password": "eA=="}))
            .reply("GET", f"{CORE}/secrets/b", 200, _secret("b", {"token": "not base64!"})))
    cluster, _, _ = cluster_with(wire=wire)
    with pytest.raises(K8sError, match=r"Secret flowserve/a has no key 'token' \(keys: \['password'\]\)"):
        cluster.read_secret("a", "token")
    with pytest.raises(K8sError, match="Secret flowserve/b key 'token' is not base64-encoded"):
        cluster.read_secret("b", "token")
    with pytest.raises(K8sNotFoundError, match="read Secret flowserve/c failed: 404"):
        cluster.read_secret("c", "token")


@pytest.mark.parametrize("status,generation,rolled_out", [
    ({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2},
     2, True),
    # the controller has not seen the latest spec yet: the counts are about the old one
    ({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2},
     2, False),
    # an old pod is still there
    ({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2, "readyReplicas": 3, "availableReplicas": 3},
     2, False),
    ({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 1, "availableReplicas": 1},
     2, False),
    (None, 1, False),
])
def test_status_says_whether_a_deployment_is_rolled_out(status, generation, rolled_out):
    dep = _deployment("flowserve-gateway", 2)
    dep["metadata"].update(generation=generation, labels={"app.kubernetes.io/component": "gateway"})
    if status is not None:
        dep["status"] = status
    wire = WireRecorder().reply("GET", f"{APPS}/deployments", 200, {
        "kind": "DeploymentList", "apiVersion": "apps/v1", "metadata": {}, "items": [dep]})
    cluster, _, _ = cluster_with(wire=wire)
    assert cluster.status()["components"]["gateway"]["rolled_out"] is rolled_out


def test_the_package_exports_the_scaling_backend_lazily():
    import k8s
    from k8s.scaling import KubernetesExecutors

    assert k8s.KubernetesExecutors is KubernetesExecutors
    assert issubclass(k8s.K8sNotReadyError, K8sError) and not issubclass(k8s.K8sNotReadyError, RetryableError)
    assert issubclass(k8s.K8sUnreachableError, RetryableError)
