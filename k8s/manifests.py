"""Render the Kubernetes manifests of a FlowServe cluster as plain dicts (and YAML).

    from k8s import KubeConfig, render, to_yaml
    manifests = render(KubeConfig(namespace="ml", image="reg.example.com/flowserve:0.1.0"), plan)
    open("flowserve.yaml", "w").write(to_yaml(manifests))      # review, commit, kubectl apply

What is rendered (``<name>`` is ``KubeConfig.name``), in apply order:

* ServiceAccount ``<name>`` (no API token mounted: the pods do not call the API server,
  except the gateway when ``autoscaling`` is set);
* with ``autoscaling``: Role + RoleBinding ``<name>-autoscaler`` letting that ServiceAccount
  read and scale the executor Deployments and annotate pods, nothing else;
* NetworkPolicies (``network_policies=True``): only this instance's pods reach the KVS, the
  executors' message port and the gateway's result port; the gateway's HTTP port is open;
* the KVS: Service + StatefulSet ``<name>-kvs`` running Redis with ``--requirepass`` taken
  from the Secret ``redis_secret`` (key ``password``) through the environment, so the
  password is in no manifest; a PersistentVolumeClaim keeps the data (``kvs_storage``).
  None of it with ``external_kvs``: the pods then use that store (a Sentinel set, a Redis
  Cluster, a managed Redis), with the password from the same Secret;
* the gateway: Service + Deployment ``<name>-gateway``, probes on ``GET /livez`` (startup,
  liveness: the process answers) and ``GET /readyz`` (readiness: every deployed flow has a
  warm replica of every stage), and a termination grace period that outlasts its drain
  (``gateway_grace_s``);
* the executors: Deployments ``<name>-executor-cpu`` and, when GPU executors are wanted
  (``gpu_executors``, or a GPU stage in the plan), ``<name>-executor-gpu`` requesting
  ``nvidia.com/gpu`` with the GPU node selector and tolerations.

Secrets are referenced, never rendered: create them once (``docs/kubernetes.md``) or let
``KubernetesCluster.ensure_secrets()`` generate them. Every object carries the recommended
``app.kubernetes.io/*`` labels; every pod runs as non-root with no privilege escalation,
all capabilities dropped, the RuntimeDefault seccomp profile and a read-only root
filesystem (writable ``/tmp`` and caches are emptyDir volumes).

The container commands are the runtime's contract (see ``GATEWAY_COMMAND``,
``executor_args``): executors listen for messages on ``tcp://$(POD_IP):<executor_port>`` (the pod IP
from the downward API) and get the KVS URL from the Secret. With ``autoscaling`` the gateway
also gets ``--autoscale <json> --scaler k8s --k8s-namespace <ns> --k8s-instance <name>``
(``gateway_args``) and the executor Deployments the ``flowserve.io/baseline-replicas``
annotation: the configured count, below which the autoscaler never removes executors.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Iterable, Sequence

from flow.configuration import ConfigTypeError
from k8s.kube_config import KubeConfig

PART_OF = "flowserve"
MANAGED_BY = "flowserve"
APP_NAME = "flowserve"
COMPONENTS = ("kvs", "gateway", "executor-cpu", "executor-gpu")
SCALABLE = ("gateway", "executor-cpu", "executor-gpu")  # Deployments an autoscaler may scale
APP_UID = 10001  # the Dockerfile's non-root user
REDIS_UID = 999  # the official redis image's ``redis`` user
ARTIFACT_CACHE = "/var/cache/flowserve"

GATEWAY_COMMAND = ["python", "-m", "k8s.gateway"]
EXECUTOR_COMMAND = ["python", "-m", "executors.worker.executor"]

L_NAME = "app.kubernetes.io/name"
L_INSTANCE = "app.kubernetes.io/instance"
L_COMPONENT = "app.kubernetes.io/component"
L_PART_OF = "app.kubernetes.io/part-of"
L_MANAGED_BY = "app.kubernetes.io/managed-by"
L_VERSION = "app.kubernetes.io/version"
A_FLOWS = "flowserve.io/flows"
A_GPU_STAGES = "flowserve.io/gpu-stages"
# the configured executor replicas; the live count may be higher (the autoscaler added some)
A_BASELINE = "flowserve.io/baseline-replicas"
RBAC_API = "rbac.authorization.k8s.io"


# -- labels and names ---------------------------------------------------------------------


def labels(config: KubeConfig, component: str) -> dict:
    """The recommended labels of one component's objects."""
    return {
        L_NAME: APP_NAME,
        L_INSTANCE: config.name,
        L_COMPONENT: component,
        L_PART_OF: PART_OF,
        L_MANAGED_BY: MANAGED_BY,
        L_VERSION: config.version_label,
    }


