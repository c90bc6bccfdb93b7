"""``KVS`` and ``CachedKVS`` against a real Sentinel set and a real Redis Cluster
(``redis+sentinel://`` and ``redis+cluster://`` URLs): values, the cache and its
invalidation on every shard, signed plans."""

from __future__ import annotations

import numpy as np
import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot

from kvs import KVS, CachedKVS, KeyNotFoundError, SerializationError
from tests.kvs.helpers import InvalidationRecorder

SIGNING_KEY = bytes(range(32))


def keys_on_every_primary(store, prefix: str = "k", per_node: int = 2) -> list[str]:
    """Keys that fall on each primary of ``store`` (all on the one primary of a Sentinel set)."""
    if store.__class__.__name__ != "ClusterStore":
        return [f"{prefix}{i}" for i in range(per_node * 3)]
    wanted = {p.port: [] for p in store.primaries()}
    i = 0
    while any(len(v) < per_node for v in wanted.values()):
        key = f"{prefix}{i}"
        port = store.primary_port_for_slot(key_slot(key.encode()))
        if len(wanted[port]) < per_node:
            wanted[port].append(key)
        i += 1
    return [k for keys in wanted.values() for k in keys]


def test_the_url_picks_the_client(replicated):
    with KVS.from_url(replicated.url) as store:
        kind = "cluster" if replicated.__class__.__name__ == "ClusterStore" else "sentinel"
        assert store.kind == kind
        assert isinstance(store.redis, RedisCluster) == (kind == "cluster")
        assert store.ping()
        assert "***" in store.url and replicated.password not in store.url


def test_values_on_every_shard(replicated):
    keys = keys_on_every_primary(replicated)
    with KVS.from_url(replicated.url) as store:
        store.mput({k: np.full(3, i, dtype=np.int32) for i, k in enumerate(keys)})  # one MSET per slot
        assert [int(v[0]) for v in store.mget(keys)] == list(range(len(keys)))
        store.put("one", {"a": [1, 2.5]})
        assert store.get("one") == {"a": [1, 2.5]}
        assert store.exists(keys[-1]) and not store.exists("absent")
        assert store.mget([keys[0], "absent", keys[-1]], default=None)[1] is None
        with pytest.raises(KeyNotFoundError, match="'absent'"):
            store.get("absent")
        assert store.delete(*keys) == len(keys)  # one DEL per slot, summed
        assert store.mget(keys, default=None) == [None] * len(keys)


def test_cached_reads_are_invalidated_by_another_clients_write_on_every_shard(replicated):
    keys = keys_on_every_primary(replicated, "c", per_node=1)
    with KVS.from_url(replicated.url) as writer, CachedKVS.from_url(replicated.url) as cached:
        writer.mput({k: f"old {k}" for k in keys})
        assert cached.mget(keys) == [f"old {k}" for k in keys]
        assert cached.mget(keys) == [f"old {k}" for k in keys]
        assert cached.stats().hits == len(keys) and all(cached.holds(k) for k in keys)
        recorder = InvalidationRecorder()
        cached.add_invalidation_listener(recorder)
        for k in keys:  # each write lands on its own primary, which must tell the cache
            writer.put(k, f"new {k}")
            assert recorder.wait_for_key(k), f"no invalidation of {k!r} from its primary"
            assert not cached.holds(k)
        assert cached.mget(keys) == [f"new {k}" for k in keys]
        assert all(cached.holds(k) for k in keys)
        recorder.clear()
        writer.redis.delete(keys[0])  # a raw write, not through our client, invalidates too
        assert recorder.wait_for_key(keys[0])
        assert cached.get(keys[0], None) is None


