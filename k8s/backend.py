"""The Kubernetes backend: apply rendered manifests, scale executors, tear down, report.

    from k8s import KubeConfig, KubernetesCluster, render
    cluster = KubernetesCluster(config=KubeConfig(namespace="ml", image="reg.example.com/flowserve:0.1.0"))
    cluster.ensure_secrets()                 # KVS password + admin token, generated once
    cluster.apply(render(cluster.config, plan))   # server-side apply, then prune what the render dropped
    cluster.scale("executor-gpu", 3)         # patches the Deployment's scale subresource
    cluster.status()                         # desired/ready replicas per component
    cluster.delete()                         # everything labelled with this instance
    flow.deploy(cluster=cluster)             # Secrets, apply, wait until ready, deploy the plan

Every call goes through the ``kubernetes`` client's typed APIs (``AppsV1Api``, ``CoreV1Api``,
``NetworkingV1Api``, ``RbacAuthorizationV1Api``), built from the kubeconfig / in-cluster
credentials unless they are passed in (tests pass a real API server's clients). Manifests are
checked against the client's model objects (``V1Deployment``, ``V1Service``, ...) before
anything is sent, and a field the model does not know is an error rather than silently
dropped; ``apply`` is a server-side apply (field manager ``flowserve``). API failures raise
the class of the tree ``k8s.errors.api_error_for`` picks, naming the verb and the object.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import secrets
import time
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from flow.configuration import ConfigError, ConfigTypeError
from flow.errors import (
    AccessDeniedError,
    DeadlineExceededError,
    FlowError,
    FlowValueError,
    InternalError,
    NotInstalledError,
    UnreachableError,
)
from k8s.errors import K8sConflictError, K8sNotFoundError, api_error_for
from k8s.kube_config import KubeConfig, _int, redact_url
from k8s.manifests import (
    A_BASELINE,
    L_COMPONENT,
    L_INSTANCE,
    SCALABLE,
    instance_selector,
    labels,
    managed_selector,
    object_name,
    render,
)


@dataclass(frozen=True)
class Kind:
    """How one kind maps onto the typed client: which API, which model, which methods."""

    api: str  # "apps", "core", "networking" or "rbac"
    model: str  # the client's model class, e.g. "V1Deployment"
    suffix: str  # the method suffix: read_<suffix>, patch_<suffix>, list_<suffix>, ...


KINDS: dict[tuple[str, str], Kind] = {
    ("v1", "ServiceAccount"): Kind("core", "V1ServiceAccount", "namespaced_service_account"),
    ("v1", "Secret"): Kind("core", "V1Secret", "namespaced_secret"),
    ("v1", "Service"): Kind("core", "V1Service", "namespaced_service"),
    ("v1", "PersistentVolumeClaim"): Kind("core", "V1PersistentVolumeClaim", "namespaced_persistent_volume_claim"),
    ("apps/v1", "Deployment"): Kind("apps", "V1Deployment", "namespaced_deployment"),
    ("apps/v1", "StatefulSet"): Kind("apps", "V1StatefulSet", "namespaced_stateful_set"),
    ("networking.k8s.io/v1", "NetworkPolicy"): Kind("networking", "V1NetworkPolicy", "namespaced_network_policy"),
    ("rbac.authorization.k8s.io/v1", "Role"): Kind("rbac", "V1Role", "namespaced_role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): Kind("rbac", "V1RoleBinding", "namespaced_role_binding"),
}
# what ``delete`` removes, in this order (workloads first so pods stop before their Services;
# the autoscaler's permissions only after the gateway that uses them is gone): exactly the
# kinds ``render`` makes, so the deployer's RBAC (docs/kubernetes.md) needs no other kind
DELETE_ORDER = [
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("v1", "Service"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("v1", "ServiceAccount"),
]
# what ``apply`` prunes: the same kinds (Secrets and volume claims hold data: never pruned)
PRUNE_ORDER = DELETE_ORDER
# server-side apply: the field manager that owns what FlowServe renders, and its content type
FIELD_MANAGER = "flowserve"
APPLY_PATCH = "application/apply-patch+yaml"
DATA_KINDS = [("v1", "PersistentVolumeClaim"), ("v1", "Secret")]  # only with delete(keep_data=False)
# pods are never applied, only annotated by the autoscaler: not in KINDS
POD = Kind("core", "V1Pod", "namespaced_pod")
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
WORKLOADS = ("kvs", "gateway", "executor-cpu", "executor-gpu")  # what deploy waits for
REQUIRED = ("kvs", "gateway", "executor-cpu")  # always rendered: missing means not applied yet


def _client():
    try:
        import kubernetes.client as client
    except ImportError as e:
        raise NotInstalledError(
            f"the Kubernetes backend needs the kubernetes client: pip install 'flowserve[k8s]' ({e})"
        ) from e
    return client


class _Body:
    """What ``ApiClient.deserialize`` reads: an object with the JSON in ``.data``."""

    def __init__(self, doc: dict):
        self.data = json.dumps(doc)


def _first_difference(a, b, path: str = "") -> str | None:
    """The path of the first place ``a`` and ``b`` differ (None when equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in b or k not in a:
                return f"{path}.{k}" if path else str(k)
            d = _first_difference(a[k], b[k], f"{path}.{k}" if path else str(k))
            if d is not None:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}[]"
        for i, (x, y) in enumerate(zip(a, b)):
            d = _first_difference(x, y, f"{path}[{i}]")
            if d is not None:
                return d
        return None
    return None if a == b and type(a) is type(b) else (path or "<root>")


