"""Settings of a Kubernetes deployment: one frozen, validated object with documented defaults.

    from k8s import KubeConfig, Resources
    cfg = KubeConfig(namespace="ml", image="registry.example.com/flowserve:0.1.0",
                     gpu_executors=2, service_type="LoadBalancer", token_secret="flowserve-token")

Every field declares its check (``flow.configuration``, like every config of the project),
run when the object is built; a bad value raises ``ConfigError`` (a
``ValueError``) or ``ConfigTypeError`` (also a ``TypeError``) naming the field and
quoting the value. ``to_json``/``from_json`` (alias ``from_dict``) round-trip it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from flow.configuration import Bool, Check, Config, ConfigTypeError, Int, Invalid, Nested, Number, OneOf, Str, setting
from flow.errors import FlowValueError
from kvs.redact import redact_url  # one redaction for every package (k8s.backend imports it from here)
from kvs.urls import parse_store_url

if TYPE_CHECKING:  # importing the runtime costs ~0.3 s: only when autoscaling is configured
    from executors.hosts.autoscale import AutoscalingConfig


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("flowserve")
    except Exception:  # not installed (a source checkout on sys.path)
        return "0.1.0"


PACKAGE_VERSION = _package_version()
DEFAULT_IMAGE = f"flowserve:{PACKAGE_VERSION}"
# Redis >= 6: the executors' cache tracks keys with RESP2 CLIENT TRACKING (kvs/tracking.py); any newer image works.
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
    r"(@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
_QUANTITY = re.compile(r"^(?P<num>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SUFFIX = {
    "": 1,
    "m": Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}

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


def _quantity(*, optional: bool = False):
    """The check of a Kubernetes quantity field (``"500m"``, ``"1Gi"``): a string, parsed, > 0."""

    def check(value, name: str):
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise Invalid(
                message=f"{name} must be a quantity string such as '500m' or '1Gi', "
                f"got {type(value).__name__} {value!r}",
                wrong_type=True,
            )
        try:
            q = parse_quantity(value)
        except ValueError as e:
            raise Invalid(message=f"{name}: {e}") from None
        if q <= 0:
            raise Invalid(message=f"{name} must be > 0, got {value!r}")
        return value

    return check


@dataclass(frozen=True)
class Resources(Config):
    """CPU and memory one container requests (scheduling) and may use at most (limits).

    cpu / memory: requests, Kubernetes quantities (``"500m"``, ``"2"``, ``"512Mi"``, ``"4Gi"``).
    cpu_limit / memory_limit: limits (None: equal to the request, so every container has
    limits). A limit below its request is an error.

        Resources(cpu="2", memory="4Gi", cpu_limit="4", memory_limit="8Gi")
        Resources(cpu="2", memory="4Gi")       # limits 2 CPUs and 4Gi (Guaranteed QoS)
    """

    cpu: str = setting("500m", _quantity())
    memory: str = setting("512Mi", _quantity())
    cpu_limit: str | None = setting(None, _quantity(optional=True))
    memory_limit: str | None = setting(None, _quantity(optional=True))

    def _validate(self) -> None:
        for f, req in (("cpu_limit", "cpu"), ("memory_limit", "memory")):
            v = getattr(self, f)
            if v is not None and parse_quantity(v) < parse_quantity(getattr(self, req)):
                raise self.error(f"Resources.{f}={v!r} is below the request {req}={getattr(self, req)!r}")

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
class Toleration(Config):
    """A pod toleration (which node taints the GPU executors accept).

    Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    """

    key: str | None = setting(
        None, Check("a label key such as 'nvidia.com/gpu'", lambda v: _label_key_ok(v), optional=True)
    )
    operator: str = setting("Exists", OneOf(*TOLERATION_OPERATORS))
    value: str | None = None  # checked against the operator in _validate
    effect: str | None = setting(
        None, Check(f"None or one of {TOLERATION_EFFECTS}", lambda v: v is None or v in TOLERATION_EFFECTS)
    )
    toleration_seconds: int | None = setting(None, Int(0, optional=True))

    def _validate(self) -> None:
        if self.operator == "Exists" and self.value is not None:
            raise self.error(f"Toleration with operator 'Exists' takes no value, got value={self.value!r}")
        if self.operator == "Equal" and (not isinstance(self.value, str) or not _LABEL_VALUE.match(self.value)):
            raise self.error(f"Toleration with operator 'Equal' needs a label value, got value={self.value!r}")
        if self.key is None and self.operator != "Exists":
            raise self.error(f"Toleration without a key must use operator 'Exists', got {self.operator!r}")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise self.error(
                f"Toleration.toleration_seconds only applies to effect 'NoExecute', got effect={self.effect!r}"
            )

    @classmethod
    def from_dict(cls, doc: Mapping) -> Toleration:
        """From the Kubernetes spelling (``tolerationSeconds``) or ours (``to_json``)."""
        if not isinstance(doc, Mapping):
            raise ConfigTypeError(f"a toleration must be a Toleration or a mapping, got {type(doc).__name__} {doc!r}")
        return cls.from_json({"toleration_seconds" if k == "tolerationSeconds" else k: v for k, v in doc.items()})

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
RESERVED_ENV = frozenset(
    {
        "POD_NAME",
        "POD_IP",
        "REDIS_PASSWORD",
        "REDISCLI_AUTH",
        "FLOWSERVE_KVS_URL",
        "FLOWSERVE_ADMIN_TOKEN",
        "FLOWSERVE_TOKEN",
        "FLOWSERVE_ARTIFACT_CACHE",
        "FLOWSERVE_S3_ENDPOINT",
        "HOME",
        "TMPDIR",
    }
)


# -- KubeConfig's field checks that need more than flow.configuration's ------------------------

_SECRET = Str("a string: a DNS subdomain name", lambda v: _secret_ok(v), optional=True)
_PORT = Int(1, 65535)


def _image(v, name: str) -> str:
    if not isinstance(v, str):
        raise Invalid(
            message=f"{name} must be an image reference string, got {type(v).__name__} {v!r}", wrong_type=True
        )
    m = _IMAGE.match(v)
    if m is None:
        raise Invalid(
            message=f"{name} must be an image reference such as 'registry.example.com/flowserve:0.1.0', got {v!r}"
        )
    if m["tag"] is None and m["digest"] is None:
        raise Invalid(message=f"{name} must pin a tag or digest (a rollout must be reproducible), got {v!r}")
    if m["tag"] == "latest":
        raise Invalid(message=f"{name} must not use the 'latest' tag (a rollout must be reproducible), got {v!r}")
    return v


def _node_selector(v, name: str) -> Mapping[str, str]:
    if not isinstance(v, Mapping):
        raise Invalid(message=f"{name} must be a mapping of label key to value, got {v!r}", wrong_type=True)
    for k, val in v.items():
        if not _label_key_ok(k):
            raise Invalid(message=f"{name}: {k!r} is not a label key")
        if not label_value_ok(val):
            raise Invalid(message=f"{name}[{k!r}]: {val!r} is not a label value")
    return MappingProxyType(dict(v))


# ClusterConfig fields a standalone gateway reads (its limits, timeouts and retries); the
# token comes from a Secret, the rest describes the local cluster's processes
GATEWAY_SETTINGS = (
    "max_body_bytes",
    "max_rows",
    "max_header_bytes",
    "max_headers",
    "header_timeout_s",
    "min_body_rate",
    "body_timeout_s",
    "idle_timeout_s",
    "max_connections",
    "request_timeout_s",
    "max_request_timeout_s",
    "load_timeout_s",
    "max_retries",
    "stuck_grace_s",
    "public_metrics",
    "colocate",
)


def _gateway_settings(v, name: str) -> Mapping:
    if not isinstance(v, Mapping):
        raise Invalid(message=f"{name} must be a mapping of gateway setting to value, got {v!r}", wrong_type=True)
    unknown = sorted(set(v) - set(GATEWAY_SETTINGS))
    if unknown:
        raise Invalid(message=f"{name}: {unknown} are not gateway settings; known: {list(GATEWAY_SETTINGS)}")
    from executors.hosts.cluster_config import ClusterConfig
    from flow.configuration import ConfigError

    try:  # the runtime's own checks, with its messages
        ClusterConfig.from_json(dict(v))
    except ConfigError as e:
        raise Invalid(message=f"{name}: {e}") from None
    return MappingProxyType(dict(v))


def _tolerations(v, name: str) -> tuple[Toleration, ...]:
    if isinstance(v, (Mapping, Toleration)) or not isinstance(v, (list, tuple)):
        raise Invalid(message=f"{name} must be a list of Toleration (or mappings), got {v!r}", wrong_type=True)
    return tuple(t if isinstance(t, Toleration) else Toleration.from_dict(t) for t in v)


def _env(v, name: str) -> Mapping[str, str]:
    if not isinstance(v, Mapping):
        raise Invalid(message=f"{name} must be a mapping of name to string, got {v!r}", wrong_type=True)
    for k, val in v.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise Invalid(message=f"{name}: {k!r} is not an environment variable name")
        if k in RESERVED_ENV:
            raise Invalid(
                message=f"{name}: {k!r} is set by the manifests themselves; reserved names: {sorted(RESERVED_ENV)}"
            )
        if not isinstance(val, str):
            raise Invalid(message=f"{name}[{k!r}] must be a string, got {type(val).__name__} {val!r}", wrong_type=True)
    return MappingProxyType(dict(v))


def _autoscaling(v, name: str):
    """None, an AutoscalingConfig, or a mapping of its fields; the runtime is imported only
    when autoscaling is configured (it costs ~0.3 s)."""
    if v is None:
        return None
    from executors.hosts.autoscale import AutoscalingConfig

    if isinstance(v, Mapping):
        return Nested(AutoscalingConfig).decode(v, name)
    if not isinstance(v, AutoscalingConfig):
        raise Invalid(
            message=f"{name} must be None, an executors.hosts.autoscale.AutoscalingConfig or a mapping of "
            f"its fields, got {type(v).__name__} {v!r}",
            wrong_type=True,
        )
    return v


def _kvs_url(v, name: str):
    """A store URL (kvs/urls.py: one server, Sentinel or Cluster); messages quote it with any
    password masked (the password rule is in KubeConfig._validate, which names the Secret)."""
    if v is None:
        return None
    what = (
        "None or a string: a redis://, rediss://, redis+sentinel:// or redis+cluster:// URL such as "
        "'redis://localhost:6379/0'"
    )
    if not isinstance(v, str):
        raise Invalid(message=f"{name} must be {what}, got {type(v).__name__} {v!r}", wrong_type=True)
    if v.startswith(("redis+sentinel://", "redis+cluster://")):
        try:
            parse_store_url(v)
        except FlowValueError as e:
            raise Invalid(message=f"{name}: {e}") from None
    elif not _url_ok(v, ("redis", "rediss")):
        raise Invalid(message=f"{name} must be {what}, got {redact_url(v)!r}")
    return v


@dataclass(frozen=True)
class KubeConfig(Config):
    """How FlowServe runs on a Kubernetes cluster (what ``k8s.render`` turns into manifests).

    name: the instance name: prefix of every object and the ``app.kubernetes.io/instance``
        label (a DNS-1035 label of at most 40 characters).
    namespace: where everything goes (the namespace itself is not created).
    image: the FlowServe image (a tag or digest is required; ``:latest`` is refused so a
        rollout is reproducible). image_pull_policy, image_pull_secrets: as in a pod spec.
    version: the ``app.kubernetes.io/version`` label (None: the image tag, else the
        package version).
    redis_image: the KVS server image (Redis >= 6, or Valkey: the executors' cache uses CLIENT TRACKING).
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
    gateway_settings: the gateway's limits, timeouts and retries: ``ClusterConfig`` fields
        (``GATEWAY_SETTINGS``), e.g. ``{"idle_timeout_s": 75, "request_timeout_s": 10}``.
        Behind a proxy that keeps connections to the gateway open (an ingress: nginx keeps
        them 60 s), set ``idle_timeout_s`` above its keep-alive, or a request it sends on a
        connection the gateway is closing fails with 502.
    autoscaling: None (default: fixed replicas), or an ``executors.hosts.autoscale.AutoscalingConfig``
        (a mapping of its fields is converted): the gateway then runs the autoscaler and
        scales the executor Deployments itself through the API (``--scaler k8s``), with a
        Role allowing just that and the API token mounted in the gateway pods only. Any
        number of gateway replicas: the one holding the Lease ``<name>-leader`` runs the
        autoscaler and the others serve its placements (k8s/leadership.py).
    gateway_url / kvs_url: where ``KubernetesCluster.deploy`` reaches the gateway (http(s)://)
        and the KVS (a store URL: redis://, rediss://, redis+sentinel://, redis+cluster://).
        None: the in-cluster DNS names (or ``external_kvs``), which resolve only inside the
        cluster; from outside, port-forward and set them (e.g. ``http://localhost:8080``,
        ``redis://localhost:6379/0``). A KVS URL without a password gets the one from
        ``redis_secret``, so no password needs to be written here.
    external_kvs: a store the instance uses instead of rendering its own (a managed Redis, a
        Sentinel set, a Redis Cluster): its URL without a password (``kvs/urls.py``, e.g.
        ``redis+sentinel://sentinel.db:26379/flowserve/0``); the password comes from
        ``redis_secret`` (key ``password``, which must exist: it is not generated; empty for
        a store without one). Then no KVS StatefulSet, Service, volume or NetworkPolicy is
        rendered, and the gateway's and executors' ``FLOWSERVE_KVS_URL`` points at it.
    """

    name: str = setting(
        "flowserve",
        Str(
            f"a string: lowercase letters, digits and '-', starting with a letter, at most {MAX_NAME} characters",
            lambda v: len(v) <= MAX_NAME and bool(_DNS1035_LABEL.match(v)),
        ),
    )
    namespace: str = setting(
        "flowserve",
        Str(
            "a string: a DNS label (lowercase letters, digits and '-', at most 63 characters)",
            lambda v: len(v) <= 63 and bool(_DNS1123_LABEL.match(v)),
        ),
    )
    image: str = setting(DEFAULT_IMAGE, _image)
    image_pull_policy: str = setting("IfNotPresent", OneOf(*PULL_POLICIES))
    image_pull_secrets: tuple[str, ...] = setting(
        (),
        Check(
            "a tuple of Secret names (DNS subdomains)",
            lambda v: isinstance(v, tuple) and all(map(_secret_ok, v)),
            convert=lambda v: (v,) if isinstance(v, str) else tuple(v) if isinstance(v, list) else v,
        ),
    )
    version: str | None = setting(
        None,
        Str("a label value (letters, digits, '-', '_', '.', at most 63 characters)", label_value_ok, optional=True),
    )
    redis_image: str = setting(DEFAULT_REDIS_IMAGE, _image)
    redis_secret: str | None = setting(None, _SECRET)
    admin_secret: str | None = setting(None, _SECRET)
    token_secret: str | None = setting(None, _SECRET)
    gateway_replicas: int = setting(1, Int(0, 1000))
    cpu_executors: int = setting(2, Int(0, 1000))
    gpu_executors: int | None = setting(
        None, Int(0, 1000, optional=True, what="None (decide from the plan) or an int in 0..1000")
    )
    executor_threads: int = setting(4, Int(1, 256))
    gpus_per_executor: int = setting(1, Int(1, 16))
    busy_poll_ms: float = setting(10.0, Number(ge=0, le=1000, note="ms; 0: off"))  # = executors.wire.busypoll.WINDOW_MS
    executor_cache_bytes: int = setting(
        256 * 1024 * 1024,  # = KVSOptions.cache_max_bytes (a test keeps them equal)
        Int(0, note="0: no local cache"),
    )
    kvs_resources: Resources = setting(
        Resources(cpu="250m", memory="256Mi", cpu_limit="1", memory_limit="1Gi"),
        Nested(Resources, what="a k8s.Resources"),
    )
    gateway_resources: Resources = setting(
        Resources(cpu="250m", memory="256Mi", cpu_limit="1", memory_limit="512Mi"),
        Nested(Resources, what="a k8s.Resources"),
    )
    cpu_executor_resources: Resources = setting(
        Resources(cpu="1", memory="2Gi", cpu_limit="2", memory_limit="4Gi"), Nested(Resources, what="a k8s.Resources")
    )
    gpu_executor_resources: Resources = setting(
        Resources(cpu="1", memory="4Gi", cpu_limit="4", memory_limit="16Gi"), Nested(Resources, what="a k8s.Resources")
    )
    gpu_node_selector: Mapping[str, str] = setting(default_factory=dict, check=_node_selector)
    gpu_tolerations: tuple[Toleration, ...] = setting(
        (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),), _tolerations
    )
    service_type: str = setting("ClusterIP", OneOf(*SERVICE_TYPES))
    service_port: int = setting(80, _PORT)
    gateway_port: int = setting(8000, _PORT)
    gateway_results_port: int = setting(5556, _PORT)
    executor_port: int = setting(5555, _PORT)
    redis_port: int = setting(6379, _PORT)
    kvs_storage: str | None = setting("1Gi", _quantity(optional=True))
    storage_class: str | None = setting(None, _SECRET)
    artifact_cache_size: str = setting("10Gi", _quantity())
    s3_endpoint: str | None = setting(
        None,
        Str(
            "a string: an http(s):// URL",
            lambda v: re.match(r"^https?://[^\s/]+(/\S*)?$", v) is not None,
            optional=True,
        ),
    )
    s3_secret: str | None = setting(None, _SECRET)
    network_policies: bool = setting(True, Bool())
    env: Mapping[str, str] = setting(default_factory=dict, check=_env)
    gateway_settings: Mapping = setting(default_factory=dict, check=_gateway_settings)
    autoscaling: AutoscalingConfig | None = setting(None, _autoscaling)
    gateway_url: str | None = setting(
        None,
        Str(
            "a string: an http(s):// URL such as 'http://localhost:8080'",
            lambda v: _url_ok(v, ("http", "https")),
            optional=True,
        ),
    )
    kvs_url: str | None = setting(None, _kvs_url)
    external_kvs: str | None = setting(None, _kvs_url)

    def _validate(self) -> None:
        ports = ("gateway_port", "gateway_results_port", "executor_port", "redis_port")
        if len({getattr(self, f) for f in ports}) != len(ports):
            raise self.error(
                f"KubeConfig ports must differ: gateway_port={self.gateway_port!r}, "
                f"gateway_results_port={self.gateway_results_port!r}, "
                f"executor_port={self.executor_port!r}, redis_port={self.redis_port!r}"
            )
        if self.kvs_url is not None and urlsplit(self.kvs_url).password is not None:
            # configs get logged and committed, and the password is in redis_secret already
            raise self.error(
                f"KubeConfig.kvs_url must not hold a password (deploy takes it from the Secret "
                f"{self.redis_secret_name!r}), got {redact_url(self.kvs_url)!r}"
            )
        if self.external_kvs is not None and urlsplit(self.external_kvs).password is not None:
            # rendered into every pod's environment: the manifests must not hold it
            raise self.error(
                f"KubeConfig.external_kvs must not hold a password (the pods take it from the Secret "
                f"{self.redis_secret_name!r}), got {redact_url(self.external_kvs)!r}"
            )

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

    def replace(self, **changes) -> KubeConfig:
        """A copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, doc: Mapping) -> KubeConfig:
        """From plain data (JSON/YAML): ``from_json`` (resources and tolerations as mappings)."""
        return cls.from_json(doc)


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