def selector(config: KubeConfig, component: str) -> dict:
    """The immutable subset of ``labels`` that selects a component's pods (no version)."""
    return {L_NAME: APP_NAME, L_INSTANCE: config.name, L_COMPONENT: component}


def instance_selector(config: KubeConfig) -> str:
    """The label selector of every object of this instance (``delete``/``status`` use it)."""
    return f"{L_NAME}={APP_NAME},{L_INSTANCE}={config.name}"


def managed_selector(config: KubeConfig) -> str:
    """The label selector of the objects ``apply`` made for this instance (what it prunes)."""
    return f"{instance_selector(config)},{L_MANAGED_BY}={MANAGED_BY}"


def object_name(config: KubeConfig, component: str) -> str:
    return f"{config.name}-{component}"


def kvs_host(config: KubeConfig) -> str:
    return f"{object_name(config, 'kvs')}.{config.namespace}.svc"


def kvs_url_template(config: KubeConfig) -> str:
    """The executors' KVS URL (the instance's own KVS, or ``external_kvs``);
    ``$(REDIS_PASSWORD)`` is expanded by Kubernetes from the Secret."""
    if config.external_kvs is None:
        return f"redis://:$(REDIS_PASSWORD)@{kvs_host(config)}:{config.redis_port}/0"
    scheme, _, rest = config.external_kvs.partition("://")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    user, at, hosts = netloc.rpartition("@")  # a user name may come before the hosts; no password
    return f"{scheme}://{user}:$(REDIS_PASSWORD)@{hosts}{tail}"


def _metadata(config: KubeConfig, name: str, component: str, annotations: dict | None = None) -> dict:
    md = {"name": name, "namespace": config.namespace, "labels": labels(config, component)}
    if annotations:
        md["annotations"] = dict(annotations)
    return md


# -- plans ---------------------------------------------------------------------------------


def _plans(plan) -> list:
    if plan is None:
        return []
    from optimizer.plan import Plan

    plans = [plan] if isinstance(plan, Plan) else plan
    if isinstance(plans, (str, bytes)) or not isinstance(plans, Iterable):
        raise ConfigTypeError(
            f"plan must be an optimizer.Plan, a list of Plans or None, got {type(plan).__name__} {plan!r:.80}"
        )
    plans = list(plans)
    for p in plans:
        if not isinstance(p, Plan):
            raise ConfigTypeError(
                f"plan must be an optimizer.Plan, a list of Plans or None, got an item {type(p).__name__} {p!r:.80}"
            )
    return plans


def gpu_stages(plans: Sequence) -> list[str]:
    """``flow/stage`` of every GPU stage of ``plans``, in plan order."""
    return [f"{p.flow_name}/{s.name}" for p in plans for s in p.stages.values() if s.device == "gpu"]


def gpu_executor_count(config: KubeConfig, plan=None) -> int:
    """GPU executor replicas: ``config.gpu_executors``, or (None) 1 when a plan has a GPU stage.

    gpu_executor_count(KubeConfig(), optimize(flow_with_gpu_stage))   # 1
    """
    plans = _plans(plan)
    if config.gpu_executors is not None:
        return config.gpu_executors
    return 1 if gpu_stages(plans) else 0


# -- pods ----------------------------------------------------------------------------------


def _container_security(read_only: bool = True) -> dict:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only,
        "runAsNonRoot": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod_security(uid: int) -> dict:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _secret_env(name: str, secret: str, key: str) -> dict:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _field_env(name: str, path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _common_env(config: KubeConfig) -> list[dict]:
    """POD_NAME/POD_IP (downward API), the KVS password (Secret) and the KVS URL built from it.

    Order matters: Kubernetes expands ``$(VAR)`` only from variables defined earlier."""
    env = [
        _field_env("POD_NAME", "metadata.name"),
        _field_env("POD_IP", "status.podIP"),
        _secret_env("REDIS_PASSWORD", config.redis_secret_name, "password"),
        {"name": "FLOWSERVE_KVS_URL", "value": kvs_url_template(config)},
        # plans are signed with it and checked before they are unpickled (kvs.serialization)
        _secret_env("FLOWSERVE_CLUSTER_KEY", config.cluster_key_secret_name, "key"),
        {"name": "HOME", "value": "/tmp"},
        {"name": "TMPDIR", "value": "/tmp"},
    ]
    env += [{"name": k, "value": v} for k, v in sorted(config.env.items())]
    return env


def _pod_spec(
    config: KubeConfig,
    containers: list[dict],
    volumes: list[dict],
    *,
    uid: int = APP_UID,
    grace_s: int = 30,
    node_selector: dict | None = None,
    tolerations: list | None = None,
) -> dict:
    spec = {
        "serviceAccountName": config.name,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(uid),
        "terminationGracePeriodSeconds": grace_s,
        "containers": containers,
        "volumes": volumes,
    }
    if config.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in config.image_pull_secrets]
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = list(tolerations)
    return spec