def describe(manifest) -> str:
    """``Kind namespace/name`` of a manifest, for messages."""
    if not isinstance(manifest, dict):
        return repr(manifest)[:80]
    md = manifest.get("metadata") if isinstance(manifest.get("metadata"), dict) else {}
    ns = md.get("namespace")
    return f"{manifest.get('kind', '?')} {ns + '/' if ns else ''}{md.get('name', '?')}"


def to_api_object(manifest: dict, api_client=None):
    """The client's model object for ``manifest`` (e.g. a ``V1Deployment``), and its ``Kind``.

    Raises ``FlowValueError`` for an unsupported kind, a missing name, a value the model
    rejects, or a field the model does not know (it would be dropped silently otherwise).

        obj, kind = to_api_object(render()[-1])     # V1Deployment, Kind("apps", ...)
    """
    _client()  # a clear error when the kubernetes package is missing
    if not isinstance(manifest, dict):
        raise FlowValueError(f"a manifest must be a dict, got {type(manifest).__name__} {manifest!r:.80}")
    key = (manifest.get("apiVersion"), manifest.get("kind"))
    kind = KINDS.get(key)
    if kind is None:
        known = ", ".join(f"{k} ({v})" for v, k in KINDS)
        raise FlowValueError(
            f"{describe(manifest)}: unsupported apiVersion/kind {key[0]!r}/{key[1]!r}; supported: {known}"
        )
    md = manifest.get("metadata")
    if not isinstance(md, dict) or not isinstance(md.get("name"), str) or not md["name"]:
        raise FlowValueError(f"{describe(manifest)}: metadata.name is missing")
    api_client = api_client or _model_client()
    try:
        obj = api_client.deserialize(_Body(manifest), kind.model)
    except (ValueError, TypeError) as e:
        raise FlowValueError(f"{describe(manifest)}: not a valid {kind.model}: {e}") from None
    back = api_client.sanitize_for_serialization(obj)
    diff = _first_difference(manifest, back)
    if diff is not None:
        raise FlowValueError(
            f"{describe(manifest)}: field {diff!r} is not part of {kind.model} "
            f"(misspelt, or the wrong type); it would not be sent"
        )
    return obj, kind


_MODEL_CLIENT = None


def _model_client():
    """An ApiClient used only to convert models (never connects)."""
    global _MODEL_CLIENT
    if _MODEL_CLIENT is None:
        _MODEL_CLIENT = _client().ApiClient()
    return _MODEL_CLIENT


def _default_api_client():
    """An ApiClient from the in-cluster service account, else the local kubeconfig."""
    _client()
    from kubernetes import config as kconfig

    try:
        kconfig.load_incluster_config()
    except kconfig.ConfigException:
        try:
            kconfig.load_kube_config()
        except (kconfig.ConfigException, OSError) as e:
            raise AccessDeniedError(
                f"no Kubernetes credentials: not in a pod and no usable kubeconfig (KUBECONFIG or ~/.kube/config): {e}"
            ) from e
    import kubernetes.client as client

    return client.ApiClient()


