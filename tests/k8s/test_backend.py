"""KubernetesCluster where no API server is needed or a real one cannot answer on demand.

Conversion to the client's models and argument checks need no server; 5xx/429, no answer
at all, malformed annotations and Secrets, and intermediate rollout states are scripted
through a recorder (the client's real typed APIs, HTTP transport replaced). Everything a
real API server can answer (apply, re-apply, prune, scale, status, wait, delete, 403, 404,
422) is tested against one in test_real_backend.py, test_real_scaling.py and
test_deploy_runtime.py.
"""

from __future__ import annotations

import warnings

import pytest

from flow.configuration import ConfigError, ConfigTypeError
from flow.errors import (
    AccessDeniedError,
    DeadlineExceededError,
    FlowError,
    FlowValueError,
    InternalError,
    RetryableError,
    UnavailableError,
    UnreachableError,
)
from k8s import KubeConfig, render
from k8s.errors import K8sConflictError, K8sNotFoundError, api_error_for
from tests.k8s.conftest import configs

client = pytest.importorskip("kubernetes.client")
from k8s.backend import KINDS, KubernetesCluster, to_api_object  # noqa: E402 - needs the client
from tests.k8s.recorders import WireRecorder, recorded_cluster, status_body  # noqa: E402

SERIALIZE = client.ApiClient().sanitize_for_serialization
NS = "flowserve"
APPS = f"/apis/apps/v1/namespaces/{NS}"
CORE = f"/api/v1/namespaces/{NS}"
NET = f"/apis/networking.k8s.io/v1/namespaces/{NS}"
MODEL = {
    "ServiceAccount": client.V1ServiceAccount,
    "Service": client.V1Service,
    "StatefulSet": client.V1StatefulSet,
    "Deployment": client.V1Deployment,
    "NetworkPolicy": client.V1NetworkPolicy,
    "Secret": client.V1Secret,
    "Role": client.V1Role,
    "RoleBinding": client.V1RoleBinding,
}


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
    with pytest.raises(
        FlowValueError,
        match=r"Deployment flowserve/flowserve-executor-cpu: field "
        r"'spec.template.spec.containers\[0\].resource' is not part of V1Deployment",
    ):
        to_api_object(m)


def test_unsupported_kind_and_missing_name_are_manifest_errors():
    with pytest.raises(FlowValueError, match=r"unsupported apiVersion/kind 'batch/v1'/'Job'; supported: .*Deployment"):
        to_api_object({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}})
    with pytest.raises(FlowValueError, match="metadata.name is missing"):
        to_api_object({"apiVersion": "v1", "kind": "Service", "metadata": {}})
    with pytest.raises(FlowValueError, match="not a valid V1Deployment"):
        bad = render()[-1]
        del bad["spec"]["selector"]
        to_api_object(bad)


# -- apply -----------------------------------------------------------------------------------


