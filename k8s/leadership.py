"""The lease that elects which gateway replica runs the control loop on Kubernetes: a
coordination.k8s.io/v1 Lease (``<instance>-leader``), as controllers elect their leader.

The runtime's lease interface (executors/hosts/leadership.py) with the API server as where
the lease is kept:

* **Taking it.** A replica takes the Lease when it has no holder, or when its record (holder,
  renew time, resource version) has not changed for ``leaseDurationSeconds`` *as this
  replica observed it*, on its own clock: no two nodes' clocks are compared. The write is a
  replace carrying the resource version that was read, so of two replicas that try at once
  the API server lets exactly one in (the other gets 409). ``leaseTransitions`` counts the
  takings.
* **Keeping it.** The holder replaces the Lease with a new ``renewTime`` every
  ``renew_s`` (again under the resource version it last wrote), and stops acting
  ``lease_s x (1 - DRIFT)`` after the last renewal it sent; another replica can take it only
  ``leaseDurationSeconds`` (``lease_s`` rounded up) after it *observed* that renewal, so later.
* **Fencing.** The API server does not check our tokens, so the fencing token of a term is
  drawn from the store's counter (``Fence.issue``, an INCR) right after the Lease is taken,
  and every decision is checked against it where it is carried out, as with the store's
  lease. A holder that finds the counter moved on without it (the store restarted empty)
  draws a new one.

The Role the manifests render with autoscaling allows ``get`` and ``update`` on this one
Lease, and ``create`` (which a Role cannot narrow to a name) on Leases of the namespace.

    lease = KubeLease.from_incluster("ml", "flowserve-leader", identity(), Fence(store.redis))
"""

from __future__ import annotations

import datetime
import math

from executors.hosts.leadership import Fence, Lease
from flow.errors import AccessDeniedError, NotInstalledError
from k8s.errors import api_error_for

LEASE_API = "coordination.k8s.io"


