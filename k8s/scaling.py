"""The autoscaler's backend on Kubernetes: executors are pods of the executor Deployments.

    # in the gateway (``--scaler k8s --k8s-namespace ml --k8s-instance flowserve``)
    backend = KubernetesExecutors.from_incluster("ml", "flowserve", dispatcher)
    new_id = await backend.add_executor("gpu")     # executor-gpu +1, wait for it to register
    await backend.remove_executor(idle_id)         # exactly that pod goes, executor-gpu -1
    backend.removable()                            # executors beyond the configured counts

The interface the runtime's scaling loop drives (``add_executor``, ``remove_executor``,
``removable``). An executor's id is its pod name (``--id $(POD_NAME)``). Adding scales the
Deployment up by one and waits until the dispatcher sees a new executor of that device
register; removing first gives the drained pod the lowest
``controller.kubernetes.io/pod-deletion-cost``, then scales down by one, so the ReplicaSet
removes that pod rather than a busy one. The Kubernetes client blocks: every call runs in
the event loop's default executor.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping

from flow.configuration import ConfigError, ConfigTypeError
from flow.errors import AccessDeniedError, InternalError, NotInstalledError
from k8s.backend import KubernetesCluster
from k8s.errors import K8sNotFoundError
from k8s.kube_config import KubeConfig, _int
from k8s.manifests import SCALABLE

log = logging.getLogger("flowserve.k8s.scaling")

# below every other pod's cost (default 0): the ReplicaSet deletes this one first, unless a
# pod is not ready (unready pods go before any ready one, whatever their cost)
REMOVE_COST = -1000


class KubernetesExecutors:
    """Adds and removes executors by scaling this instance's executor Deployments.

    ``cluster``: the ``KubernetesCluster`` of the instance. ``dispatcher``: the gateway's
    dispatcher (``.executors``: id -> info with ``.id``, ``.device``, ``.alive``, and
    ``await wait_for_executor(device, known, timeout)``). ``baseline``: executors per
    device that are never removed (the configured counts). ``wait_s``: how long a new
    executor may take to start and register (image pull, model load) before the scale-up
    is undone.

        backend = KubernetesExecutors(cluster, dispatcher, {"cpu": 2, "gpu": 1})
    """

    def __init__(self, cluster: KubernetesCluster, dispatcher, baseline: Mapping[str, int], wait_s: float = 120):
        if not isinstance(cluster, KubernetesCluster):
            raise ConfigTypeError(
                f"cluster must be a k8s.KubernetesCluster, got {type(cluster).__name__} {cluster!r:.80}"
            )
        self.cluster = cluster
        self.dispatcher = dispatcher
        self.baseline = _check_baseline(baseline)
        if not isinstance(wait_s, (int, float)) or isinstance(wait_s, bool) or not 0 < wait_s < float("inf"):
            raise ConfigError(f"wait_s must be a number of seconds > 0, got {wait_s!r}")
        self.wait_s = wait_s
        self._locks: dict[str, asyncio.Lock] = {}
        # ids add_executor returned: two concurrent scale-ups of one device wait for "a new
        # executor", and the first pod to register must not satisfy both
        self._claimed: set[str] = set()

    @classmethod
    def from_incluster(
        cls, namespace: str, instance: str, dispatcher, baseline: Mapping[str, int] | None = None, wait_s: float = 120
    ) -> KubernetesExecutors:
        """Inside a pod: the API server and token of the pod's ServiceAccount (the Role that
        ``render`` adds with ``autoscaling`` allows exactly these calls). ``baseline`` None:
        read from the executor Deployments (``KubernetesCluster.baseline_replicas``; this
        blocks for two API calls, once at start-up).

            backend = KubernetesExecutors.from_incluster("ml", "flowserve", dispatcher)
        """
        cluster = incluster_cluster(namespace, instance)
        if baseline is None:
            baseline = cluster.baseline_replicas()
        return cls(cluster, dispatcher, baseline, wait_s)

    # -- the backend interface ----------------------------------------------------------------

    async def add_executor(self, device: str) -> str | None:
        """Start one more executor of ``device``; its id once registered and serving, None
        when impossible (no executor Deployment for that device) or when it did not register
        within ``wait_s`` (the scale-up is then undone). API failures raise what ``k8s.errors.api_error_for`` says."""
        component = self._component(device)
        known = set(self.dispatcher.executors)
        self._claimed &= known  # ids of executors gone since can never come back as "new"
        async with self._lock(device):
            try:
                n = await self._run(self.cluster.replicas, component)
            except K8sNotFoundError:
                log.warning(
                    "cannot add a %s executor: Deployment %s/%s does not exist",
                    device,
                    self.cluster.namespace,
                    self.cluster.deployment_name(component),
                )
                return None
            await self._run(self.cluster.scale, component, n + 1)
        log.info("scaled %s to %d replicas; waiting up to %gs for the new executor", component, n + 1, self.wait_s)
        new = await self._wait_new(device, known)
        if new is not None:
            return new
        log.warning("no new %s executor registered within %gs: scaling %s back down", device, self.wait_s, component)
        await self._scale_down(device, component)
        return None

    async def remove_executor(self, executor_id: str) -> None:
        """Stop the (idle, drained) executor ``executor_id``: mark its pod as the one to
        delete, then scale its Deployment down by one."""
        info = self.dispatcher.executors.get(executor_id)
        if info is None:
            raise InternalError(f"cannot remove executor {executor_id!r}: the dispatcher knows no such executor")
        component = self._component(info.device)
        # a pod that is gone raises K8sNotFoundError here, before any scale-down: scaling
        # down blind would stop another, possibly busy, executor
        await self._run(self.cluster.set_deletion_cost, executor_id, REMOVE_COST)
        await self._scale_down(info.device, component)
        self._claimed.discard(executor_id)
        log.info("removed executor %s (%s)", executor_id, component)

    def removable(self) -> list[str]:
        """Live executors beyond ``baseline`` per device, newest registered first."""
        by_device: dict[str, list[str]] = {}
        for info in self.dispatcher.executors.values():  # registration order
            if info.alive:
                by_device.setdefault(info.device, []).append(info.id)
        out = []
        for device, ids in by_device.items():
            extra = len(ids) - self.baseline.get(device, 0)
            if extra > 0:
                out += ids[::-1][:extra]
        return out

    # -- helpers -----------------------------------------------------------------------------

    async def _wait_new(self, device: str, known: set[str]) -> str | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while (remaining := deadline - loop.time()) > 0:
            new = await self.dispatcher.wait_for_executor(device, known=known | self._claimed, timeout=remaining)
            if new is None:
                return None
            if new not in self._claimed:
                self._claimed.add(new)
                return new
            known.add(new)  # a concurrent add_executor took it while we were waking up
        return None

    async def _scale_down(self, device: str, component: str) -> None:
        # read and write under the device's lock: a concurrent add must not be overwritten
        async with self._lock(device):
            n = await self._run(self.cluster.replicas, component)
            if n > 0:
                await self._run(self.cluster.scale, component, n - 1)

    def _component(self, device) -> str:
        component = f"executor-{device}" if isinstance(device, str) else None
        if component not in SCALABLE:
            raise ConfigError(f"device must be 'cpu' or 'gpu', got {device!r}")
        return component

    def _lock(self, device: str) -> asyncio.Lock:
        return self._locks.setdefault(device, asyncio.Lock())

    @staticmethod
    async def _run(fn, *args):
        """``fn(*args)`` in the default thread pool: the Kubernetes client blocks."""
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))

    def __repr__(self) -> str:
        return (
            f"KubernetesExecutors(namespace={self.cluster.namespace!r}, instance={self.cluster.config.name!r}, "
            f"baseline={self.baseline!r})"
        )


def incluster_cluster(namespace: str, instance: str) -> KubernetesCluster:
    """A ``KubernetesCluster`` for ``instance`` in ``namespace`` using the pod's ServiceAccount
    credentials (never a kubeconfig: a gateway must not pick up someone's local admin)."""
    config = KubeConfig(name=instance, namespace=namespace)  # validates both names
    try:
        import kubernetes.client as client
        from kubernetes import config as kconfig
    except ImportError as e:
        raise NotInstalledError(f"--scaler k8s needs the kubernetes client: pip install 'flowserve[k8s]' ({e})") from e
    configuration = client.Configuration()
    try:
        # into our own Configuration, not the process-wide default; the token is re-read
        # from its file when it expires (bound tokens rotate)
        kconfig.load_incluster_config(client_configuration=configuration)
    except kconfig.ConfigException as e:
        raise AccessDeniedError(
            f"no in-cluster Kubernetes credentials for namespace {namespace!r}, instance {instance!r} "
            f"(--scaler k8s runs only in a pod whose ServiceAccount token is mounted): {e}"
        ) from e
    api_client = client.ApiClient(configuration)
    return KubernetesCluster(
        config=config,
        apps_api=client.AppsV1Api(api_client),
        core_api=client.CoreV1Api(api_client),
        networking_api=client.NetworkingV1Api(api_client),
        rbac_api=client.RbacAuthorizationV1Api(api_client),
    )


def _check_baseline(baseline) -> dict[str, int]:
    if not isinstance(baseline, Mapping):
        raise ConfigTypeError(
            f"baseline must be a mapping of device to executor count, got {type(baseline).__name__} {baseline!r}"
        )
    for device, n in baseline.items():
        if device not in ("cpu", "gpu"):
            raise ConfigError(f"baseline: device must be 'cpu' or 'gpu', got {device!r}")
        if not _int(n):
            raise ConfigTypeError(f"baseline[{device!r}] must be an int >= 0, got {type(n).__name__} {n!r}")
        if n < 0:
            raise ConfigError(f"baseline[{device!r}] must be an int >= 0, got {n!r}")
    return dict(baseline)


__all__ = ["KubernetesExecutors", "REMOVE_COST", "incluster_cluster"]
