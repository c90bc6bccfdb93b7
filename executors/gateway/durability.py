"""What a gateway does when the store loses its state: notice it, and put it back.

The KVS holds the runtime's own state: plans (``PLAN_KEY``), the registry of deployed
flows (``DEPLOYED_KEY``), version counters (``VERSION_KEY``). A store that restarts empty
(persistence off, or a Redis pod without a volume) loses all of it while the gateways
still serve their flows: restarted executors could not rebuild them, other gateways
would drop them from the registry. The store marker (``kvs.markers``) tells a lost store
from an intact one: each gateway checks it with every registry read (standalone) or a
few times a second (the local cluster's daemon), and when it is gone re-publishes what
it serves -- plan, registry entry, version counter -- then writes the marker again.
Executors that restarted meanwhile get their flows built again (``reload_missing``).

User data is not re-published (the gateway does not have it): the data marker stays
missing, and lookups of missing keys answer 503 until the data is written again.
"""

from __future__ import annotations

import asyncio
import logging

from executors.plans import DEPLOYED_KEY, PLAN_KEY, raise_version, register_deployed
from kvs.markers import STORE_MARKER, mark_started
from kvs.retry import Backoff

log = logging.getLogger("flowserve.durability")

__all__ = ["mark_started", "registry_if_intact", "republish", "StoreWatch"]


def registry_if_intact(redis) -> dict[str, int] | None:
    """The registry (flow -> version), or None if the store lost its state (the store
    marker is gone). Read in one transaction with the marker: a registry read from a
    store that was just emptied must not look like every flow was undeployed."""
    pipe = redis.pipeline(transaction=True)
    pipe.exists(STORE_MARKER)
    pipe.hgetall(DEPLOYED_KEY)
    marker, registry = pipe.execute()
    if not marker:
        return None
    if isinstance(registry, list):  # a Cluster's MULTI: redis-py hands HGETALL's reply over unparsed
        registry = dict(zip(registry[::2], registry[1::2]))
    return {k.decode(): int(v) for k, v in registry.items()}


def store_intact(redis) -> bool:
    return bool(redis.exists(STORE_MARKER))


_RAISE = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""


def republish(store, flows: dict, counters: dict | None = None) -> list[str]:
    """Write back what ``flows`` (name -> DeployedFlow) needs in the store, and raise
    ``counters`` (key -> at least this value, e.g. the gateway's query-id block), then the
    store marker; returns the names. Only forward: a registry entry or counter that is
    newer (another gateway's deploy) is kept."""
    for key, value in (counters or {}).items():
        store.redis.eval(_RAISE, 1, key, str(int(value)))
    for name, f in flows.items():
        key = PLAN_KEY.format(flow=name, version=f.version)
        # the exact bytes the deploy registered: read from this same key and signed for it
        # (flow and version; kvs.serialization), so they are valid here and nowhere else
        if f.plan_blob is not None:
            store.redis.set(key, f.plan_blob)
        else:
            store.put_trusted(key, f.plan)
        raise_version(store.redis, name, f.version)
        register_deployed(store.redis, name, f.version)
    store.redis.set(STORE_MARKER, "1")
    return sorted(flows)


class StoreWatch:
    """The local cluster's watch over its store: re-publish after a loss, and build
    flows again on executors whose load failed (e.g. restarted while the store was
    empty). Runs as its own task on the gateway's loop."""

    def __init__(self, store, dispatcher, load_timeout_s: float, period_s: float = 0.2, retry_s: float = 1.0):
        self.store, self.dispatcher = store, dispatcher
        self.load_timeout_s, self.period_s, self.retry_s = load_timeout_s, period_s, retry_s
        self._failing = False
        self._backoff = Backoff(retry_s, 30.0)  # loads that keep failing are retried less often

    async def run(self) -> None:
        while True:
            try:
                await self.check()
                self._failing = False
                await asyncio.sleep(self.period_s)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the store may be restarting: try again shortly
                if not self._failing:
                    log.warning("store watch: %s; retrying", e)
                self._failing = True
                await asyncio.sleep(self.retry_s)

    async def check(self) -> None:
        if not await asyncio.to_thread(store_intact, self.store.redis):
            flows = dict(self.dispatcher.flows)
            names = await asyncio.to_thread(republish, self.store, flows)
            log.warning("the KVS lost its data (restarted empty); re-published flows %s", names)
        failed = await self.dispatcher.reload_missing(self.load_timeout_s)
        if failed:
            for name in {flow for flow, _ in failed}:
                await asyncio.to_thread(self._restore_plan, name)
            delay = self._backoff.next()
            log.warning("building flows again failed on some executors (retrying in %.1f s): %s", delay, failed)
            await asyncio.sleep(delay)
        else:
            self._backoff.reset()

    def _restore_plan(self, name: str) -> None:
        """A version's plan is written once, by its deploy: other bytes under its key were
        put there by someone else (another flow's plan, an older version: refused by their
        signature). Write back the bytes this gateway serves, so executors build it again."""
        f = self.dispatcher.flows.get(name)
        if f is None or f.plan_blob is None:
            return
        key = PLAN_KEY.format(flow=name, version=f.version)
        stored = self.store.get_bytes(key)
        if stored is not None and stored != f.plan_blob:
            log.error("the plan under %s is not the one deployed (replaced in the store); writing it back", key)
            self.store.redis.set(key, f.plan_blob)
