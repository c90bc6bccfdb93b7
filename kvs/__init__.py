"""FlowServe's key-value store: Redis-backed, with an executor-local cache.

Lookups, registered flows and functions, membership and metrics live here.

    from kvs import RedisServer, CachedKVS, KVSRef

    with RedisServer() as server:                 # embedded redis-server, free port
        store = CachedKVS.from_url(server.url)    # KVS.from_url for no local cache
        store.put("emb/1", np.zeros((512, 512)))
        store.get("emb/1")                        # network read, then cached
        store.get("emb/1")                        # local hit: microseconds
        KVSRef("emb/1").resolve(store)            # pass refs downstream, not data

Modules: ``client`` (KVS), ``cache`` (CachedKVS), ``tracking`` (invalidations),
``serialization`` (the codec), ``server`` (RedisServer), ``ref``, ``options``,
``errors``; for a replicated or sharded store: ``urls`` (the URL forms: one server,
Sentinel, Cluster), ``connect`` (a redis-py client for each), ``replicas`` (writes that
wait for a replica), ``sentinel_watch`` (a Sentinel failover heard at once) and
``replicated`` (a Sentinel set and a Redis Cluster on this machine, for tests and trials).
"""

from kvs.cache import CachedKVS, CacheStats
from kvs.client import KVS, MISSING
from kvs.errors import KeyNotFoundError, SerializationError, StoreLostError, StoreWriteError
from kvs.options import KVSOptions
from kvs.ref import KVSRef
from kvs.serialization import decode, dumps_trusted, encode, loads_trusted
from kvs.server import RedisServer, find_server_binary

__all__ = [
    "KVS",
    "CachedKVS",
    "CacheStats",
    "KVSOptions",
    "KVSRef",
    "StoreLostError",
    "StoreWriteError",
    "RedisServer",
    "find_server_binary",
    "MISSING",
    "encode",
    "decode",
    "dumps_trusted",
    "loads_trusted",
    "KeyNotFoundError",
    "SerializationError",
]
