"""Rendered manifests: valid against the official Kubernetes schemas, and shaped as intended.

Schema validation uses kubernetes-validate (strict: unknown fields are errors) with the
schemas it ships; a guard proves no network is used. Nothing is applied to a cluster.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import socket
import warnings

import pytest

from executors.hosts.autoscale import AutoscalingConfig
from flow.configuration import ConfigError, ConfigTypeError
from k8s import KubeConfig, render, to_yaml
from k8s.manifests import A_BASELINE, A_FLOWS, A_GPU_STAGES, SCALABLE, executor_args, gateway_args, selector
from tests.k8s.conftest import K8S_VERSIONS, configs

yaml = pytest.importorskip("yaml")
kv = pytest.importorskip("kubernetes_validate")

RECOMMENDED = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
)


def _render(name: str, plan=None) -> list[dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the LoadBalancer/NodePort configs warn on purpose elsewhere
        return render(configs()[name], plan)


@pytest.fixture
def nonetwork(monkeypatch):
    """Any attempt to open a network connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def by_kind(manifests, kind):
    return [m for m in manifests if m["kind"] == kind]


def named(manifests, name, kind=None):
    """The object called ``name`` (a workload when several kinds share the name)."""
    found = [m for m in manifests if m["metadata"]["name"] == name and (kind is None or m["kind"] == kind)]
    found.sort(key=lambda m: m["kind"] not in ("Deployment", "StatefulSet"))
    return found[0]


def workloads(manifests):
    return [m for m in manifests if m["kind"] in ("Deployment", "StatefulSet")]


def containers(m):
    return m["spec"]["template"]["spec"]["containers"]


