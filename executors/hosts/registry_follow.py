"""Serve what the store's registry of deployed flows lists: several gateways serving one
cluster each take their own share of deploys and undeploys, and every one serves them all.

Used by the standalone gateway (executors/hosts/standalone.py) on every sync, and by the
local cluster's gateways when there are several of them (executors/hosts/local_gateway.py).
"""

from __future__ import annotations

import logging
import time

from executors.gateway.deploys import LoadFailed

log = logging.getLogger("flowserve.gateway")

RETRY_FAILED_S = 5.0  # a registered version that failed to load here is tried again after this


class RegistryFollower:
    """Brings one gateway's served flows in line with the registry (flow -> version): newer
    versions are loaded, flows no longer listed are undeployed. A deploy or undeploy this
    gateway handled after the registry was read wins over what was read.

        follower = RegistryFollower(gateway)
        await follower.changed(registry_if_intact(store.redis), read_at=time.monotonic())
    """

    def __init__(self, gateway):
        self.gateway = gateway
        self._failed_loads: dict[tuple[str, int], float] = {}  # (flow, version) -> retry after

    async def changed(self, registry: dict[str, int], read_at: float) -> None:
        d = self.gateway.dispatcher
        deploys = self.gateway.deploys

        def newer_here(name: str) -> bool:
            # a deploy or undeploy this gateway handled since the registry was read is newer
            # than what was read (checked at each step: loading a flow below takes a while)
            return deploys.changed_at.get(name, float("-inf")) >= read_at

        for name in [n for n in d.flows if n not in registry and not newer_here(n)]:
            log.warning("flow %s was undeployed", name)
            d.uninstall(name)  # its replicas go once its requests here finish
        now = time.monotonic()
        for name, version in sorted(registry.items()):
            if newer_here(name):
                continue
            current = d.flows.get(name)
            if (current is not None and current.version >= version) or self._failed_loads.get((name, version), 0) > now:
                continue
            try:
                await deploys.load_flow(name, version, install_if=lambda n=name: not newer_here(n))
            except LoadFailed as e:
                # e.g. no executor yet: try again, without flooding the log
                log.warning("flow %s v%s is not served here yet: %s", name, version, e.message)
                self._failed_loads[(name, version)] = now + RETRY_FAILED_S