def _tmp_volume(size: str = "1Gi") -> dict:
    return {"name": "tmp", "emptyDir": {"sizeLimit": size}}


def _deployment(
    config: KubeConfig,
    component: str,
    replicas: int,
    pod_spec: dict,
    annotations: dict | None = None,
    surge: bool = True,
) -> dict:
    """``surge``: roll out by adding a pod first (no capacity dip); False for GPU pods,
    whose extra pod could wait forever for a free GPU: replace one at a time instead."""
    name = object_name(config, component)
    rolling = {"maxSurge": 1, "maxUnavailable": 0} if surge else {"maxSurge": 0, "maxUnavailable": 1}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(config, name, component, annotations),
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector(config, component)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
            "template": {"metadata": {"labels": labels(config, component)}, "spec": pod_spec},
        },
    }


def _service(config: KubeConfig, component: str, ports: list[dict], service_type: str = "ClusterIP") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(config, object_name(config, component), component),
        "spec": {"type": service_type, "selector": selector(config, component), "ports": ports},
    }


# -- components ----------------------------------------------------------------------------


def service_account(config: KubeConfig) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(config, config.name, "service-account"),
        "automountServiceAccountToken": False,
    }


def kvs(config: KubeConfig) -> list[dict]:
    """Redis: a Service and a one-replica StatefulSet; the password comes from the Secret."""
    component = "kvs"
    name = object_name(config, component)
    env = [
        _secret_env("REDIS_PASSWORD", config.redis_secret_name, "password"),
        _secret_env("REDISCLI_AUTH", config.redis_secret_name, "password"),
    ]  # for the probe's redis-cli
    ping = {"exec": {"command": ["sh", "-c", f'test "$(redis-cli -p {config.redis_port} ping)" = PONG']}}
    container = {
        "name": "redis",
        "image": config.redis_image,
        "imagePullPolicy": config.image_pull_policy,
        "command": ["redis-server"],
        # $(REDIS_PASSWORD) is expanded by the kubelet: the manifest never holds the password
        "args": [
            "--port",
            str(config.redis_port),
            "--requirepass",
            "$(REDIS_PASSWORD)",
            "--dir",
            "/data",
            "--appendonly",
            "yes" if config.kvs_storage else "no",
        ],
        "env": env,
        "ports": [{"name": "redis", "containerPort": config.redis_port, "protocol": "TCP"}],
        "resources": config.kvs_resources.to_k8s(),
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "tmp", "mountPath": "/tmp"}],
        "livenessProbe": {
            "tcpSocket": {"port": "redis"},
            "initialDelaySeconds": 5,
            "periodSeconds": 10,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            **ping,
            "initialDelaySeconds": 2,
            "periodSeconds": 5,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
    }
    volumes = [_tmp_volume("256Mi")]
    if config.kvs_storage is None:
        volumes.insert(0, {"name": "data", "emptyDir": {}})
    spec = {
        "serviceName": name,
        "replicas": 1,
        "selector": {"matchLabels": selector(config, component)},
        "template": {
            "metadata": {"labels": labels(config, component)},
            "spec": _pod_spec(config, [container], volumes, uid=REDIS_UID, grace_s=30),
        },
    }
    if config.kvs_storage is not None:
        pvc_spec = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": config.kvs_storage}}}
        if config.storage_class is not None:
            pvc_spec["storageClassName"] = config.storage_class
        # volumeClaimTemplates cannot change after creation: no version label here, so an
        # upgrade (new image tag) can still replace the StatefulSet
        spec["volumeClaimTemplates"] = [
            {"metadata": {"name": "data", "labels": selector(config, component)}, "spec": pvc_spec}
        ]
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(config, name, component),
        "spec": spec,
    }
    service = _service(
        config, component, [{"name": "redis", "port": config.redis_port, "targetPort": "redis", "protocol": "TCP"}]
    )
    return [service, statefulset]