class KubernetesCluster:
    """One FlowServe instance on a Kubernetes cluster, driven through the typed client.

    ``namespace``/``image`` override those of ``config`` (default ``KubeConfig()``).
    ``apps_api``/``core_api``/``networking_api``/``rbac_api``: the client's ``AppsV1Api``,
    ``CoreV1Api``, ``NetworkingV1Api`` and ``RbacAuthorizationV1Api`` (default: built from the
    in-cluster or kubeconfig credentials on first use). Nothing is contacted until a method
    is called.

        cluster = KubernetesCluster(namespace="ml", image="reg.example.com/flowserve:0.1.0")
        cluster.apply(render(cluster.config))
        flow.deploy(cluster=cluster)           # or cluster.deploy(flow)
    """

    poll_s = 2.0  # how often deploy() looks at the workloads while waiting for them

    def __init__(
        self,
        namespace: str | None = None,
        image: str | None = None,
        config: KubeConfig | None = None,
        *,
        apps_api=None,
        core_api=None,
        networking_api=None,
        rbac_api=None,
    ):
        if config is None:
            config = KubeConfig()
        elif not isinstance(config, KubeConfig):
            raise ConfigTypeError(f"config must be a k8s.KubeConfig, got {type(config).__name__} {config!r:.80}")
        changes = {k: v for k, v in (("namespace", namespace), ("image", image)) if v is not None}
        self.config = config.replace(**changes) if changes else config
        self._apis = {"apps": apps_api, "core": core_api, "networking": networking_api, "rbac": rbac_api}
        self._plans: dict = {}  # flow name -> the plan deploy() last rendered for it
        self._clients: dict = {}  # (gateway URL, KVS URL, tokens) -> ClusterClient

    @property
    def namespace(self) -> str:
        return self.config.namespace

    # -- API plumbing ------------------------------------------------------------------------

    def _api(self, which: str):
        if self._apis[which] is None:
            client = _client()
            api_client = _default_api_client()
            built = {
                "apps": client.AppsV1Api,
                "core": client.CoreV1Api,
                "networking": client.NetworkingV1Api,
                "rbac": client.RbacAuthorizationV1Api,
            }
            for k, cls in built.items():
                if self._apis[k] is None:
                    self._apis[k] = cls(api_client)
        return self._apis[which]

    def _call(
        self,
        verb: str,
        kind_name: str,
        kind: Kind,
        name: str,
        *args,
        suffix: str | None = None,
        namespace: str | None = None,
        **kwargs,
    ):
        """``<verb>_<suffix>`` on the kind's API; errors become the tree's (``api_error_for``) naming the object."""
        ns = namespace or self.namespace
        method = f"{verb}_{suffix or kind.suffix}"
        api = self._api(kind.api)
        try:
            return getattr(api, method)(*args, **kwargs)
        except Exception as e:  # the client's ApiException, urllib3's connection errors
            raise self._error(e, verb, kind_name, ns, name) from e

    @staticmethod
    def _error(e: Exception, verb: str, kind: str, namespace: str, name: str) -> FlowError:
        status = getattr(e, "status", None)
        if not isinstance(status, int):
            # no HTTP answer at all (connection refused, DNS, TLS): retryable
            status, reason = 0, f"{type(e).__name__}: {e}"
        else:
            reason = getattr(e, "reason", "") or ""
            body = getattr(e, "body", None)
            try:
                doc = json.loads(body) if body else None
                if isinstance(doc, dict) and doc.get("message"):
                    reason = f"{reason}: {doc['message']}" if reason else doc["message"]
            except (ValueError, TypeError):
                pass
        what = f"{kind} {namespace}/{name}" if name else f"{kind} in namespace {namespace}"
        cls = api_error_for(status)
        hint = ""
        if status in (401, 403):
            hint = " (check the credentials and that RBAC allows this verb on this kind)"
        elif status == 0:
            hint = " (is the API server reachable?)"
        return cls(
            f"{verb} {what} failed: {status or 'no answer'} {reason}{hint}".rstrip(),
            verb=verb,
            kind=kind,
            namespace=namespace,
            name=name,
            status=status,
            reason=reason,
        )

    # -- apply -------------------------------------------------------------------------------

    def apply(
        self, manifests=None, *, keep_replicas: bool = True, prune: bool = True, dry_run: bool = False
    ) -> list[dict]:
        """Server-side apply each object (``kubectl apply --server-side --force-conflicts
        --field-manager=flowserve``), then prune this instance's objects the manifests no
        longer contain; returns what was done per object.

        ``manifests``: dicts as ``render`` makes them (default: ``render(self.config)``).
        ``keep_replicas``: an existing Deployment keeps its live replica count (what the
        autoscaler set) instead of the manifest's; the apply then carries the live
        ``resourceVersion``, so a scale in between is a conflict, retried with the new count.
        ``prune``: delete the objects labelled ``app.kubernetes.io/instance=<name>`` and
        ``managed-by=flowserve`` of the kinds ``render`` makes (never Secrets or volume
        claims) that are not among ``manifests``, e.g. the GPU executors after a re-render
        without them, or the autoscaler's Role after turning autoscaling off. It needs every
        manifest in ``config.namespace`` and labelled with this instance.
        ``dry_run``: the server validates, admits and reports everything (``dryRun=All``)
        but persists nothing. All manifests are converted and checked before anything is sent.

            cluster.apply(render(cluster.config, plan))
            # [{"kind": "ServiceAccount", "name": "flowserve", "namespace": "ml", "action": "created"}, ...,
            #  {"kind": "Deployment", "name": "flowserve-executor-gpu", "namespace": "ml", "action": "pruned"}]
        """
        if manifests is None:
            manifests = render(self.config)
        if isinstance(manifests, dict) or not isinstance(manifests, (list, tuple)):
            raise ConfigTypeError(f"manifests must be a list of dicts, got {type(manifests).__name__}")
        for flag, value in (("keep_replicas", keep_replicas), ("prune", prune), ("dry_run", dry_run)):
            if not isinstance(value, bool):
                raise ConfigTypeError(f"{flag} must be a bool, got {type(value).__name__} {value!r}")
        extra = {"dry_run": "All"} if dry_run else {}
        checked = []
        for m in manifests:  # check everything first: no half-applied instance over a typo
            _, kind = to_api_object(m)
            body = copy.deepcopy(m)
            body["metadata"].setdefault("namespace", self.namespace)
            if prune:
                self._check_prunable(body)
            checked.append((m["kind"], body, kind))
        results = [self._apply_one(kind_name, body, kind, keep_replicas, extra) for kind_name, body, kind in checked]
        if prune:
            results += self._prune({(kind_name, body["metadata"]["name"]) for kind_name, body, _ in checked}, extra)
        return results

    def _check_prunable(self, body: dict) -> None:
        md = body["metadata"]
        instance = (md.get("labels") or {}).get(L_INSTANCE)
        if md["namespace"] != self.namespace or instance != self.config.name:
            raise FlowValueError(
                f"{describe(body)}: apply(prune=True) keeps only objects of instance {self.config.name!r} in "
                f"namespace {self.namespace!r}, but this one is in namespace {md['namespace']!r} with label "
                f"{L_INSTANCE}={instance!r}: render it with this cluster's config, or pass prune=False"
            )

    def _apply_one(
        self, kind_name: str, body: dict, kind: Kind, keep_replicas: bool, extra: dict, attempts: int = 3
    ) -> dict:
        name, ns = body["metadata"]["name"], body["metadata"]["namespace"]
        result = {"kind": kind_name, "name": name, "namespace": ns}
        for attempt in range(attempts):
            try:
                live = self._call("read", kind_name, kind, name, name, ns, namespace=ns)
            except K8sNotFoundError:
                live = None
            sent = body
            if (
                kind_name == "Deployment"
                and keep_replicas
                and live is not None
                and live.spec is not None
                and live.spec.replicas is not None
            ):
                sent = copy.deepcopy(body)
                sent["spec"]["replicas"] = live.spec.replicas
                # a precondition: had the autoscaler scaled since the read, this is a 409
                sent["metadata"]["resourceVersion"] = live.metadata.resource_version
            try:
                out = self._call(
                    "patch",
                    kind_name,
                    kind,
                    name,
                    name,
                    ns,
                    sent,
                    namespace=ns,
                    field_manager=FIELD_MANAGER,
                    force=True,
                    _content_type=APPLY_PATCH,
                    **extra,
                )
            except K8sConflictError:
                if sent is body or attempt == attempts - 1:
                    raise
                continue  # scaled meanwhile: read the new count and apply again
            if live is None:
                result["action"] = "created"
            else:
                same = out.metadata.resource_version == live.metadata.resource_version
                result["action"] = "unchanged" if same else "configured"
                if sent is not body and body["spec"].get("replicas", 1) != live.spec.replicas:
                    result["kept_replicas"] = live.spec.replicas
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def _prune(self, keep: set, extra: dict) -> list[dict]:
        """Delete this instance's applied objects (``PRUNE_ORDER`` kinds) not in ``keep``."""
        pruned = self._delete_labelled(PRUNE_ORDER, managed_selector(self.config), keep, extra)
        return [dict(d, action="pruned") for d in pruned]

    def _delete_labelled(self, kinds, selector: str, keep: set = frozenset(), extra: dict | None = None) -> list[dict]:
        """Delete the objects of ``kinds`` (in that order) that ``selector`` lists, but those
        in ``keep`` ((kind, name) pairs) and those already going; what was deleted."""
        deleted = []
        for key in kinds:
            kind, kind_name = KINDS[key], key[1]
            for item in self._call("list", kind_name, kind, "", self.namespace, label_selector=selector).items or []:
                name = item.metadata.name
                if (kind_name, name) in keep or item.metadata.deletion_timestamp is not None:
                    continue
                try:
                    self._call(
                        "delete",
                        kind_name,
                        kind,
                        name,
                        name,
                        self.namespace,
                        propagation_policy="Foreground" if kind.api == "apps" else "Background",
                        **(extra or {}),
                    )
                except K8sNotFoundError:
                    continue  # deleted meanwhile
                deleted.append({"kind": kind_name, "name": name, "namespace": self.namespace})
        return deleted

    # -- secrets -----------------------------------------------------------------------------

    def ensure_secrets(self) -> list[str]:
        """Create the KVS password and admin token Secrets with random values if they do not
        exist (existing ones are never changed); returns the names created.

        The values are generated here and sent straight to the API server: they appear in
        no manifest, file or log.
        """
        created = []
        kind = KINDS[("v1", "Secret")]
        client = _client()
        for name, key, component in (
            (self.config.redis_secret_name, "password", "kvs"),
            (self.config.admin_secret_name, "token", "gateway"),
            (self.config.cluster_key_secret_name, "key", "gateway"),
        ):
            try:
                self._call("read", "Secret", kind, name, name, self.namespace)
                continue
            except K8sNotFoundError:
                pass
            if component == "kvs" and self.config.external_kvs is not None:
                # a random password would not be the external store's: it must be given
                raise ConfigError(
                    f"Secret {self.namespace}/{name} (key {key!r}) must hold the password of the external "
                    f"store {redact_url(self.config.external_kvs)} (empty for none): create it (docs/kubernetes.md)"
                )
            body = client.V1Secret(
                api_version="v1",
                kind="Secret",
                type="Opaque",
                metadata=client.V1ObjectMeta(
                    name=name, namespace=self.namespace, labels=labels(self.config, component)
                ),
                string_data={key: secrets.token_hex(32) if key == "key" else secrets.token_urlsafe(32)},
            )
            self._call("create", "Secret", kind, name, self.namespace, body)
            created.append(name)
        return created

    def read_secret(self, name: str, key: str) -> str:
        """The value under ``key`` of the Secret ``name`` (the API sends it base64-encoded).

        cluster.read_secret(cluster.config.admin_secret_name, "token")
        """
        secret = self._call("read", "Secret", KINDS[("v1", "Secret")], name, name, self.namespace)
        data = secret.data or {}
        if key not in data:
            raise ConfigError(
                f"Secret {self.namespace}/{name} has no key {key!r} (keys: {sorted(data)}); "
                f"recreate it with that key (docs/kubernetes.md, section 2)"
            )
        try:
            return base64.b64decode(data[key], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as e:
            raise ConfigError(
                f"Secret {self.namespace}/{name} key {key!r} is not base64-encoded UTF-8 text: {e}"
            ) from None

    # -- scale -------------------------------------------------------------------------------

    def deployment_name(self, component_or_deployment: str) -> str:
        """``"executor-gpu"`` -> ``"<name>-executor-gpu"``; a full Deployment name of this
        instance passes through. Anything else raises ``ConfigError`` listing the choices."""
        v = component_or_deployment
        if not isinstance(v, str):
            raise ConfigTypeError(f"component must be a string, got {type(v).__name__} {v!r}")
        if v in SCALABLE:
            return object_name(self.config, v)
        if v in {object_name(self.config, c) for c in SCALABLE}:
            return v
        choices = list(SCALABLE) + [object_name(self.config, c) for c in SCALABLE]
        raise ConfigError(f"cannot scale {v!r}: expected one of {choices}")

    def scale(self, component_or_deployment: str, replicas: int) -> int:
        """Set a Deployment's replicas through its scale subresource (what an autoscaler
        calls); returns the replica count the server now wants.

            cluster.scale("executor-cpu", 4)
        """
        name = self.deployment_name(component_or_deployment)
        if not _int(replicas):
            raise ConfigTypeError(f"replicas must be an int, got {type(replicas).__name__} {replicas!r}")
        if not 0 <= replicas <= 1000:
            raise ConfigError(f"replicas must be in 0..1000, got {replicas!r}")
        kind = KINDS[("apps/v1", "Deployment")]
        scale = self._call(
            "patch",
            "Deployment",
            kind,
            name,
            name,
            self.namespace,
            {"spec": {"replicas": replicas}},
            suffix="namespaced_deployment_scale",
        )
        spec = getattr(scale, "spec", None)
        return spec.replicas if spec is not None and spec.replicas is not None else replicas

    def replicas(self, component_or_deployment: str) -> int:
        """The replicas a Deployment wants now, read from its scale subresource (what the
        autoscaler adds one to; the Role of ``rbac()`` allows reading it).

            cluster.replicas("executor-cpu")    # 2
        """
        name = self.deployment_name(component_or_deployment)
        scale = self._call(
            "read",
            "Deployment",
            KINDS[("apps/v1", "Deployment")],
            name,
            name,
            self.namespace,
            suffix="namespaced_deployment_scale",
        )
        spec = getattr(scale, "spec", None)
        return spec.replicas if spec is not None and spec.replicas is not None else 0

    def baseline_replicas(self) -> dict[str, int]:
        """Executors per device the configuration asked for (``flowserve.io/baseline-replicas``
        on the executor Deployments, else their replicas); a missing Deployment counts 0.
        The autoscaler never removes executors below these counts.

            cluster.baseline_replicas()    # {"cpu": 2, "gpu": 1}
        """
        kind = KINDS[("apps/v1", "Deployment")]
        out = {}
        for device in ("cpu", "gpu"):
            name = object_name(self.config, f"executor-{device}")
            try:
                dep = self._call("read", "Deployment", kind, name, name, self.namespace)
            except K8sNotFoundError:
                out[device] = 0
                continue
            out[device] = self._baseline_of(dep)
        return out

    def _baseline_of(self, dep) -> int:
        value = (dep.metadata.annotations or {}).get(A_BASELINE)
        if value is None:  # rendered without autoscaling: what is running is the baseline
            return dep.spec.replicas if dep.spec is not None and dep.spec.replicas is not None else 1
        if not value.isdigit():
            raise InternalError(
                f"Deployment {self.namespace}/{dep.metadata.name}: annotation {A_BASELINE}={value!r} "
                f"is not a replica count"
            )
        return int(value)

    def set_deletion_cost(self, pod: str, cost: int) -> None:
        """Annotate ``pod`` with ``controller.kubernetes.io/pod-deletion-cost``: on the next
        scale-down its ReplicaSet removes the pods of lowest cost first (after any pod that
        is not ready), so a low cost picks the pod the autoscaler drained.

            cluster.set_deletion_cost("flowserve-executor-cpu-7d9f-x2x9q", -1000)
        """
        if not isinstance(pod, str) or not pod:
            raise ConfigTypeError(f"pod must be a pod name, got {type(pod).__name__} {pod!r}")
        if not _int(cost):
            raise ConfigTypeError(f"cost must be an int, got {type(cost).__name__} {cost!r}")
        body = {"metadata": {"annotations": {DELETION_COST: str(cost)}}}
        self._call("patch", "Pod", POD, pod, pod, self.namespace, body)

    # -- delete ------------------------------------------------------------------------------

    def delete(self, *, keep_data: bool = True) -> list[dict]:
        """Delete every object labelled with this instance; returns what was deleted.

        ``keep_data`` (default): keep the KVS's PersistentVolumeClaim and the Secrets, so a
        later ``apply`` finds the same data and password. Objects already gone are skipped.
        """
        kinds = DELETE_ORDER + ([] if keep_data else DATA_KINDS)
        return self._delete_labelled(kinds, instance_selector(self.config))

    # -- status ------------------------------------------------------------------------------

    def status(self) -> dict:
        """Desired and ready replicas per component, and the gateway's address.

        {"namespace": "ml", "instance": "flowserve",
         "components": {"gateway": {"kind": "Deployment", "name": "flowserve-gateway",
                                    "replicas": 2, "ready": 2, "available": 2, "updated": 2}, ...},
         "gateway": {"type": "LoadBalancer", "cluster_ip": "10.0.0.7", "external": ["203.0.113.5"],
                     "port": 80}}
        """
        selector = instance_selector(self.config)
        components = {}
        for key in (("apps/v1", "StatefulSet"), ("apps/v1", "Deployment")):
            kind, kind_name = KINDS[key], key[1]
            for item in self._call("list", kind_name, kind, "", self.namespace, label_selector=selector).items or []:
                component = (item.metadata.labels or {}).get(L_COMPONENT, item.metadata.name)
                st = item.status
                components[component] = {
                    "kind": kind_name,
                    "name": item.metadata.name,
                    "replicas": item.spec.replicas if item.spec.replicas is not None else 1,
                    "ready": (st.ready_replicas if st else None) or 0,
                    "available": (getattr(st, "available_replicas", None) if st else None) or 0,
                    "updated": (st.updated_replicas if st else None) or 0,
                    "rolled_out": _rolled_out(kind_name, item),
                }
        out = {"namespace": self.namespace, "instance": self.config.name, "components": components, "gateway": None}
        svc_kind = KINDS[("v1", "Service")]
        gw_name = object_name(self.config, "gateway")
        try:
            svc = self._call("read", "Service", svc_kind, gw_name, gw_name, self.namespace)
        except K8sNotFoundError:
            return out
        ingress = (svc.status.load_balancer.ingress if svc.status and svc.status.load_balancer else None) or []
        out["gateway"] = {
            "type": svc.spec.type,
            "cluster_ip": svc.spec.cluster_ip,
            "external": [i.ip or i.hostname for i in ingress],
            "port": svc.spec.ports[0].port if svc.spec.ports else None,
        }
        return out

    # -- deploy ------------------------------------------------------------------------------

    def deploy(
        self,
        flow,
        *,
        optimize: bool = True,
        rules=None,
        options=None,
        gateway_url: str | None = None,
        kvs_url: str | None = None,
        wait_s: float = 300,
        timeout_s: float | None = None,
        canary: float | None = None,
        shadow: bool = False,
    ):
        """Serve ``flow`` on this instance: create the Secrets if missing, apply the manifests
        sized for its plan, wait up to ``wait_s`` seconds until the KVS, the gateway and the
        executors are ready, then register the plan and deploy it through the gateway.
        Returns the runtime's ``Deployment`` (``.invoke(rows)``, ``.url``, ``.undeploy()``).

        ``gateway_url``/``kvs_url`` (default ``config.gateway_url``/``config.kvs_url``, else the
        in-cluster DNS names): from outside the cluster, port-forward and pass local addresses;
        a KVS URL without a password gets the one from the redis Secret. ``timeout_s``: this
        flow's deadline (default: the cluster's ``request_timeout_s``). ``canary=``/``shadow=``:
        serve it beside the version served (docs/operations.md, "Canary and shadow versions").

            d = KubernetesCluster(config=cfg).deploy(flow)                 # inside the cluster
            d = cluster.deploy(flow, gateway_url="http://localhost:8080",  # kubectl port-forward
                               kvs_url="redis://localhost:6379/0")
        """
        _check_wait(wait_s)  # before anything is sent
        plan = _optimized(flow, optimize, rules, options)
        # every plan deployed through this object: GPU executors and annotations cover them all
        plans = {**self._plans, plan.flow_name: plan}
        manifests = render(self.config, list(plans.values()))
        self.ensure_secrets()
        self.apply(manifests, prune=False)  # see apply: other processes may serve other flows
        self._plans = plans
        self.wait_ready(_components(manifests), wait_s)
        url = (gateway_url or self.gateway_url()).rstrip("/")
        kvs = self.kvs_url(kvs_url)
        admin = self.read_secret(self.config.admin_secret_name, "token")
        token = self.read_secret(self.config.token_secret, "token") if self.config.token_secret else None
        key = self.read_secret(self.config.cluster_key_secret_name, "key")  # the plan is signed with it
        client = self._client_for(url, kvs, admin, token, key)
        try:
            extra: dict = {} if timeout_s is None else {"timeout_s": timeout_s}
            if canary is not None or shadow:
                extra.update(canary=canary, shadow=shadow)
            return client.deploy(flow, optimize=optimize, rules=rules, options=options, **extra)
        except Exception as e:  # whatever the deploy raised: only a connection failure is said again
            if _unreachable(e):
                raise UnreachableError(self._unreachable_message(flow, url, kvs, e)) from e
            raise

    def gateway_url(self) -> str:
        """``config.gateway_url``, else the gateway Service's in-cluster DNS name."""
        if self.config.gateway_url is not None:
            return self.config.gateway_url
        return (
            f"http://{object_name(self.config, 'gateway')}.{self.namespace}.svc.cluster.local:"
            f"{self.config.service_port}"
        )

    def kvs_url(self, url: str | None = None) -> str:
        """``url``, else ``config.kvs_url``, else the KVS Service's in-cluster DNS name; without
        a password in it, the one from the redis Secret is added (URL-quoted)."""
        url = (
            url
            or self.config.kvs_url
            or self.config.external_kvs
            or f"redis://{object_name(self.config, 'kvs')}.{self.namespace}.svc.cluster.local:{self.config.redis_port}/0"
        )
        parts = urlsplit(url)
        if parts.password is not None:
            return url
        password = self.read_secret(self.config.redis_secret_name, "password")
        host = parts.netloc.rpartition("@")[2]
        user = quote(parts.username, safe="") if parts.username else ""
        return parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host}").geturl()

    def wait_ready(self, components=None, wait_s: float = 300) -> dict:
        """Poll ``status()`` until each of ``components`` is rolled out (every wanted replica
        updated and ready); returns the last status. Raises ``DeadlineExceededError`` after
        ``wait_s`` seconds naming each component still short, with its replica counts.
        ``components`` None: the KVS, the gateway, the CPU executors and the GPU executors
        if they exist (``deploy`` passes exactly what it rendered).

            cluster.wait_ready(wait_s=120)
        """
        _check_wait(wait_s)
        deadline = time.monotonic() + wait_s
        while True:
            status = self.status()
            wanted = (
                components
                if components is not None
                else [c for c in WORKLOADS if c in REQUIRED or c in status["components"]]
            )
            pending = _pending(status["components"], wanted)
            if not pending:
                return status
            if time.monotonic() >= deadline:
                raise DeadlineExceededError(
                    f"{self.config.name} in namespace {self.namespace} not ready after {wait_s:g} s: "
                    f"{'; '.join(pending)} (see kubectl -n {self.namespace} get pods -l "
                    f"{instance_selector(self.config)}, and describe the pending ones)"
                )
            time.sleep(min(self.poll_s, max(deadline - time.monotonic(), 0)))

    def _cluster_client(
        self, url: str, kvs_url: str, admin_token: str, token: str | None, cluster_key: str | None = None
    ):
        """The runtime's client of a running cluster; one small method so tests can see what
        it is given. Imported here: the runtime is not needed to render or apply."""
        from executors.hosts.cluster import ClusterClient

        return ClusterClient(url=url, kvs_url=kvs_url, admin_token=admin_token, token=token, cluster_key=cluster_key)

    def _client_for(self, url: str, kvs_url: str, admin_token: str, token: str | None, cluster_key: str | None = None):
        # the returned Deployment calls through its client: keep it open, reuse it per address
        key = (url, kvs_url, admin_token, token, cluster_key)
        if key not in self._clients:
            self._clients[key] = self._cluster_client(url, kvs_url, admin_token, token, cluster_key)
        return self._clients[key]

    def _unreachable_message(self, flow, url: str, kvs_url: str, e: Exception) -> str:
        hint = ""
        if ".svc.cluster.local" in url or ".svc.cluster.local" in kvs_url:
            svc = object_name(self.config, "gateway"), object_name(self.config, "kvs")
            hint = (
                f"; outside the cluster these names do not resolve: run `kubectl -n {self.namespace} "
                f"port-forward svc/{svc[0]} 8080:{self.config.service_port}` and `kubectl -n {self.namespace} "
                f"port-forward svc/{svc[1]} {self.config.redis_port}`, then pass "
                f"gateway_url='http://localhost:8080', kvs_url='redis://localhost:{self.config.redis_port}/0'"
            )
        return (
            f"deploying flow {getattr(flow, 'name', flow)!r}: gateway {url} or KVS {redact_url(kvs_url)} did "
            f"not answer: {type(e).__name__}: {redact_url(str(e))}{hint}"
        )

    def close(self) -> None:
        """Close the runtime clients ``deploy`` opened (their Deployments stop working)."""
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            c.close()

    def __repr__(self) -> str:
        return f"KubernetesCluster(namespace={self.namespace!r}, instance={self.config.name!r})"