def test_apply_converts_everything_before_sending_anything():
    manifests = render()
    manifests[-1]["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    cluster, wire, apis = cluster_with()
    with pytest.raises(
        FlowValueError,
        match=r"Deployment flowserve/flowserve-executor-cpu: field "
        r"'spec.template.spec.containers\[0\].imagePulPolicy'",
    ):
        cluster.apply(manifests)
    assert wire.requests == [] and all_calls(apis) == []


# 403, 404, 409 and 422 come from the real API server (test_real_backend.py); the overload
# answers a real server cannot give on demand are scripted here
@pytest.mark.parametrize(
    "status,error,retryable",
    [
        (503, UnavailableError, True),
        (500, UnavailableError, True),
        (429, UnavailableError, True),
    ],
)
def test_api_errors_name_the_verb_and_the_object(status, error, retryable):
    msg = "the server is currently unable to handle the request"
    wire = WireRecorder().reply("PATCH", f"{APPS}/deployments/flowserve-gateway", status, status_body(status, msg))
    cluster, _, _ = cluster_with(wire=wire)
    with pytest.raises(error) as info:
        cluster.apply(render())
    e = info.value
    assert f"patch Deployment {NS}/flowserve-gateway failed: {status}" in str(e)
    assert msg in str(e)
    assert (e.verb, e.kind, e.namespace, e.name, e.status) == ("patch", "Deployment", NS, "flowserve-gateway", status)
    assert isinstance(e, RetryableError) is retryable
    assert isinstance(e, FlowError)


def test_no_answer_from_the_api_server_is_retryable():
    import urllib3

    class Refusing(WireRecorder):
        def request(self, method, url, **kw):
            raise urllib3.exceptions.MaxRetryError(None, url, "connection refused")

    cluster, _, _ = cluster_with(wire=Refusing())
    with pytest.raises(
        UnreachableError,
        match=r"scale|patch Deployment flowserve/flowserve-gateway failed: "
        r"no answer .*is the API server reachable",
    ) as info:
        cluster.scale("gateway", 2)
    assert info.value.status == 0


# -- scale ----------------------------------------------------------------------------------


def test_scale_accepts_the_deployment_name_and_zero():
    cluster, wire, _ = cluster_with(KubeConfig(name="vision"))
    cluster.scale("vision-executor-cpu", 0)
    assert wire.requests[0].path == f"{APPS}/deployments/vision-executor-cpu/scale"
    assert wire.requests[0].body == {"spec": {"replicas": 0}}


@pytest.mark.parametrize(
    "target,replicas,error,match",
    [
        ("kvs", 2, ConfigError, r"cannot scale 'kvs': expected one of \['gateway', 'executor-cpu'"),
        ("other-gateway", 2, ConfigError, r"cannot scale 'other-gateway'"),
        ("gateway", -1, ConfigError, r"replicas must be in 0..1000, got -1"),
        ("gateway", "3", ConfigTypeError, r"replicas must be an int, got str '3'"),
        ("gateway", True, ConfigTypeError, r"replicas must be an int, got bool True"),
        (3, 1, ConfigTypeError, r"component must be a string, got int 3"),
    ],
)
def test_scale_rejects_bad_targets_and_counts_before_calling(target, replicas, error, match):
    cluster, wire, _ = cluster_with()
    with pytest.raises(error, match=match):
        cluster.scale(target, replicas)
    assert wire.requests == []


# -- delete ---------------------------------------------------------------------------------


def _list(kind: str, *names: str) -> dict:
    return {
        "kind": f"{kind}List",
        "apiVersion": "v1",
        "metadata": {},
        "items": [{"metadata": {"name": n, "namespace": NS}} for n in names],
    }


# -- status ---------------------------------------------------------------------------------


def test_status_of_an_empty_namespace():
    cluster, _, _ = cluster_with()
    assert cluster.status() == {"namespace": NS, "instance": "flowserve", "components": {}, "gateway": None}


# -- secrets --------------------------------------------------------------------------------


# -- construction ----------------------------------------------------------------------------


def test_namespace_and_image_override_the_config():
    c = KubernetesCluster(namespace="ml", image="reg.example.com/flowserve:2.0.0", config=KubeConfig(name="vision"))
    assert (c.config.namespace, c.config.image, c.config.name) == ("ml", "reg.example.com/flowserve:2.0.0", "vision")
    with pytest.raises(ConfigError, match="namespace must be .*got 'Bad_NS'"):
        KubernetesCluster(namespace="Bad_NS")
    with pytest.raises(ConfigTypeError, match="config must be a k8s.KubeConfig, got dict"):
        KubernetesCluster(config={"namespace": "ml"})


def test_without_credentials_the_default_client_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))
    cluster = KubernetesCluster()  # nothing is contacted yet
    with pytest.raises(AccessDeniedError, match="no Kubernetes credentials"):
        cluster.status()


def test_the_package_exports_the_backend_lazily():
    import k8s

    assert k8s.KubernetesCluster is KubernetesCluster
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        k8s.Nope  # noqa: B018


def test_every_kind_maps_to_real_client_methods():
    apis = {
        "apps": client.AppsV1Api,
        "core": client.CoreV1Api,
        "networking": client.NetworkingV1Api,
        "rbac": client.RbacAuthorizationV1Api,
    }
    for (_version, kind_name), kind in KINDS.items():
        for verb in ("create", "read", "replace", "delete", "list"):
            assert callable(getattr(apis[kind.api], f"{verb}_{kind.suffix}")), (kind_name, verb)
        assert hasattr(client, kind.model)
    for status, cls in [
        (404, K8sNotFoundError),
        (409, K8sConflictError),
        (403, AccessDeniedError),
        (422, FlowValueError),
    ]:
        assert api_error_for(status) is cls
    assert api_error_for(0) is UnreachableError and api_error_for(418) is InternalError