def gateway_args(config: KubeConfig) -> list[str]:
    """The gateway's arguments in a pod: listen on all interfaces, receive results over TCP,
    find the executors through their registration in the KVS (not by spawning them); with
    ``autoscaling``, run the autoscaler and scale this instance's executor Deployments, the
    replica that does it elected through the Lease ``<name>-leader`` (k8s/leadership.py)."""
    args = [
        "--host",
        "0.0.0.0",
        "--port",
        str(config.gateway_port),
        "--address",
        f"tcp://$(POD_IP):{config.gateway_results_port}",
        "--membership",
        "kvs",
    ]  # the KVS URL comes from $FLOWSERVE_KVS_URL: no password in argv
    settings = dict(config.gateway_settings)
    if config.busy_poll_ms != KubeConfig.busy_poll_ms:  # the runtime's default: nothing to say
        settings["busy_poll_ms"] = config.busy_poll_ms
    if settings:
        args += ["--config", json.dumps(settings, sort_keys=True)]
    if config.autoscaling is not None:
        args += [
            "--autoscale",
            autoscale_json(config),
            "--scaler",
            "k8s",
            "--leader-election",
            "k8s",
            "--k8s-namespace",
            config.namespace,
            "--k8s-instance",
            config.name,
        ]
    return args


def autoscale_json(config: KubeConfig) -> str:
    """``config.autoscaling`` as the compact JSON ``--autoscale`` takes
    (``AutoscalingConfig.from_json`` reads it back)."""
    return json.dumps(config.autoscaling.to_json(), separators=(",", ":"))


DRAIN_MARGIN_S = 15  # past the drain: uvicorn's own shutdown, the store's client, the process's exit