def _now() -> str:
    """MicroTime, as the API server writes it."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubeLease(Lease):
    """A coordination.k8s.io/v1 Lease held by one gateway replica at a time (see the
    module's docstring). ``api``: a ``kubernetes.client.CoordinationV1Api``."""

    def __init__(self, api, namespace: str, name: str, identity: str, fence: Fence, **timing):
        super().__init__(identity, **timing)
        self.api = api
        self.namespace = namespace
        self.name = name
        self.fence_counter = fence
        self.duration_s = max(1, math.ceil(self.lease_s))  # the Lease holds whole seconds
        self._doc: dict | None = None  # the Lease as last read or written (with its resourceVersion)
        self._observed: tuple | None = None  # (holder, renewTime, resourceVersion) as last seen
        self._observed_at = 0.0  # when that was first seen, on this replica's clock

    @classmethod
    def from_incluster(cls, namespace: str, name: str, identity: str, fence: Fence, **timing) -> KubeLease:
        """Inside a pod: the API server and token of the pod's ServiceAccount (the Role the
        manifests render with autoscaling allows this Lease)."""
        try:
            import kubernetes.client as client
            from kubernetes import config as kconfig
        except ImportError as e:
            raise NotInstalledError(
                f"--leader-election k8s needs the kubernetes client: pip install 'flowserve[k8s]' ({e})"
            ) from e
        configuration = client.Configuration()
        try:
            kconfig.load_incluster_config(client_configuration=configuration)
        except kconfig.ConfigException as e:
            raise AccessDeniedError(
                f"no in-cluster Kubernetes credentials for the Lease {namespace}/{name} "
                f"(--leader-election k8s runs only in a pod whose ServiceAccount token is mounted): {e}"
            ) from e
        return cls(
            client.CoordinationV1Api(client.ApiClient(configuration)), namespace, name, identity, fence, **timing
        )

    # -- the API ----------------------------------------------------------------------------------

    def _call(self, verb: str, fn, *args):
        """``fn(*args)``; None on 404 or 409 (not there; changed since it was read), the
        tree's error for any other failure (``k8s.errors.api_error_for``)."""
        try:
            return self.api.api_client.sanitize_for_serialization(fn(*args))
        except Exception as e:  # the client's ApiException, urllib3's connection errors
            status = getattr(e, "status", None)
            if status in (404, 409):
                return None
            status = status if isinstance(status, int) else 0
            reason = getattr(e, "reason", None) or f"{type(e).__name__}: {e}"
            cls = api_error_for(status)
            raise cls(
                f"{verb} Lease {self.namespace}/{self.name} failed: {status or 'no answer'} {reason}",
                verb=verb,
                kind="Lease",
                namespace=self.namespace,
                name=self.name,
                status=status,
                reason=reason,
            ) from e

    def _read(self) -> dict | None:
        return self._call("get", self.api.read_namespaced_lease, self.name, self.namespace)

    def _write(self, doc: dict, holder: str | None, transitions: int, acquired: bool) -> dict | None:
        spec = dict(doc.get("spec") or {})
        now = _now()
        spec.update(
            holderIdentity=holder, leaseDurationSeconds=self.duration_s, renewTime=now, leaseTransitions=transitions
        )
        if acquired:
            spec["acquireTime"] = now
        body = {**doc, "spec": spec}
        return self._call("update", self.api.replace_namespaced_lease, self.name, self.namespace, body)

    # -- the lease interface ----------------------------------------------------------------------

    def _observe(self, doc: dict) -> None:
        spec = doc.get("spec") or {}
        key = (spec.get("holderIdentity"), spec.get("renewTime"), doc["metadata"].get("resourceVersion"))
        if key != self._observed:
            self._observed, self._observed_at = key, self.clock()
        self.holder = spec.get("holderIdentity") or None

    def try_acquire(self) -> int | None:
        doc = self._read()
        if doc is None:
            body = {
                "apiVersion": f"{LEASE_API}/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": self.duration_s,
                    "acquireTime": _now(),
                    "renewTime": _now(),
                    "leaseTransitions": 0,
                },
            }
            doc = self._call("create", self.api.create_namespaced_lease, self.namespace, body)
            if doc is None:
                return None  # another replica created it first
        else:
            self._observe(doc)
            spec = doc.get("spec") or {}
            holder = spec.get("holderIdentity") or None
            held_s = self.clock() - self._observed_at
            duration = spec.get("leaseDurationSeconds") or self.duration_s
            if holder not in (None, self.identity) and held_s < duration:
                return None  # held, and renewed within its duration as far as this replica saw
            transitions = (spec.get("leaseTransitions") or 0) + (holder != self.identity)
            doc = self._write(doc, self.identity, transitions, acquired=True)
            if doc is None:
                return None  # another replica took it, or the holder renewed, since it was read
        self._doc = doc
        self._observe(doc)
        return self.fence_counter.issue()

    def try_renew(self, token: int) -> int | None:
        doc = self._doc if self._doc is not None else self._read()
        if doc is None:
            return None
        spec = doc.get("spec") or {}
        written = self._write(doc, self.identity, spec.get("leaseTransitions") or 0, acquired=False)
        if written is None:  # changed since this replica wrote it: whose is it now?
            doc = self._read()
            if doc is None or (doc.get("spec") or {}).get("holderIdentity") != self.identity:
                self._doc = None
                if doc is not None:
                    self._observe(doc)
                return None
            written = self._write(doc, self.identity, (doc.get("spec") or {}).get("leaseTransitions") or 0, False)
            if written is None:
                self._doc = None
                return None
        self._doc = written
        self._observe(written)
        if not self.fence_counter.admits(token):
            # the Lease is ours but the counter moved on: the store restarted empty
            return self.fence_counter.issue()
        return token

    def release(self, token: int) -> None:
        doc = self._read()
        if doc is None or (doc.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        spec = doc.get("spec") or {}
        self._write(doc, None, spec.get("leaseTransitions") or 0, acquired=False)
        self._doc = None