# -- schema validation ---------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(configs()))
def test_every_manifest_validates_against_the_official_schema(name, version, nonetwork):
    for m in _render(name):
        kv.validate(m, version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_rendered_from_a_gpu_plan_validate(gpu_plan, version, nonetwork):
    manifests = render(KubeConfig(), gpu_plan)
    assert "Deployment" in {m["kind"] for m in manifests}
    for m in manifests:
        kv.validate(m, version, strict=True)


def test_the_validator_checks_the_rbac_objects(nonetwork):
    role, binding = by_kind(_render("autoscaling"), "Role") + by_kind(_render("autoscaling"), "RoleBinding")
    role["rules"][0]["verb"] = ["get"]
    with pytest.raises(kv.ValidationError, match="verb"):
        kv.validate(role, K8S_VERSIONS[0], strict=True)
    del binding["roleRef"]
    with pytest.raises(kv.ValidationError, match="roleRef"):
        kv.validate(binding, K8S_VERSIONS[0], strict=True)


def test_the_validator_is_not_vacuous(nonetwork):
    """A misspelt field and a wrong type are caught: the schema check has teeth."""
    m = _render("cpu-default")[-1]
    containers(m)[0]["imagePulPolicy"] = "Always"
    with pytest.raises(kv.ValidationError, match="imagePulPolicy"):
        kv.validate(m, K8S_VERSIONS[-1], strict=True)
    m = _render("cpu-default")[-1]
    m["spec"]["replicas"] = "2"
    with pytest.raises(kv.ValidationError):
        kv.validate(m, K8S_VERSIONS[-1], strict=True)


# -- what is rendered ----------------------------------------------------------------------


def test_default_config_renders_cpu_only_cluster():
    manifests = _render("cpu-default")
    kinds = [(m["kind"], m["metadata"]["name"]) for m in manifests]
    assert kinds == [
        ("ServiceAccount", "flowserve"),
        ("NetworkPolicy", "flowserve-kvs"),
        ("NetworkPolicy", "flowserve-executors"),
        ("NetworkPolicy", "flowserve-gateway"),
        ("Service", "flowserve-kvs"),
        ("StatefulSet", "flowserve-kvs"),
        ("Service", "flowserve-gateway"),
        ("Deployment", "flowserve-gateway"),
        ("Deployment", "flowserve-executor-cpu"),
    ]
    assert all(m["metadata"]["namespace"] == "flowserve" for m in manifests)
    assert named(manifests, "flowserve-executor-cpu")["spec"]["replicas"] == 2
    assert named(manifests, "flowserve-gateway")["spec"]["replicas"] == 1


@pytest.mark.parametrize("name", sorted(configs()))
def test_recommended_labels_on_every_object_and_pod(name):
    cfg = configs()[name]
    for m in _render(name):
        lab = m["metadata"]["labels"]
        assert set(RECOMMENDED) <= set(lab), m["metadata"]["name"]
        assert lab["app.kubernetes.io/instance"] == cfg.name
        assert lab["app.kubernetes.io/part-of"] == "flowserve"
        assert lab["app.kubernetes.io/managed-by"] == "flowserve"
        assert lab["app.kubernetes.io/version"] == cfg.version_label
        if m["kind"] in ("Deployment", "StatefulSet"):
            pod_labels = m["spec"]["template"]["metadata"]["labels"]
            assert pod_labels == lab
            sel = m["spec"]["selector"]["matchLabels"]
            assert sel.items() <= pod_labels.items()
            assert "app.kubernetes.io/version" not in sel  # selectors are immutable: no version in them


def test_version_label_follows_the_image_tag_or_the_override():
    assert KubeConfig(image="reg.example.com/flowserve:1.2.3").version_label == "1.2.3"
    assert KubeConfig(image="flowserve@sha256:" + "b" * 64).version_label == "0.1.0"
    assert KubeConfig(image="flowserve:1.2.3", version="canary").version_label == "canary"


@pytest.mark.parametrize("name", sorted(configs()))
def test_every_container_is_locked_down_and_has_resources(name):
    scaler = configs()[name].autoscaling is not None
    for m in workloads(_render(name)):
        pod = m["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        # only an autoscaling gateway calls the API server
        component = m["metadata"]["labels"]["app.kubernetes.io/component"]
        assert pod["automountServiceAccountToken"] is (scaler and component == "gateway")
        volumes = {v["name"] for v in pod["volumes"]}
        volumes |= {t["metadata"]["name"] for t in m["spec"].get("volumeClaimTemplates", [])}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["privileged"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert {"cpu", "memory"} <= set(c["resources"]["requests"])
            assert {m_["mountPath"] for m_ in c["volumeMounts"]} >= {"/tmp"}  # writable scratch space
            assert {m_["name"] for m_ in c["volumeMounts"]} <= volumes
            assert ":latest" not in c["image"]
            port_names = {p["name"] for p in c["ports"]}
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if probe in c:
                    port = (c[probe].get("httpGet") or c[probe].get("tcpSocket") or {}).get("port")
                    assert port is None or port in port_names, (c["name"], probe, port)


@pytest.mark.parametrize("name", sorted(configs()))
def test_limits_are_set_everywhere(name):
    for m in workloads(_render(name)):
        for c in containers(m):
            assert {"cpu", "memory"} <= set(c["resources"]["limits"])


def test_limits_default_to_the_requests():
    ex = containers(named(_render("minimal"), "fs-executor-cpu"))[0]
    assert ex["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "100m", "memory": "128Mi"},
    }


@pytest.mark.parametrize("name", sorted(configs()))
def test_env_references_are_defined_before_use(name):
    """Kubernetes expands $(VAR) only from variables defined earlier (or for args: at all)."""
    for m in workloads(_render(name)):
        for c in containers(m):
            defined = []
            for e in c["env"]:
                for ref in re.findall(r"\$\((\w+)\)", e.get("value", "")):
                    assert ref in defined, (c["name"], e["name"], ref)
                defined.append(e["name"])
            for arg in c.get("command", []) + c.get("args", []):
                for ref in re.findall(r"\$\((\w+)\)", arg):
                    assert ref in defined, (c["name"], arg)


@pytest.mark.parametrize("name", sorted(configs()))
def test_secrets_are_referenced_never_inlined(name):
    cfg = configs()[name]
    manifests = _render(name)
    assert not by_kind(manifests, "Secret")
    refs = set()
    for m in workloads(manifests):
        for c in containers(m):
            for e in c["env"]:
                if re.search(r"PASSWORD|TOKEN|AUTH|SECRET|KEY", e["name"]):
                    assert "value" not in e, e  # only ever from a secretKeyRef
                    refs.add((e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"]))
    expected = {
        (cfg.redis_secret_name, "password"),
        (cfg.admin_secret_name, "token"),
        (cfg.cluster_key_secret_name, "key"),
    }
    if cfg.token_secret:
        expected.add((cfg.token_secret, "token"))
    assert refs == expected


def test_redis_requires_the_password_from_the_secret():
    manifests = _render("cpu-default")
    sts = named(manifests, "flowserve-kvs")
    assert sts["kind"] == "StatefulSet"
    (redis,) = containers(sts)
    args = redis["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    env = {e["name"]: e for e in redis["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "flowserve-redis", "key": "password"}
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    # volumeClaimTemplates cannot change later: no version label there
    assert "app.kubernetes.io/version" not in sts["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"]
    svc = named([m for m in manifests if m["kind"] == "Service"], "flowserve-kvs")
    assert svc["spec"]["selector"] == selector(configs()["cpu-default"], "kvs")
    assert svc["spec"]["ports"][0]["port"] == 6379


def test_kvs_without_storage_uses_an_empty_dir_and_no_aof():
    sts = named(_render("minimal"), "fs-kvs")
    assert "volumeClaimTemplates" not in sts["spec"]
    assert {"name": "data", "emptyDir": {}} in sts["spec"]["template"]["spec"]["volumes"]
    args = containers(sts)[0]["args"]
    assert args[args.index("--appendonly") + 1] == "no"


def test_gateway_is_probed_on_livez_and_readyz_and_exposed_by_its_service():
    cfg = configs()["gpu"]
    manifests = _render("gpu")
    dep = named(by_kind(manifests, "Deployment"), "vision-gateway")
    (gw,) = containers(dep)
    for probe in ("livenessProbe", "startupProbe"):  # the process answers: nothing a restart would not lose
        assert gw[probe]["httpGet"] == {"path": "/livez", "port": "http"}
    assert gw["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # the kubelet waits out the drain (the request timeout, 30 s) and the process's exit
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45
    assert dep["spec"]["replicas"] == 2
    assert gw["command"] == ["python", "-m", "k8s.gateway"]
    assert "tcp://$(POD_IP):5556" in gw["args"]
    env = {e["name"]: e for e in gw["env"]}
    assert env["FLOWSERVE_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "vision-api-token", "key": "token"}
    assert env["FLOWSERVE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "vision-admin", "key": "token"}
    svc = named(by_kind(manifests, "Service"), "vision-gateway")
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["ports"] == [{"name": "http", "port": cfg.service_port, "targetPort": "http", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == selector(cfg, "gateway")


def test_executors_listen_on_the_pod_ip_and_read_the_kvs_url_from_the_secret():
    dep = named(_render("cpu-default"), "flowserve-executor-cpu")
    (ex,) = containers(dep)
    assert ex["command"] == ["python", "-m", "executors.worker.executor"]
    args = ex["args"]
    assert args[args.index("--address") + 1] == "tcp://$(POD_IP):5555"
    assert "--kvs" not in args  # the URL holds the password: from the environment, not argv
    assert args[args.index("--device") + 1] == "cpu"
    assert args[args.index("--id") + 1] == "$(POD_NAME)"
    env = {e["name"]: e for e in ex["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["FLOWSERVE_KVS_URL"]["value"] == "redis://:$(REDIS_PASSWORD)@flowserve-kvs.flowserve.svc:6379/0"
    assert "nvidia.com/gpu" not in ex["resources"]["requests"]
    pod = dep["spec"]["template"]["spec"]
    assert "tolerations" not in pod and "nodeSelector" not in pod


def test_gpu_executors_request_gpus_and_carry_node_placement():
    cfg = configs()["gpu"]
    manifests = _render("gpu")
    dep = named(manifests, "vision-executor-gpu")
    assert dep["spec"]["replicas"] == 2
    (ex,) = containers(dep)
    assert ex["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert ex["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert ex["resources"]["requests"]["cpu"] == "4"
    assert ex["args"][ex["args"].index("--device") + 1] == "gpu"
    pod = dep["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute", "tolerationSeconds": 300},
    ]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    # a surge pod would wait for a free GPU: GPU executors roll one at a time instead
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert named(manifests, "vision-executor-cpu")["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }
    assert ex["envFrom"] == [{"secretRef": {"name": cfg.s3_secret}}]
    env = {e["name"]: e.get("value") for e in ex["env"]}
    assert env["FLOWSERVE_S3_ENDPOINT"] == "http://minio.storage:9000"
    assert env["FLOWSERVE_LOG_LEVEL"] == "INFO"


def test_a_gpu_plan_adds_one_gpu_executor_and_names_its_stages(gpu_plan):
    manifests = render(KubeConfig(), gpu_plan)
    dep = named(manifests, "flowserve-executor-gpu")
    assert dep["spec"]["replicas"] == 1
    assert dep["metadata"]["annotations"] == {A_FLOWS: "ensemble", A_GPU_STAGES: "ensemble/net"}
    assert named(manifests, "flowserve-executor-cpu")["metadata"]["annotations"] == {A_FLOWS: "ensemble"}


def test_a_cpu_plan_renders_no_gpu_executors(cpu_plan, gpu_plan):
    manifests = render(KubeConfig(), [cpu_plan])
    assert "flowserve-executor-gpu" not in {m["metadata"]["name"] for m in manifests}
    # explicit replicas win over the plan
    assert named(render(KubeConfig(gpu_executors=3), cpu_plan), "flowserve-executor-gpu")["spec"]["replicas"] == 3


def test_gpu_stages_with_zero_gpu_executors_warn(gpu_plan):
    with pytest.warns(UserWarning, match=r"GPU stages \['ensemble/net'\] but gpu_executors=0"):
        manifests = render(KubeConfig(gpu_executors=0), gpu_plan)
    assert "flowserve-executor-gpu" not in {m["metadata"]["name"] for m in manifests}


def test_an_exposed_gateway_without_a_token_warns():
    with pytest.warns(UserWarning, match="without a bearer token"):
        render(KubeConfig(service_type="LoadBalancer"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        render(KubeConfig(service_type="LoadBalancer", token_secret="api-token"))


def testnetwork_policies_admit_only_the_instance_pods():
    manifests = _render("cpu-default")
    pols = {m["metadata"]["name"]: m["spec"] for m in by_kind(manifests, "NetworkPolicy")}
    peers = [
        {
            "podSelector": {
                "matchLabels": {"app.kubernetes.io/name": "flowserve", "app.kubernetes.io/instance": "flowserve"}
            }
        }
    ]
    assert pols["flowserve-kvs"]["ingress"] == [{"from": peers, "ports": [{"protocol": "TCP", "port": 6379}]}]
    assert pols["flowserve-executors"]["ingress"] == [{"from": peers, "ports": [{"protocol": "TCP", "port": 5555}]}]
    assert pols["flowserve-gateway"]["ingress"][0] == {"ports": [{"protocol": "TCP", "port": 8000}]}
    assert not by_kind(_render("minimal"), "NetworkPolicy")


def test_render_returns_independent_objects():
    manifests = _render("cpu-default")
    gw, ex = named(manifests, "flowserve-gateway"), named(manifests, "flowserve-executor-cpu")
    containers(gw)[0]["env"].clear()
    containers(ex)[0]["securityContext"]["privileged"] = True
    assert containers(named(manifests, "flowserve-executor-cpu"))[0]["env"]
    assert containers(gw)[0]["securityContext"]["privileged"] is False
    assert _render("cpu-default") == _render("cpu-default")


def test_render_rejects_what_is_not_a_config_or_plan():
    with pytest.raises(ConfigTypeError, match="config must be a k8s.KubeConfig, got dict"):
        render({"namespace": "x"})
    with pytest.raises(ConfigTypeError, match="plan must be an optimizer.Plan"):
        render(KubeConfig(), plan="ensemble")
    with pytest.raises(ConfigTypeError, match="got an item int"):
        render(KubeConfig(), plan=[1])


def test_scalable_components_are_the_rendered_deployments():
    names = {m["metadata"]["name"] for m in by_kind(_render("gpu"), "Deployment")}
    assert names == {f"vision-{c}" for c in SCALABLE}


# -- autoscaling ---------------------------------------------------------------------------


def test_autoscaling_gateway_runs_the_k8s_scaler_with_the_config_as_json():
    cfg = configs()["autoscaling"]
    (gw,) = containers(named(_render("autoscaling"), "scaled-gateway", "Deployment"))
    args = gw["args"]
    base = ["--host", "0.0.0.0", "--port", "8000", "--address", "tcp://$(POD_IP):5556", "--membership", "kvs"]
    assert args[: len(base)] == base
    assert args[len(base) :] == [
        "--autoscale",
        args[len(base) + 1],
        "--scaler",
        "k8s",
        "--leader-election",
        "k8s",
        "--k8s-namespace",
        "ml",
        "--k8s-instance",
        "scaled",
    ]
    doc = json.loads(args[len(base) + 1])
    assert doc == dataclasses.asdict(cfg.autoscaling)
    assert doc["max_replicas"] == 4 and doc["target_utilisation"] == 0.6
    assert AutoscalingConfig.from_json(doc) == cfg.autoscaling  # what the gateway reads back
    assert " " not in args[len(base) + 1]  # compact: one argument, readable in `ps`


def test_autoscaling_from_plain_data_renders_the_same_json():
    (gw,) = containers(named(_render("autoscaling-minimal"), "tiny-gateway", "Deployment"))
    doc = json.loads(gw["args"][gw["args"].index("--autoscale") + 1])
    assert doc == dataclasses.asdict(AutoscalingConfig(target_utilisation=None, target_queue_per_replica=4))


def test_autoscaling_renders_a_role_limited_to_scaling_the_executors():
    manifests = _render("autoscaling")
    assert [(m["kind"], m["metadata"]["name"]) for m in manifests[:3]] == [
        ("ServiceAccount", "scaled"),
        ("Role", "scaled-autoscaler"),
        ("RoleBinding", "scaled-autoscaler"),
    ]
    (role,) = by_kind(manifests, "Role")
    (binding,) = by_kind(manifests, "RoleBinding")
    executors = ["scaled-executor-cpu", "scaled-executor-gpu"]
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": executors, "verbs": ["get"]},
        {
            "apiGroups": ["apps"],
            "resources": ["deployments/scale"],
            "resourceNames": executors,
            "verbs": ["get", "patch", "update"],
        },
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]},
        # the Lease electing the replica that runs the autoscaler: by name but for create
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["scaled-leader"],
            "verbs": ["get", "update"],
        },
    ]
    assert role["metadata"]["namespace"] == "ml"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "scaled", "namespace": "ml"}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "scaled-autoscaler"}
    # the ServiceAccount still mounts no token by default: the gateway pod opts in alone
    assert manifests[0]["automountServiceAccountToken"] is False
    assert (
        named(manifests, "scaled-gateway", "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"]
        is True
    )


def test_autoscaling_annotates_the_executors_with_their_baseline(gpu_plan):
    manifests = _render("autoscaling")
    assert named(manifests, "scaled-executor-cpu")["metadata"]["annotations"] == {A_BASELINE: "2"}
    assert named(manifests, "scaled-executor-gpu")["metadata"]["annotations"] == {A_BASELINE: "1"}
    # the GPU count a plan decides is the GPU baseline
    from_plan = render(KubeConfig(autoscaling={}), gpu_plan)
    assert named(from_plan, "flowserve-executor-gpu")["metadata"]["annotations"] == {
        A_FLOWS: "ensemble",
        A_GPU_STAGES: "ensemble/net",
        A_BASELINE: "1",
    }


def _without_autoscaling(manifests: list[dict]) -> list[dict]:
    """``manifests`` with exactly the autoscaling additions taken out again."""
    out = [copy.deepcopy(m) for m in manifests if m["kind"] not in ("Role", "RoleBinding")]
    for m in workloads(out):
        m["spec"]["template"]["spec"]["automountServiceAccountToken"] = False
        (m["metadata"].get("annotations") or {}).pop(A_BASELINE, None)
        if m["metadata"].get("annotations") == {}:
            del m["metadata"]["annotations"]
        for c in containers(m):
            if "--autoscale" in c["args"]:
                del c["args"][c["args"].index("--autoscale") :]
    return out


@pytest.mark.parametrize("name", ["autoscaling", "autoscaling-minimal"])
def test_autoscaling_changes_nothing_else(name, gpu_plan):
    cfg = configs()[name]
    for plan in (None, gpu_plan):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scaled, fixed = render(cfg, plan), render(cfg.replace(autoscaling=None), plan)
        assert scaled != fixed
        assert _without_autoscaling(scaled) == fixed


@pytest.mark.parametrize("name", ["cpu-default", "gpu", "minimal"])
def test_without_autoscaling_no_rbac_no_token_no_scaler_args(name):
    manifests = _render(name)
    assert not by_kind(manifests, "Role") and not by_kind(manifests, "RoleBinding")
    for m in workloads(manifests):
        assert m["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
        assert A_BASELINE not in (m["metadata"].get("annotations") or {})
        for c in containers(m):
            assert not {"--autoscale", "--scaler", "--k8s-namespace"} & set(c["args"])


# -- YAML ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(configs()))
def test_to_yaml_round_trips_without_aliases(name):
    manifests = _render(name)
    text = to_yaml(manifests)
    assert text.startswith("# Rendered by `flowserve k8s render`")
    assert "&id" not in text and "*id" not in text
    assert list(yaml.safe_load_all(text)) == manifests
    assert text.count("\n---\n") == len(manifests)


def test_to_yaml_rejects_non_dicts():
    with pytest.raises(ConfigTypeError, match="manifest #1 must be a dict, got str"):
        to_yaml([{"kind": "Service"}, "kind: Service"])


# -- busy polling ----------------------------------------------------------------------------


def test_busy_polling_defaults_to_the_runtimes_and_renders_nothing_extra():
    from executors.hosts.cluster_config import ClusterConfig
    from executors.wire.busypoll import DEFAULT_MS

    assert KubeConfig.busy_poll_ms == DEFAULT_MS == ClusterConfig.busy_poll_ms
    assert "--busy-poll-ms" not in executor_args(KubeConfig(), "cpu")
    assert "--config" not in gateway_args(KubeConfig())


def test_busy_polling_off_reaches_the_gateway_and_the_executors():
    from executors.hosts.cluster_config import ClusterConfig

    cfg = KubeConfig(busy_poll_ms=0)
    args = executor_args(cfg, "cpu")
    assert args[args.index("--busy-poll-ms") + 1] == "0"
    gw = gateway_args(cfg)
    assert ClusterConfig.from_json(json.loads(gw[gw.index("--config") + 1])).busy_poll_ms == 0


def test_gateway_settings_reach_the_gateway_as_the_runtime_reads_them():
    from executors.hosts.cluster_config import ClusterConfig

    cfg = KubeConfig(gateway_settings={"idle_timeout_s": 75, "request_timeout_s": 10}, busy_poll_ms=0)
    gw = gateway_args(cfg)
    read = ClusterConfig.from_json(json.loads(gw[gw.index("--config") + 1]))
    assert (read.idle_timeout_s, read.request_timeout_s, read.busy_poll_ms) == (75, 10, 0)
    assert KubeConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"idle_timeout_s": 0}, "KubeConfig.gateway_settings: ClusterConfig.idle_timeout_s must be a number > 0"),
        ({"token": "x" * 16}, "KubeConfig.gateway_settings: ['token'] are not gateway settings"),
        ({"executors": 2}, "KubeConfig.gateway_settings: ['executors'] are not gateway settings"),
        ([1], "KubeConfig.gateway_settings must be a mapping"),
    ],
)
def test_gateway_settings_are_checked_when_the_config_is_made(bad, message):
    with pytest.raises((ValueError, TypeError)) as e:
        KubeConfig(gateway_settings=bad)
    assert str(e.value).startswith(message), str(e.value)


def test_executor_cache_size_reaches_the_executors_and_matches_the_local_default():
    from executors.hosts.cluster_config import ClusterConfig
    from executors.worker.executor import DEFAULT_CACHE_BYTES

    assert KubeConfig.executor_cache_bytes == ClusterConfig.executor_cache_bytes == DEFAULT_CACHE_BYTES
    assert "--cache-bytes" not in executor_args(KubeConfig(), "cpu")
    args = executor_args(KubeConfig(executor_cache_bytes=64 << 20), "gpu")
    assert args[args.index("--cache-bytes") + 1] == str(64 << 20)
    with pytest.raises(ValueError, match="executor_cache_bytes"):
        KubeConfig(executor_cache_bytes=-1)


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (5000, ValueError), ("10", TypeError), (True, TypeError)])
def test_busy_polling_refuses_bad_values(bad, error):
    with pytest.raises(error, match="busy_poll_ms"):
        KubeConfig(busy_poll_ms=bad)


def test_the_gateways_grace_period_outlasts_its_drain():
    short = KubeConfig(gateway_settings={"request_timeout_s": 9.5})
    dep = named(by_kind(render(short), "Deployment"), "flowserve-gateway")
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 10 + 15


# -- an external store ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, expected",
    [
        (
            "redis+sentinel://sentinel-0.db:26379,sentinel-1.db:26379/flowserve/0",
            "redis+sentinel://:$(REDIS_PASSWORD)@sentinel-0.db:26379,sentinel-1.db:26379/flowserve/0",
        ),
        (
            "redis+cluster://app@node-0.db:7000,node-1.db:7000",
            "redis+cluster://app:$(REDIS_PASSWORD)@node-0.db:7000,node-1.db:7000",
        ),
        (
            "rediss://managed.example.com:6380/0?wait_replicas=1",
            "rediss://:$(REDIS_PASSWORD)@managed.example.com:6380/0?wait_replicas=1",
        ),
    ],
)
def test_an_external_store_replaces_the_instances_own(url, expected):
    cfg = KubeConfig(external_kvs=url)
    manifests = render(cfg)
    own = render(KubeConfig())
    assert not [m for m in manifests if "kvs" in m["metadata"]["name"]]  # no StatefulSet, Service, policy
    assert {m["kind"] for m in own if "kvs" in m["metadata"]["name"]} == {"StatefulSet", "Service", "NetworkPolicy"}
    assert len(manifests) == len(own) - 3
    for dep in by_kind(manifests, "Deployment"):  # the gateway and the executors
        env = {e["name"]: e for e in containers(dep)[0]["env"]}
        assert env["FLOWSERVE_KVS_URL"]["value"] == expected
        assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "flowserve-redis", "key": "password"}


def test_an_external_store_url_is_checked_and_never_holds_the_password():
    with pytest.raises(
        ConfigError, match=r"external_kvs must not hold a password .* got 'redis\+cluster://:\*\*\*@n:1'"
    ):
        KubeConfig(external_kvs="redis+cluster://:hunter2@n:1")
    with pytest.raises(ConfigError, match="host 'n' has no port"):
        KubeConfig(external_kvs="redis+cluster://n")
    with pytest.raises(ConfigError, match="external_kvs must be None or a string: a redis://"):
        KubeConfig(external_kvs="http://n:1")
    assert KubeConfig(kvs_url="redis+sentinel://localhost:26379/flowserve").kvs_url  # deploy's URL: any form too