def gateway_grace_s(config: KubeConfig) -> int:
    """The gateway pod's ``terminationGracePeriodSeconds``: on SIGTERM the gateway refuses
    new requests (and /readyz turns 503) and answers those in flight for up to its
    ``request_timeout_s``, then exits; the kubelet waits this long before a SIGKILL."""
    from executors.hosts.cluster_config import ClusterConfig

    drain = float(config.gateway_settings.get("request_timeout_s", ClusterConfig().request_timeout_s))
    return int(-(-drain // 1)) + DRAIN_MARGIN_S


def gateway(config: KubeConfig) -> list[dict]:
    """The HTTP gateway: a Service (``service_type``) and a Deployment: alive while /livez
    answers (the process; an executor that is down is no reason to restart the gateway),
    ready (taking traffic) while /readyz says every deployed flow has a warm replica of
    every stage, and given the time to drain on SIGTERM (``gateway_grace_s``)."""
    component = "gateway"
    env = _common_env(config)
    env.append(_secret_env("FLOWSERVE_ADMIN_TOKEN", config.admin_secret_name, "token"))
    if config.token_secret is not None:
        env.append(_secret_env("FLOWSERVE_TOKEN", config.token_secret, "token"))
    probe = {"httpGet": {"path": "/livez", "port": "http"}, "timeoutSeconds": 2}
    container = {
        "name": "gateway",
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": list(GATEWAY_COMMAND),
        "args": gateway_args(config),
        "env": env,
        "ports": [
            {"name": "http", "containerPort": config.gateway_port, "protocol": "TCP"},
            {"name": "results", "containerPort": config.gateway_results_port, "protocol": "TCP"},
        ],
        "resources": config.gateway_resources.to_k8s(),
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "startupProbe": {**probe, "periodSeconds": 2, "failureThreshold": 60},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {
            **probe,
            "httpGet": {"path": "/readyz", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
    }
    pod = _pod_spec(config, [container], [_tmp_volume("256Mi")], grace_s=gateway_grace_s(config))
    if config.autoscaling is not None:
        # the autoscaler calls the API server with the ServiceAccount's token (bound by
        # rbac()); only the gateway pods get it, the executors stay without
        pod["automountServiceAccountToken"] = True
    deployment = _deployment(config, component, config.gateway_replicas, pod)
    service = _service(
        config,
        component,
        [{"name": "http", "port": config.service_port, "targetPort": "http", "protocol": "TCP"}],
        config.service_type,
    )
    return [service, deployment]


def executor_args(config: KubeConfig, device: str) -> list[str]:
    """``python -m executors.worker.executor`` arguments in a pod: the pod name as id, messages on the
    pod IP (downward API). The KVS URL (with the password from the Secret) is read from
    ``$FLOWSERVE_KVS_URL``, so it does not appear in the process's arguments."""
    args = [
        "--id",
        "$(POD_NAME)",
        "--address",
        f"tcp://$(POD_IP):{config.executor_port}",
        "--device",
        device,
        "--threads",
        str(config.executor_threads),
    ]
    if config.busy_poll_ms != KubeConfig.busy_poll_ms:  # the runtime's default: nothing to say
        args += ["--busy-poll-ms", f"{config.busy_poll_ms:g}"]
    if config.executor_cache_bytes != KubeConfig.executor_cache_bytes:
        args += ["--cache-bytes", str(config.executor_cache_bytes)]
    return args


def executors(config: KubeConfig, device: str, replicas: int, annotations: dict | None = None) -> dict:
    """One executor Deployment for ``device`` ("cpu" or "gpu")."""
    component = f"executor-{device}"
    gpu = device == "gpu"
    env = _common_env(config)
    env.append({"name": "FLOWSERVE_ARTIFACT_CACHE", "value": ARTIFACT_CACHE})
    if config.s3_endpoint is not None:
        env.append({"name": "FLOWSERVE_S3_ENDPOINT", "value": config.s3_endpoint})
    probe = {"tcpSocket": {"port": "messages"}, "timeoutSeconds": 2}
    resources = config.gpu_executor_resources if gpu else config.cpu_executor_resources
    container = {
        "name": "executor",
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": list(EXECUTOR_COMMAND),
        "args": executor_args(config, device),
        "env": env,
        "ports": [{"name": "messages", "containerPort": config.executor_port, "protocol": "TCP"}],
        "resources": resources.to_k8s(gpus=config.gpus_per_executor if gpu else 0),
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "artifacts", "mountPath": ARTIFACT_CACHE}],
        # models may take minutes to load: the startup probe allows 10 minutes
        "startupProbe": {**probe, "periodSeconds": 5, "failureThreshold": 120},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 2},
    }
    if config.s3_secret is not None:
        container["envFrom"] = [{"secretRef": {"name": config.s3_secret}}]
    volumes = [_tmp_volume("2Gi"), {"name": "artifacts", "emptyDir": {"sizeLimit": config.artifact_cache_size}}]
    pod = _pod_spec(
        config,
        [container],
        volumes,
        grace_s=60,
        node_selector=dict(config.gpu_node_selector) if gpu else None,
        tolerations=[t.to_k8s() for t in config.gpu_tolerations] if gpu else None,
    )
    return _deployment(config, component, replicas, pod, annotations, surge=not gpu)


def rbac(config: KubeConfig) -> list[dict]:
    """Role + RoleBinding for the gateway's autoscaler: read and scale this instance's
    executor Deployments, and annotate pods (``controller.kubernetes.io/pod-deletion-cost``)
    so a scale-down removes the drained executor. Pods cannot be named in advance (the
    ReplicaSet names them), Deployments can: the Role grants only those two. And the Lease
    that elects the replica running the autoscaler (``<name>-leader``): get and update it by
    name; create, which a Role cannot narrow to a name (the first replica creates it)."""
    name = f"{config.name}-autoscaler"
    deployments = [object_name(config, "executor-cpu"), object_name(config, "executor-gpu")]
    lease = object_name(config, "leader")
    role = {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "Role",
        "metadata": _metadata(config, name, "autoscaler"),
        "rules": [
            {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": deployments, "verbs": ["get"]},
            {
                "apiGroups": ["apps"],
                "resources": ["deployments/scale"],
                "resourceNames": deployments,
                "verbs": ["get", "patch", "update"],
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": [lease],
                "verbs": ["get", "update"],
            },
        ],
    }
    binding = {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(config, name, "autoscaler"),
        "subjects": [{"kind": "ServiceAccount", "name": config.name, "namespace": config.namespace}],
        "roleRef": {"apiGroup": RBAC_API, "kind": "Role", "name": name},
    }
    return [role, binding]


def network_policies(config: KubeConfig) -> list[dict]:
    """Ingress rules: the KVS and the executors' message port only from this instance's pods,
    the gateway's result port likewise; the gateway's HTTP port from anywhere."""
    peers = [{"podSelector": {"matchLabels": {L_NAME: APP_NAME, L_INSTANCE: config.name}}}]

    def policy(suffix: str, component_sel: dict, ingress: list) -> dict:
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _metadata(config, f"{config.name}-{suffix}", "network-policy"),
            "spec": {"podSelector": component_sel, "policyTypes": ["Ingress"], "ingress": ingress},
        }

    def tcp(port) -> list:
        return [{"protocol": "TCP", "port": port}]

    exec_sel = {
        "matchLabels": {L_NAME: APP_NAME, L_INSTANCE: config.name},
        "matchExpressions": [{"key": L_COMPONENT, "operator": "In", "values": ["executor-cpu", "executor-gpu"]}],
    }
    kvs = (
        []
        if config.external_kvs is not None
        else [  # an external store's access is its operator's
            policy("kvs", {"matchLabels": selector(config, "kvs")}, [{"from": peers, "ports": tcp(config.redis_port)}])
        ]
    )
    return [
        *kvs,
        policy("executors", exec_sel, [{"from": peers, "ports": tcp(config.executor_port)}]),
        policy(
            "gateway",
            {"matchLabels": selector(config, "gateway")},
            [{"ports": tcp(config.gateway_port)}, {"from": peers, "ports": tcp(config.gateway_results_port)}],
        ),
    ]


# -- everything ----------------------------------------------------------------------------


def render(config: KubeConfig | None = None, plan=None) -> list[dict]:
    """All manifests of one FlowServe instance, in apply order, as plain dicts.

    ``plan``: an ``optimizer.Plan`` (or a list of them) to size the GPU executors from
    (``gpu_executors=None``) and to annotate the executors with the flows they serve.

        manifests = render(KubeConfig(gpu_executors=2))
        [m["kind"] for m in manifests]   # ServiceAccount, NetworkPolicy x3, Service, StatefulSet, ...
    """
    if config is None:
        config = KubeConfig()
    elif not isinstance(config, KubeConfig):
        raise ConfigTypeError(f"config must be a k8s.KubeConfig, got {type(config).__name__} {config!r:.80}")
    plans = _plans(plan)
    need_gpu = gpu_stages(plans)
    n_gpu = gpu_executor_count(config, plans)
    if need_gpu and n_gpu == 0:
        warnings.warn(f"GPU stages {need_gpu} but gpu_executors=0: they will run on CPU executors", stacklevel=2)
    if config.service_type != "ClusterIP" and config.token_secret is None:
        warnings.warn(
            f"service_type={config.service_type!r} exposes the gateway outside the cluster without "
            f"a bearer token: set token_secret",
            stacklevel=2,
        )
    annotations = {}
    if plans:
        annotations[A_FLOWS] = ",".join(sorted({p.flow_name for p in plans}))
    scaling = config.autoscaling is not None
    out = [service_account(config)]
    if scaling:
        out += rbac(config)
    if config.network_policies:
        out += network_policies(config)
    if config.external_kvs is None:
        out += kvs(config)
    out += gateway(config)
    cpu_ann = dict(annotations, **({A_BASELINE: str(config.cpu_executors)} if scaling else {}))
    out.append(executors(config, "cpu", config.cpu_executors, cpu_ann))
    if n_gpu:
        gpu_ann = dict(annotations, **({A_BASELINE: str(n_gpu)} if scaling else {}))
        if need_gpu:
            gpu_ann[A_GPU_STAGES] = ",".join(need_gpu)
        out.append(executors(config, "gpu", n_gpu, gpu_ann))
    # one independent tree per object: editing one manifest must not change another
    return copy.deepcopy(out)


def to_yaml(manifests: Sequence[dict]) -> str:
    """Multi-document YAML (``---`` between objects), keys in rendering order.

    Uses PyYAML when installed, else writes each object as JSON (which is valid YAML).

        print(to_yaml(render()))
    """
    docs = list(manifests)
    for i, m in enumerate(docs):
        if not isinstance(m, dict):
            raise ConfigTypeError(f"manifest #{i} must be a dict, got {type(m).__name__} {m!r:.80}")
    header = "# Rendered by `flowserve k8s render`; Secrets are referenced, not included.\n"
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML comes with the kubernetes client
        return header + "".join("---\n" + json.dumps(m, indent=2) + "\n" for m in docs)

    class _Dumper(yaml.SafeDumper):  # no &anchors / *aliases: reviewers read every object in full
        def ignore_aliases(self, data):
            return True

    return header + yaml.dump_all(
        docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, explicit_start=True, width=120
    )