# -- autoscaling: RBAC objects, replicas, baseline, pod deletion cost ---------------------------

RBAC = "/apis/rbac.authorization.k8s.io/v1/namespaces/ml"


def test_delete_removes_the_rbac_objects_before_the_service_account():
    wire = (
        WireRecorder()
        .reply("GET", f"{CORE}/serviceaccounts", 200, _list("ServiceAccount", "flowserve"))
        .reply(
            "GET",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles",
            200,
            _list("Role", "flowserve-autoscaler"),
        )
        .reply(
            "GET",
            f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings",
            200,
            dict(
                _list("RoleBinding", "flowserve-autoscaler"),
                items=[
                    {  # the model requires roleRef
                        "metadata": {"name": "flowserve-autoscaler", "namespace": NS},
                        "roleRef": {
                            "apiGroup": "rbac.authorization.k8s.io",
                            "kind": "Role",
                            "name": "flowserve-autoscaler",
                        },
                    }
                ],
            ),
        )
    )
    cluster, wire, _ = cluster_with(wire=wire)
    assert [(d["kind"], d["name"]) for d in cluster.delete()] == [
        ("RoleBinding", "flowserve-autoscaler"),
        ("Role", "flowserve-autoscaler"),
        ("ServiceAccount", "flowserve"),
    ]


def _scale(name: str, replicas) -> dict:
    spec = {} if replicas is None else {"replicas": replicas}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
        "status": {"replicas": 0},
    }


def test_replicas_reads_the_scale_subresource():
    wire = (
        WireRecorder()
        .reply("GET", f"{APPS}/deployments/flowserve-executor-cpu/scale", 200, _scale("flowserve-executor-cpu", 3))
        .reply("GET", f"{APPS}/deployments/flowserve-executor-gpu/scale", 200, _scale("flowserve-executor-gpu", None))
    )
    cluster, wire, apis = cluster_with(wire=wire)
    assert cluster.replicas("executor-cpu") == 3
    assert cluster.replicas("flowserve-executor-gpu") == 0  # scaled to zero: the server omits the field
    assert apis["apps"].calls[0] == ("read_namespaced_deployment_scale", ("flowserve-executor-cpu", NS), {})
    assert [(r.method, r.path) for r in wire.requests] == [
        ("GET", f"{APPS}/deployments/flowserve-executor-cpu/scale"),
        ("GET", f"{APPS}/deployments/flowserve-executor-gpu/scale"),
    ]


def test_replicas_of_a_missing_deployment_or_a_bad_component():
    cluster, wire, _ = cluster_with()  # default answer to a GET of one object: 404
    with pytest.raises(K8sNotFoundError, match="read Deployment flowserve/flowserve-executor-gpu failed: 404"):
        cluster.replicas("executor-gpu")
    with pytest.raises(ConfigError, match="cannot scale 'kvs'"):
        cluster.replicas("kvs")
    assert len(wire.requests) == 1


def _deployment(name: str, replicas: int, annotations: dict | None = None) -> dict:
    md = {"name": name, "namespace": NS}
    if annotations:
        md["annotations"] = annotations
    return {
        "kind": "Deployment",
        "apiVersion": "apps/v1",
        "metadata": md,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}},
        },
    }


def test_baseline_replicas_come_from_the_annotation_else_the_live_count():
    wire = WireRecorder().reply(
        "GET",
        f"{APPS}/deployments/flowserve-executor-cpu",
        200,
        _deployment("flowserve-executor-cpu", 5, {"flowserve.io/baseline-replicas": "2"}),
    )
    cluster, _, _ = cluster_with(wire=wire)
    assert cluster.baseline_replicas() == {"cpu": 2, "gpu": 0}  # no GPU Deployment: 0
    wire = WireRecorder().reply(
        "GET", f"{APPS}/deployments/flowserve-executor-.*", 200, lambda req: _deployment(req.path.rsplit("/", 1)[1], 3)
    )
    cluster, _, _ = cluster_with(wire=wire)
    assert cluster.baseline_replicas() == {"cpu": 3, "gpu": 3}