def _check_wait(wait_s) -> None:
    if not isinstance(wait_s, (int, float)) or isinstance(wait_s, bool) or not 0 <= wait_s < float("inf"):
        raise ConfigError(f"wait_s must be a number of seconds >= 0, got {wait_s!r}")


def _optimized(flow, optimize: bool, rules, options):
    """The plan ``deploy`` renders for: what the runtime client will deploy."""
    from optimizer import Plan
    from optimizer import optimize as run_optimizer

    if not isinstance(optimize, bool):
        raise ConfigTypeError(f"optimize must be a bool, got {type(optimize).__name__} {optimize!r}")
    return run_optimizer(flow, rules=rules, options=options) if optimize else Plan.from_flow(flow)


def _components(manifests: list[dict]) -> tuple[str, ...]:
    """The components of the rendered workloads (what deploy waits for)."""
    return tuple(m["metadata"]["labels"][L_COMPONENT] for m in manifests if m["kind"] in ("Deployment", "StatefulSet"))


def _rolled_out(kind_name: str, item) -> bool:
    """Like ``kubectl rollout status``: the controller saw the latest spec, every wanted
    replica runs the latest template and is ready (Deployments: available), no old pod is left."""
    st, want = item.status, item.spec.replicas if item.spec.replicas is not None else 1
    if st is None:
        return want == 0
    generation, observed = item.metadata.generation, st.observed_generation
    if generation is not None and (observed is None or observed < generation):
        return False
    updated, ready = st.updated_replicas or 0, st.ready_replicas or 0
    if kind_name == "Deployment":
        return updated >= want and (st.replicas or 0) <= updated and (st.available_replicas or 0) >= want
    return updated >= want and ready >= want


def _pending(components: dict, wanted) -> list[str]:
    out = []
    for c in wanted:
        st = components.get(c)
        if st is None:
            out.append(f"{c}: not found")
        elif not st["rolled_out"]:
            out.append(f"{c}: {st['ready']}/{st['replicas']} ready, {st['updated']} updated")
    return out


def _unreachable(e: Exception) -> bool:
    """Whether ``e`` means the gateway or the KVS could not be reached at all."""
    import httpx
    import redis

    return isinstance(e, (UnreachableError, httpx.TransportError, redis.exceptions.ConnectionError, OSError))


__all__ = ["KINDS", "Kind", "KubernetesCluster", "WORKLOADS", "describe", "to_api_object"]
