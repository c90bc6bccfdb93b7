"""Settings of a Kubernetes deployment: one frozen, validated object with documented defaults.

    from k8s import KubeConfig, Resources
    cfg = KubeConfig(namespace="ml", image="registry.example.com/flowserve:0.1.0",
                     gpu_executors=2, service_type="LoadBalancer", token_secret="flowserve-token")

Every field is checked when the object is built; a bad value raises ``K8sConfigError``
(a ``ValueError``) or ``K8sConfigTypeError`` (a ``TypeError``) naming the field and
quoting the value, like ``executors.config.ClusterConfig``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping
from urllib.parse import urlsplit

from k8s.exceptions import K8sConfigError, K8sConfigTypeError
from kvs.redact import redact_url  # one redaction for every package (k8s.backend imports it from here)

if TYPE_CHECKING:  # importing the runtime costs ~0.3 s: only when autoscaling is configured
    from executors.autoscale import AutoscalingConfig


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("flowserve")
    except Exception:  # not installed (a source checkout on sys.path)
        return "0.1.0"


PACKAGE_VERSION = _package_version()
DEFAULT_IMAGE = f"flowserve:{PACKAGE_VERSION}"
# Redis >= 7.4: redis-py's client-side caching (the executors' CachedKVS) refuses older servers.
DEFAULT_REDIS_IMAGE = "redis:7.4-alpine"
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# repository[:tag][@sha256:digest]; the repository may start with a registry host[:port]
_IMAGE = re.compile(
    r"^(?P<repo>[a-zA-Z0-9][a-zA-Z0-9.-]*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*"
    r"|[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*)"
    r"(:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(@(?P<digest>sha256:[0-9a-f]{64}))?$")
_QUANTITY = re.compile(r"^(?P<num>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {"": 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
           "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}

MAX_NAME = 40  # leaves room for "-executor-gpu" and the pod hash within 63 characters


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_quantity(value: str) -> Decimal:
    """The number a Kubernetes quantity string stands for: ``"500m"`` -> 0.5, ``"1Gi"`` -> 2**30.

    Raises ``ValueError`` for anything else (no exponents, no signs: requests are positive).

        parse_quantity("250m")   # Decimal('0.250')
    """
    m = _QUANTITY.match(value) if isinstance(value, str) else None
    if m is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. '500m', '2', '512Mi', '4Gi')")
    try:
        return Decimal(m["num"]) * _SUFFIX[m["suffix"] or ""]
    except InvalidOperation:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None


def _check_quantity(owner: str, fname: str, value, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise K8sConfigTypeError(f"{owner}.{fname} must be a quantity string such as '500m' or '1Gi', "
                                 f"got {type(value).__name__} {value!r}")
    try:
        q = parse_quantity(value)
    except ValueError as e:
        raise K8sConfigError(f"{owner}.{fname}: {e}") from None
    if q <= 0:
        raise K8sConfigError(f"{owner}.{fname} must be > 0, got {value!r}")


@dataclass(frozen=True)
class Resources:
    """CPU and memory one container requests (scheduling) and may use at most (limits).

    cpu / memory: requests, Kubernetes quantities (``"500m"``, ``"2"``, ``"512Mi"``, ``"4Gi"``).
    cpu_limit / memory_limit: limits (None: equal to the request, so every container has
    limits). A limit below its request is an error.

        Resources(cpu="2", memory="4Gi", cpu_limit="4", memory_limit="8Gi")
        Resources(cpu="2", memory="4Gi")       # limits 2 CPUs and 4Gi (Guaranteed QoS)
    """

    cpu: str = "500m"
    memory: str = "512Mi"
    cpu_limit: str | None = None
    memory_limit: str | None = None

    def __post_init__(self):
        for f in ("cpu", "memory"):
            _check_quantity("Resources", f, getattr(self, f), optional=False)
        for f, req in (("cpu_limit", "cpu"), ("memory_limit", "memory")):
            v = getattr(self, f)
            _check_quantity("Resources", f, v, optional=True)
            if v is not None and parse_quantity(v) < parse_quantity(getattr(self, req)):
                raise K8sConfigError(f"Resources.{f}={v!r} is below the request {req}={getattr(self, req)!r}")

    def to_k8s(self, gpus: int = 0) -> dict:
        """The container's ``resources`` block; ``gpus`` adds ``nvidia.com/gpu`` to both
        requests and limits (an extended resource must have them equal)."""
        requests = {"cpu": self.cpu, "memory": self.memory}
        limits = {"cpu": self.cpu_limit or self.cpu, "memory": self.memory_limit or self.memory}
        if gpus:
            requests["nvidia.com/gpu"] = str(gpus)
            limits["nvidia.com/gpu"] = str(gpus)
        return {"requests": requests, "limits": limits}


@dataclass(frozen=True)
class Toleration:
    """A pod toleration (which node taints the GPU executors accept).

        Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    """

    key: str | None = None
    operator: str = "Exists"
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None

    def __post_init__(self):
        if self.key is not None and not _label_key_ok(self.key):
            raise K8sConfigError(f"Toleration.key must be a label key such as 'nvidia.com/gpu', got {self.key!r}")
        if self.operator not in TOLERATION_OPERATORS:
            raise K8sConfigError(f"Toleration.operator must be one of {TOLERATION_OPERATORS}, got {self.operator!r}")
        if self.operator == "Exists" and self.value is not None:
            raise K8sConfigError(f"Toleration with operator 'Exists' takes no value, got value={self.value!r}")
        if self.operator == "Equal" and (not isinstance(self.value, str) or not _LABEL_VALUE.match(self.value)):
            raise K8sConfigError(f"Toleration with operator 'Equal' needs a label value, got value={self.value!r}")
        if self.key is None and self.operator != "Exists":
            raise K8sConfigError(f"Toleration without a key must use operator 'Exists', got {self.operator!r}")
        if self.effect is not None and self.effect not in TOLERATION_EFFECTS:
            raise K8sConfigError(f"Toleration.effect must be None or one of {TOLERATION_EFFECTS}, got {self.effect!r}")
        if self.toleration_seconds is not None:
            if not _int(self.toleration_seconds) or self.toleration_seconds < 0:
                raise K8sConfigError(f"Toleration.toleration_seconds must be an int >= 0, "
                                     f"got {self.toleration_seconds!r}")
            if self.effect != "NoExecute":
                raise K8sConfigError(f"Toleration.toleration_seconds only applies to effect 'NoExecute', "
                                     f"got effect={self.effect!r}")

    @classmethod
    def from_dict(cls, doc: Mapping) -> "Toleration":
        """From the Kubernetes spelling: ``{"key": ..., "operator": ..., "tolerationSeconds": ...}``."""
        if not isinstance(doc, Mapping):
            raise K8sConfigTypeError(f"a toleration must be a Toleration or a mapping, got {type(doc).__name__} {doc!r}")
        names = {"key": "key", "operator": "operator", "value": "value", "effect": "effect",
                 "tolerationSeconds": "toleration_seconds", "toleration_seconds": "toleration_seconds"}
        unknown = sorted(set(doc) - set(names))
        if unknown:
            raise K8sConfigError(f"toleration {dict(doc)!r}: unknown field(s) {unknown}")
        return cls(**{names[k]: v for k, v in doc.items()})

    def to_k8s(self) -> dict:
        out = {"key": self.key} if self.key is not None else {}
        out["operator"] = self.operator
        if self.value is not None:
            out["value"] = self.value
        if self.effect is not None:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


def _label_key_ok(key) -> bool:
    if not isinstance(key, str) or not key:
        return False
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_LABEL_NAME.match(name))


def label_value_ok(value) -> bool:
    return isinstance(value, str) and len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def image_tag(image: str) -> str | None:
    """The tag of an image reference (None when it has none)."""
    m = _IMAGE.match(image)
    return m["tag"] if m else None


# names the manifests set themselves; ``KubeConfig.env`` may not override them
RESERVED_ENV = frozenset({
    "POD_NAME", "POD_IP", "REDIS_PASSWORD", "REDISCLI_AUTH", "FLOWSERVE_KVS_URL", "FLOWSERVE_ADMIN_TOKEN",
    "FLOWSERVE_TOKEN", "FLOWSERVE_ARTIFACT_CACHE", "FLOWSERVE_S3_ENDPOINT", "HOME", "TMPDIR",
})


@dataclass(frozen=True)
class KubeConfig:
    """How FlowServe runs on a Kubernetes cluster (what ``k8s.render`` turns into manifests).

    name: the instance name: prefix of every object and the ``app.kubernetes.io/instance``
        label (a DNS-1035 label of at most 40 characters).
    namespace: where everything goes (the namespace itself is not created).
    image: the FlowServe image (a tag or digest is required; ``:latest`` is refused so a
        rollout is reproducible). image_pull_policy, image_pull_secrets: as in a pod spec.
    version: the ``app.kubernetes.io/version`` label (None: the image tag, else the
        package version).
    redis_image: the KVS server image (Redis >= 7.4 for the executors' client-side cache).
    redis_secret: Secret with key ``password``: the KVS password (None: ``<name>-redis``).
        The password is never written into a manifest; it must be URL-safe because the
        executors' KVS URL is composed from it.
    admin_secret: Secret with key ``token``: the gateway's admin token for
        ``POST /admin/deploy`` (None: ``<name>-admin``).
    token_secret: optional Secret with key ``token``: the bearer token the public API
        requires (set it whenever the gateway is reachable from outside the cluster).
    gateway_replicas, cpu_executors: replica counts (ints >= 0).
    gpu_executors: GPU executor replicas; None (default): 1 when a rendered plan has a GPU
        stage, else 0.
    executor_threads: worker threads per executor. gpus_per_executor: ``nvidia.com/gpu``
        each GPU executor requests.
    busy_poll_ms: how long the gateway and executors keep polling after a message before
        sleeping (``ClusterConfig.busy_poll_ms``, default 10). Polling yields the CPU to
        runnable work but counts against a pod's CPU limit: 0 turns it off.
    executor_cache_bytes: byte budget of each executor's local KVS cache
        (``ClusterConfig.executor_cache_bytes``, default 256 MiB); keep it well under the
        executors' memory limit.
    *_resources: requests/limits per component (``Resources``), sane defaults below.
    gpu_node_selector / gpu_tolerations: where GPU executors may run (default: tolerate the
        ``nvidia.com/gpu`` taint GPU node pools usually carry; no node selector, because
        requesting ``nvidia.com/gpu`` already restricts scheduling to GPU nodes).
    service_type: the gateway Service's type (ClusterIP, NodePort, LoadBalancer);
        service_port: the port it exposes.
    gateway_port / gateway_results_port / executor_port / redis_port: container ports (HTTP,
        results into the gateway, messages into executors, Redis).
    kvs_storage: size of the KVS's PersistentVolumeClaim (None: an emptyDir, data is lost
        when the pod goes); storage_class: its StorageClass (None: the cluster default).
    artifact_cache_size: size limit of the executors' artifact cache (``kvs.artifacts``).
    s3_endpoint: ``FLOWSERVE_S3_ENDPOINT`` for S3-compatible stores; s3_secret: a Secret
        whose keys become the executors' environment (``AWS_ACCESS_KEY_ID``, ...).
    network_policies: render NetworkPolicies so only this instance's pods reach the KVS,
        the executors and the gateway's result port.
    env: extra environment for the gateway and executors (not the names the manifests set).
    autoscaling: None (default: fixed replicas), or an ``executors.autoscale.AutoscalingConfig``
        (a mapping of its fields is converted): the gateway then runs the autoscaler and
        scales the executor Deployments itself through the API (``--scaler k8s``), with a
        Role allowing just that and the API token mounted in the gateway pods only. Needs
        ``gateway_replicas`` <= 1: each gateway replica would run its own autoscaler over
        the same executors and remove executors another one still routes to.
    gateway_url / kvs_url: where ``KubernetesCluster.deploy`` reaches the gateway (http(s)://)
        and the KVS (redis:// or rediss://). None: the in-cluster DNS names, which resolve
        only inside the cluster; from outside, port-forward and set them (e.g.
        ``http://localhost:8080``, ``redis://localhost:6379/0``). A KVS URL without a
        password gets the one from ``redis_secret``, so no password needs to be written here.
    """

    name: str = "flowserve"
    namespace: str = "flowserve"
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    version: str | None = None
    redis_image: str = DEFAULT_REDIS_IMAGE
    redis_secret: str | None = None
    admin_secret: str | None = None
    token_secret: str | None = None
    gateway_replicas: int = 1
    cpu_executors: int = 2
    gpu_executors: int | None = None
    executor_threads: int = 4
    gpus_per_executor: int = 1
    busy_poll_ms: float = 10.0
    executor_cache_bytes: int = 256 * 1024 * 1024  # = KVSOptions.cache_max_bytes (a test keeps them equal)
    kvs_resources: Resources = Resources(cpu="250m", memory="256Mi", cpu_limit="1", memory_limit="1Gi")
    gateway_resources: Resources = Resources(cpu="250m", memory="256Mi", cpu_limit="1", memory_limit="512Mi")
    cpu_executor_resources: Resources = Resources(cpu="1", memory="2Gi", cpu_limit="2", memory_limit="4Gi")
    gpu_executor_resources: Resources = Resources(cpu="1", memory="4Gi", cpu_limit="4", memory_limit="16Gi")
    gpu_node_selector: Mapping[str, str] = field(default_factory=dict)
    gpu_tolerations: tuple[Toleration, ...] = (Toleration(key="nvidia.com/gpu", operator="Exists",
                                                          effect="NoSchedule"),)
    service_type: str = "ClusterIP"
    service_port: int = 80
    gateway_port: int = 8000
    gateway_results_port: int = 5556
    executor_port: int = 5555
    redis_port: int = 6379
    kvs_storage: str | None = "1Gi"
    storage_class: str | None = None
    artifact_cache_size: str = "10Gi"
    s3_endpoint: str | None = None
    s3_secret: str | None = None
    network_policies: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    autoscaling: "AutoscalingConfig | None" = None
    gateway_url: str | None = None
    kvs_url: str | None = None

    def __post_init__(self):
        def bad(fname: str, what: str, type_error: bool = False):
            cls = K8sConfigTypeError if type_error else K8sConfigError
            raise cls(f"KubeConfig.{fname} must be {what}, got {getattr(self, fname)!r}")

        def need(cond: bool, fname: str, what: str, kind=None):
            """``kind``: the expected type ("int", "str", "bool"); a value of another type is a
            TypeError (e.g. replicas="2"), a wrong value of the right type a ValueError."""
            if cond:
                return
            v = getattr(self, fname)
            wrong_type = v is not None and (kind == "int" and not _int(v) or kind == "str" and not isinstance(v, str)
                                            or kind == "bool" and not isinstance(v, bool)
                                            or kind == "number" and not _num(v))
            bad(fname, what, wrong_type)

        need(isinstance(self.name, str) and len(self.name) <= MAX_NAME and bool(_DNS1035_LABEL.match(self.name)),
             "name", f"a string: lowercase letters, digits and '-', starting with a letter, "
                     f"at most {MAX_NAME} characters", "str")
        need(isinstance(self.namespace, str) and len(self.namespace) <= 63
             and bool(_DNS1123_LABEL.match(self.namespace)), "namespace",
             "a string: a DNS label (lowercase letters, digits and '-', at most 63 characters)", "str")
        for f in ("image", "redis_image"):
            self._check_image(f)
        need(self.image_pull_policy in PULL_POLICIES, "image_pull_policy", f"one of {PULL_POLICIES}")
        if isinstance(self.image_pull_secrets, (list, str)):
            secrets = (self.image_pull_secrets,) if isinstance(self.image_pull_secrets, str) else self.image_pull_secrets
            object.__setattr__(self, "image_pull_secrets", tuple(secrets))
        need(isinstance(self.image_pull_secrets, tuple) and all(_secret_ok(s) for s in self.image_pull_secrets),
             "image_pull_secrets", "a tuple of Secret names (DNS subdomains)")
        need(self.version is None or label_value_ok(self.version), "version",
             "None or a label value (letters, digits, '-', '_', '.', at most 63 characters)", "str")
        for f in ("redis_secret", "admin_secret", "token_secret", "s3_secret", "storage_class"):
            v = getattr(self, f)
            need(v is None or _secret_ok(v), f, "None or a string: a DNS subdomain name", "str")
        for f in ("gateway_replicas", "cpu_executors"):
            need(_int(getattr(self, f)) and 0 <= getattr(self, f) <= 1000, f, "an int in 0..1000", "int")
        need(self.gpu_executors is None or (_int(self.gpu_executors) and 0 <= self.gpu_executors <= 1000),
             "gpu_executors", "None (decide from the plan) or an int in 0..1000", "int")
        need(_int(self.executor_threads) and 1 <= self.executor_threads <= 256, "executor_threads",
             "an int in 1..256", "int")
        need(_int(self.gpus_per_executor) and 1 <= self.gpus_per_executor <= 16, "gpus_per_executor",
             "an int in 1..16", "int")
        need(_num(self.busy_poll_ms) and 0 <= self.busy_poll_ms <= 1000, "busy_poll_ms", "a number in 0..1000", "number")
        need(_int(self.executor_cache_bytes) and self.executor_cache_bytes >= 0, "executor_cache_bytes",
             "an int >= 0 (0: no local cache)", "int")
        for f in ("kvs_resources", "gateway_resources", "cpu_executor_resources", "gpu_executor_resources"):
            if not isinstance(getattr(self, f), Resources):
                bad(f, "a k8s.Resources", type_error=True)
        self._freeze_node_selector()
        self._freeze_tolerations()
        need(self.service_type in SERVICE_TYPES, "service_type", f"one of {SERVICE_TYPES}")
        ports = ("service_port", "gateway_port", "gateway_results_port", "executor_port", "redis_port")
        for f in ports:
            need(_int(getattr(self, f)) and 1 <= getattr(self, f) <= 65535, f, "an int in 1..65535", "int")
        container_ports = [getattr(self, f) for f in ports[1:]]
        if len(set(container_ports)) != len(container_ports):
            raise K8sConfigError(f"KubeConfig ports must differ: gateway_port={self.gateway_port!r}, "
                                 f"gateway_results_port={self.gateway_results_port!r}, executor_port={self.executor_port!r}, "
                                 f"redis_port={self.redis_port!r}")
        if self.kvs_storage is not None:
            _check_quantity("KubeConfig", "kvs_storage", self.kvs_storage, optional=False)
        _check_quantity("KubeConfig", "artifact_cache_size", self.artifact_cache_size, optional=False)
        need(self.s3_endpoint is None or (isinstance(self.s3_endpoint, str)
                                          and re.match(r"^https?://[^\s/]+(/\S*)?$", self.s3_endpoint) is not None),
             "s3_endpoint", "None or a string: an http(s):// URL", "str")
        need(isinstance(self.network_policies, bool), "network_policies", "a bool", "bool")
        self._freeze_env()
        self._convert_autoscaling()
        need(self.gateway_url is None or _url_ok(self.gateway_url, ("http", "https")), "gateway_url",
             "None or a string: an http(s):// URL such as 'http://localhost:8080'", "str")
        self._check_kvs_url()

    # -- field checks that convert ------------------------------------------------------

    def _check_image(self, f: str) -> None:
        v = getattr(self, f)
        if not isinstance(v, str):
            raise K8sConfigTypeError(f"KubeConfig.{f} must be an image reference string, got {type(v).__name__} {v!r}")
        m = _IMAGE.match(v)
        if m is None:
            raise K8sConfigError(f"KubeConfig.{f} must be an image reference such as 'registry.example.com/"
                                 f"flowserve:0.1.0', got {v!r}")
        if m["tag"] is None and m["digest"] is None:
            raise K8sConfigError(f"KubeConfig.{f} must pin a tag or digest (a rollout must be reproducible), got {v!r}")
        if m["tag"] == "latest":
            raise K8sConfigError(f"KubeConfig.{f} must not use the 'latest' tag (a rollout must be "
                                 f"reproducible), got {v!r}")

    def _freeze_node_selector(self) -> None:
        v = self.gpu_node_selector
        if not isinstance(v, Mapping):
            raise K8sConfigTypeError(f"KubeConfig.gpu_node_selector must be a mapping of label key to value, got {v!r}")
        for k, val in v.items():
            if not _label_key_ok(k):
                raise K8sConfigError(f"KubeConfig.gpu_node_selector: {k!r} is not a label key")
            if not label_value_ok(val):
                raise K8sConfigError(f"KubeConfig.gpu_node_selector[{k!r}]: {val!r} is not a label value")
        object.__setattr__(self, "gpu_node_selector", MappingProxyType(dict(v)))

    def _freeze_tolerations(self) -> None:
        v = self.gpu_tolerations
        if isinstance(v, (Mapping, Toleration)) or not isinstance(v, (list, tuple)):
            raise K8sConfigTypeError(f"KubeConfig.gpu_tolerations must be a list of Toleration (or mappings), got {v!r}")
        tols = tuple(t if isinstance(t, Toleration) else Toleration.from_dict(t) for t in v)
        object.__setattr__(self, "gpu_tolerations", tols)

    def _freeze_env(self) -> None:
        v = self.env
        if not isinstance(v, Mapping):
            raise K8sConfigTypeError(f"KubeConfig.env must be a mapping of name to string, got {v!r}")
        for k, val in v.items():
            if not isinstance(k, str) or not _ENV_NAME.match(k):
                raise K8sConfigError(f"KubeConfig.env: {k!r} is not an environment variable name")
            if k in RESERVED_ENV:
                raise K8sConfigError(f"KubeConfig.env: {k!r} is set by the manifests themselves; "
                                     f"reserved names: {sorted(RESERVED_ENV)}")
            if not isinstance(val, str):
                raise K8sConfigTypeError(f"KubeConfig.env[{k!r}] must be a string, got {type(val).__name__} {val!r}")
        object.__setattr__(self, "env", MappingProxyType(dict(v)))

    def _check_kvs_url(self) -> None:
        """A redis URL without a password: configs get logged and committed, and the password
        is in ``redis_secret`` already. Messages quote the URL with any password masked."""
        v = self.kvs_url
        if v is None:
            return
        what = "None or a string: a redis:// or rediss:// URL such as 'redis://localhost:6379/0'"
        if not isinstance(v, str):
            raise K8sConfigTypeError(f"KubeConfig.kvs_url must be {what}, got {type(v).__name__} {v!r}")
        if not _url_ok(v, ("redis", "rediss")):
            raise K8sConfigError(f"KubeConfig.kvs_url must be {what}, got {redact_url(v)!r}")
        if urlsplit(v).password is not None:
            raise K8sConfigError(f"KubeConfig.kvs_url must not hold a password (deploy takes it from the Secret "
                                 f"{self.redis_secret_name!r}), got {redact_url(v)!r}")

    def _convert_autoscaling(self) -> None:
        v = self.autoscaling
        if v is None:
            return
        from executors.autoscale import AutoscalingConfig, AutoscalingError

        if isinstance(v, Mapping):
            try:
                v = AutoscalingConfig.from_json(dict(v))
            except AutoscalingError as e:  # its message names the field and quotes the value
                cls = K8sConfigTypeError if isinstance(e, TypeError) else K8sConfigError
                raise cls(f"KubeConfig.autoscaling: {e}") from None
            object.__setattr__(self, "autoscaling", v)
        if not isinstance(v, AutoscalingConfig):
            raise K8sConfigTypeError(f"KubeConfig.autoscaling must be None, an executors.autoscale."
                                     f"AutoscalingConfig or a mapping of its fields, got {type(v).__name__} {v!r}")
        if self.gateway_replicas > 1:
            raise K8sConfigError(f"KubeConfig.autoscaling needs gateway_replicas <= 1 (each gateway replica runs its "
                                 f"own autoscaler over the same executors), got gateway_replicas="
                                 f"{self.gateway_replicas!r}")

    # -- derived names -----------------------------------------------------------------------

    @property
    def redis_secret_name(self) -> str:
        return self.redis_secret or f"{self.name}-redis"

    @property
    def admin_secret_name(self) -> str:
        return self.admin_secret or f"{self.name}-admin"

    @property
    def cluster_key_secret_name(self) -> str:
        """The Secret (key ``key``, hex) with the cluster key plans are signed with: never in
        the KVS, so whoever reaches Redis cannot make the pods run code."""
        return f"{self.name}-cluster-key"

    @property
    def version_label(self) -> str:
        if self.version is not None:
            return self.version
        tag = image_tag(self.image)
        return tag if tag and label_value_ok(tag) else PACKAGE_VERSION

    def replace(self, **changes) -> "KubeConfig":
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, doc: Mapping) -> "KubeConfig":
        """From plain data (JSON/YAML): resources as mappings, tolerations as mappings."""
        if not isinstance(doc, Mapping):
            raise K8sConfigTypeError(f"KubeConfig.from_dict needs a mapping, got {type(doc).__name__} {doc!r}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise K8sConfigError(f"KubeConfig: unknown field(s) {unknown}; known: {sorted(known)}")
        fields = dict(doc)
        for f in ("kvs_resources", "gateway_resources", "cpu_executor_resources", "gpu_executor_resources"):
            if isinstance(fields.get(f), Mapping):
                try:
                    fields[f] = Resources(**fields[f])
                except TypeError as e:
                    raise K8sConfigError(f"KubeConfig.{f}: {e}") from None
        if isinstance(fields.get("image_pull_secrets"), list):
            fields["image_pull_secrets"] = tuple(fields["image_pull_secrets"])
        return cls(**fields)


def _url_ok(v, schemes: tuple[str, ...]) -> bool:
    if not isinstance(v, str) or re.search(r"\s", v):
        return False
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        return False
    return parts.scheme in schemes and bool(parts.hostname)


def _secret_ok(v) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 253 and bool(_DNS1123_SUBDOMAIN.match(v))