def test_a_bad_baseline_annotation_is_named():
    wire = WireRecorder().reply(
        "GET",
        f"{APPS}/deployments/flowserve-executor-cpu",
        200,
        _deployment("flowserve-executor-cpu", 5, {"flowserve.io/baseline-replicas": "two"}),
    )
    cluster, _, _ = cluster_with(wire=wire)
    with pytest.raises(
        InternalError,
        match=r"Deployment flowserve/flowserve-executor-cpu: annotation "
        r"flowserve.io/baseline-replicas='two' is not a replica count",
    ):
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
    with pytest.raises(
        K8sNotFoundError, match=r'patch Pod flowserve/gone failed: 404 Not Found: pods "gone" not found'
    ):
        cluster.set_deletion_cost("gone", -1000)
    with pytest.raises(ConfigTypeError, match="cost must be an int, got str '-1000'"):
        cluster.set_deletion_cost("p", "-1000")
    with pytest.raises(ConfigTypeError, match="pod must be a pod name, got str ''"):
        cluster.set_deletion_cost("", -1000)
    assert len(wire.requests) == 1


# -- reading Secrets, status rollout -------------------------------------------------------


def _secret(name: str, data: dict) -> dict:
    return {"kind": "Secret", "apiVersion": "v1", "metadata": {"name": name, "namespace": NS}, "data": data}


def test_read_secret_decodes_the_base64_value():
    import base64

    wire = WireRecorder().reply(
        "GET",
        f"{CORE}/secrets/flowserve-admin",
        200,
        _secret("flowserve-admin", {"token": base64.b64encode("s3cret-tøken".encode()).decode()}),
    )
    cluster, wire, apis = cluster_with(wire=wire)
    assert cluster.read_secret("flowserve-admin", "token") == "s3cret-tøken"
    assert apis["core"].calls == [("read_namespaced_secret", ("flowserve-admin", NS), {})]


def test_read_secret_errors_name_the_secret_and_key():
    wire = (
        WireRecorder()
        .reply("GET", f"{CORE}/secrets/a", 200, _secret("a", {"password": "eA=="}))
        .reply("GET", f"{CORE}/secrets/b", 200, _secret("b", {"token": "not base64!"}))
    )
    cluster, _, _ = cluster_with(wire=wire)
    with pytest.raises(ConfigError, match=r"Secret flowserve/a has no key 'token' \(keys: \['password'\]\)"):
        cluster.read_secret("a", "token")
    with pytest.raises(ConfigError, match="Secret flowserve/b key 'token' is not base64-encoded"):
        cluster.read_secret("b", "token")
    with pytest.raises(K8sNotFoundError, match="read Secret flowserve/c failed: 404"):
        cluster.read_secret("c", "token")


@pytest.mark.parametrize(
    "status,generation,rolled_out",
    [
        (
            {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2},
            2,
            True,
        ),
        # the controller has not seen the latest spec yet: the counts are about the old one
        (
            {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2},
            2,
            False,
        ),
        # an old pod is still there
        (
            {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2, "readyReplicas": 3, "availableReplicas": 3},
            2,
            False,
        ),
        (
            {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 1, "availableReplicas": 1},
            2,
            False,
        ),
        (None, 1, False),
    ],
)
def test_status_says_whether_a_deployment_is_rolled_out(status, generation, rolled_out):
    dep = _deployment("flowserve-gateway", 2)
    dep["metadata"].update(generation=generation, labels={"app.kubernetes.io/component": "gateway"})
    if status is not None:
        dep["status"] = status
    wire = WireRecorder().reply(
        "GET",
        f"{APPS}/deployments",
        200,
        {"kind": "DeploymentList", "apiVersion": "apps/v1", "metadata": {}, "items": [dep]},
    )
    cluster, _, _ = cluster_with(wire=wire)
    assert cluster.status()["components"]["gateway"]["rolled_out"] is rolled_out


def test_the_package_exports_the_scaling_backend_lazily():
    import k8s
    from k8s.scaling import KubernetesExecutors

    assert k8s.KubernetesExecutors is KubernetesExecutors
    assert not issubclass(DeadlineExceededError, RetryableError)  # not ready in time: wait longer or give up
    assert issubclass(UnreachableError, RetryableError)
