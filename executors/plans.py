"""Which executors host a replica of each stage of a deployed plan.

Any executor can host any stage. A stage gets ``max(replicas, competitive)`` replicas,
spread round-robin from a per-stage offset so stages of one flow land on different
executors; a plan sized by the SLO planner (``plan.slo``) gets exactly its replicas. GPU stages go to gpu-class executors when the cluster has any; on a machine
without them they run on CPU executors (the executors log a warning; torch code falls
back to the CPU). CPU stages prefer cpu-class executors so they do not hold a GPU.
"""

from __future__ import annotations

import logging

from executors.errors import NoExecutorError
from kvs.exceptions import SerializationError

PLAN_KEY = "flowserve:plan:{flow}:{version}"
VERSION_KEY = "flowserve:version:{flow}"

# A flow's next version: one more than its last, and never below the server's clock in
# milliseconds. Executors cache built stages by (flow, version), so a version must never
# be issued twice, even by a store that restarted empty (its counter back at 0): the
# clock floor puts every version after a loss above every version issued before it.
_NEXT_VERSION = """
local n = redis.call('INCR', KEYS[1])
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if n < floor then
  redis.call('SET', KEYS[1], floor)
  n = floor
end
return n
"""
# Raise a counter to at least a version (a gateway re-publishing what it serves).
_RAISE_VERSION = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""


def next_version(redis, flow: str) -> int:
    """A new version number for ``flow``: strictly greater than any issued before, across
    restarts of the store (see ``_NEXT_VERSION``); shown to users as ``v<N>``."""
    return int(redis.eval(_NEXT_VERSION, 1, VERSION_KEY.format(flow=flow)))


def raise_version(redis, flow: str, version: int) -> None:
    """Make ``flow``'s counter at least ``version`` (never lowers it)."""
    redis.eval(_RAISE_VERSION, 1, VERSION_KEY.format(flow=flow), str(int(version)))


log = logging.getLogger("flowserve.placement")


def load_plan(store, flow: str, version: int):
    """The plan of ``flow`` v``version`` from the store, as executors and tools read it.

    Its signature is checked against the key it is read from (kvs.serialization signs the
    key, so the flow and version, with the plan), and the plan's own flow name against
    ``flow``: a plan copied from another flow or version is refused (``SerializationError``
    naming the key), never built."""
    key = PLAN_KEY.format(flow=flow, version=version)
    return checked_plan(store.get(key, trusted=True), flow, key)


def checked_plan(plan, flow: str, key: str):
    """``plan`` if it is a plan of ``flow``; else ``SerializationError`` naming ``key``.

    Defence in depth behind the signature's binding to ``key``: a plan stored under the
    wrong flow's key by the cluster itself (or by a forger with the cluster key) is not
    served as that flow."""
    name = getattr(plan, "flow_name", None)
    if name != flow:
        raise SerializationError(
            f"value of key {key!r}: a plan of flow {name!r}, not of flow {flow!r} as its key says: refused"
        )
    return plan


def place(plan, executors: dict) -> dict[str, list[str]]:
    """stage name -> ids of the executors hosting its replicas."""
    live = sorted((e for e in executors.values() if e.alive), key=lambda e: e.id)
    if not live:
        raise NoExecutorError(f"flow {plan.flow_name!r}: the cluster has no live executor")
    gpus = [e for e in live if e.device == "gpu"]
    cpus = [e for e in live if e.device == "cpu"] or live
    placement = {}
    for offset, (name, stage) in enumerate(plan.stages.items()):
        pool = cpus
        if stage.device == "gpu":
            if gpus:
                pool = gpus
            else:
                log.warning("stage %s wants a GPU; none in the cluster, running it on CPU executors", name)
        if stage.continuation is not None:
            # key-routed: every executor may own some keys, so all of them host it
            placement[name] = [e.id for e in pool]
            continue
        wanted = max(stage.replicas, stage.competitive)
        if stage.replicas == 1 and stage.competitive == 1 and not getattr(plan.slo, "planned", False):
            wanted = len(pool)  # default: any executor may take it, the least loaded does
        n = min(wanted, len(pool))
        placement[name] = [pool[(offset + j) % len(pool)].id for j in range(n)]
    return placement