def test_a_lost_invalidation_connection_on_a_live_server_drops_the_cache(replicated):
    """Each primary drops the cache's invalidation connection (CLIENT KILL), the servers
    staying up: invalidations sent meanwhile would be lost, so the whole cache is flushed;
    the next reads open fresh ones and are cached and invalidated again on every shard."""
    import redis

    keys = keys_on_every_primary(replicated, "lost", per_node=1)
    with KVS.from_url(replicated.url) as writer, CachedKVS.from_url(replicated.url) as cached:
        writer.mput({k: f"old {k}" for k in keys})
        assert cached.mget(keys) == [f"old {k}" for k in keys] and all(cached.holds(k) for k in keys)
        recorder = InvalidationRecorder()
        cached.add_invalidation_listener(recorder)
        primaries = replicated.primaries() if hasattr(replicated, "primaries") else [replicated.primary()]
        for node in primaries:
            primary = redis.Redis(port=node.port, password=replicated.password, protocol=2)
            assert primary.execute_command("CLIENT", "KILL", "TYPE", "pubsub") >= 1  # the cache's listener
            primary.close()
        # one flush per primary: a read cached before the last would be flushed by it
        assert recorder.wait_for_flush(10, count=len(primaries)), "a lost invalidation connection must flush the cache"
        assert not any(cached.holds(k) for k in keys)
        assert cached.wait_tracking(10)
        assert cached.mget(keys) == [f"old {k}" for k in keys] and all(cached.holds(k) for k in keys)
        recorder.clear()
        for k in keys:
            writer.put(k, f"new {k}")
            assert recorder.wait_for_key(k), f"no invalidation of {k!r} after the reconnect"
        assert cached.mget(keys) == [f"new {k}" for k in keys]


def test_a_cluster_cache_tracks_on_each_primary_it_reads_from(cluster_store):
    keys = keys_on_every_primary(cluster_store, "t", per_node=1)
    with CachedKVS.from_url(cluster_store.url) as cached:
        cached.mget(keys, default=None)
        ports = sorted(port for _, port in cached._tracker.addresses())
        assert ports == sorted(p.port for p in cluster_store.primaries())


def test_signed_plans(replicated):
    with KVS.from_url(replicated.url, signing_key=SIGNING_KEY) as store:
        store.put_trusted("flowserve:plan:A:1", {"plan": "A"})
        assert store.get("flowserve:plan:A:1", trusted=True) == {"plan": "A"}
        store.redis.set("flowserve:plan:B:7", store.get_bytes("flowserve:plan:A:1"))  # copied elsewhere
        with pytest.raises(SerializationError, match="signature does not match this key"):
            store.get("flowserve:plan:B:7", trusted=True)
    with CachedKVS.from_url(replicated.url, signing_key=SIGNING_KEY) as cached:
        assert cached.get("flowserve:plan:A:1", trusted=True) == {"plan": "A"}
        with pytest.raises(SerializationError, match="trusted=True"):
            cached.get("flowserve:plan:A:1")


def test_acknowledged_writes_are_on_a_replica(replicated):
    """put/mput/put_trusted return once a replica holds the write (WAIT 1): read every
    replica of the key's primary directly, at once."""
    import redis

    keys = keys_on_every_primary(replicated, "w", per_node=1)
    with KVS.from_url(replicated.url, signing_key=SIGNING_KEY) as store:
        for k in keys:
            store.put(k, k)
        store.mput({f"{k}:m": 1 for k in keys})
        store.put_trusted("flowserve:plan:W:1", "plan")
        for k in [*keys, *(f"{k}:m" for k in keys), "flowserve:plan:W:1"]:
            replicas = _replicas_of(replicated, k)
            assert replicas
            for port in replicas:
                node = redis.Redis(host="127.0.0.1", port=port, password=replicated.password, protocol=2)
                if isinstance(store.redis, RedisCluster):
                    node.execute_command("READONLY")
                assert node.get(k) is not None, f"{k!r} not on the replica on port {port}"
                node.close()


def _replicas_of(store, key: str) -> list[int]:
    import redis

    port = (
        store.primary_port_for_slot(key_slot(key.encode()))
        if store.__class__.__name__ == "ClusterStore"
        else store.primary_port()
    )
    info = redis.Redis(host="127.0.0.1", port=port, password=store.password, protocol=2).info("replication")
    return [int(v["port"]) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]


@pytest.mark.parametrize("scheme, path", [("redis+sentinel", "/flowserve/0"), ("redis+cluster", "")])
def test_a_store_that_does_not_answer_yet_is_a_retryable_error_not_a_crash(scheme, path):
    """A process may start before its store: making the clients connects nothing, and a
    call raises UnreachableError naming the store (password masked) after retry_timeout."""
    from flow.errors import UnreachableError
    from kvs.server import free_port

    url = f"{scheme}://:s3cret@127.0.0.1:{free_port()}{path}"
    with KVS.from_url(url, retry_timeout=0.2) as store, CachedKVS.from_url(url, retry_timeout=0.2) as cached:
        for call in (lambda: store.put("k", 1), lambda: cached.get("k")):
            with pytest.raises(UnreachableError, match=r"unreachable|did not serve") as e:
                call()
            assert "s3cret" not in str(e.value) and scheme in str(e.value)
