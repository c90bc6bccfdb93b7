"""The store's record of deployed flows, which every process of a cluster reads: the
plans (signed pickles of the optimized plan, one key per flow version, checked against the
key they are read from), their version counters, the registry of what is deployed, and the
cluster key plans are signed with.

Deployed flows are registered in the hash ``flowserve:deployed`` (flow -> version) by
whichever gateway receives ``POST /admin/deploy``; every gateway loads what the registry
says, so several gateway replicas serve the same flows. An entry only moves to a newer
version (``register_deployed``): of concurrent deploys the newest wins everywhere.

On a replicated store (Sentinel, Cluster) every write here waits until a replica holds it
(``kvs/replicas.py``): a deploy acknowledged is never lost to a failover, and a version
counter never goes back to issue a version twice. Each script touches one key, so each
runs on one Cluster node; the keys keep the names they have always had (stored plans are
signed for their key's name: a rename would orphan them), and nothing reads or writes a
plan and its flow's counter in one call, so they need not share a slot.
"""

from __future__ import annotations

import os

from flow.configuration import ConfigError
from kvs.errors import SerializationError
from kvs.replicas import Write, written

PLAN_KEY = "flowserve:plan:{flow}:{version}"
VERSION_KEY = "flowserve:version:{flow}"
DEPLOYED_KEY = "flowserve:deployed"
KEY_ENV = "FLOWSERVE_CLUSTER_KEY"  # the cluster key (hex) plans are signed with; never stored in the KVS

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
    restarts of the store (see ``_NEXT_VERSION``) and failovers (it waits for a replica);
    shown to users as ``v<N>``."""
    return int(_script(redis, VERSION_KEY.format(flow=flow), _NEXT_VERSION))


def raise_version(redis, flow: str, version: int) -> None:
    """Make ``flow``'s counter at least ``version`` (never lowers it)."""
    _script(redis, VERSION_KEY.format(flow=flow), _RAISE_VERSION, str(int(version)))


def _script(redis, key: str, script: str, *args: str):
    """Run a one-key Lua ``script`` on ``key`` (where its Cluster node is), waiting for the
    store's replicas."""
    return written(redis, [Write(key, ("EVAL", script, 1, key, *args))])[0]


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


# HSET only forward: a version older than the registered one never replaces it
_REGISTER = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and tonumber(cur) > tonumber(ARGV[2]) then return cur end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]
"""


def register_deployed(redis, name: str, version: int) -> int:
    """Register ``name`` at ``version`` unless a newer version is registered; returns the
    version registered afterwards (``version``, or the newer one that won)."""
    return int(_script(redis, DEPLOYED_KEY, _REGISTER, name, str(int(version))))


def cluster_key(hex_key: str | None = None) -> bytes | None:
    """The cluster key from ``hex_key`` or else ``$FLOWSERVE_CLUSTER_KEY`` (None: plans
    unsigned, as on a Kubernetes deployment whose Secret does not carry one yet)."""
    value = hex_key if hex_key is not None else os.environ.get(KEY_ENV)
    if not value:
        return None
    try:
        key = bytes.fromhex(value)
    except ValueError:
        raise ConfigError(f"{KEY_ENV} must be hex, got {len(value)} characters that are not") from None
    if len(key) < 16:
        raise ConfigError(f"{KEY_ENV} must hold at least 16 bytes (32 hex digits), got {len(key)}")
    return key
