"""A primary lost or replaced under a ``KVS`` and a ``CachedKVS``: acknowledged writes
survive, reads answer again after the failover, the cache never serves a value the new
primary has changed, and a write no replica confirmed is refused, not acknowledged."""

from __future__ import annotations

import os
import signal

import pytest
import redis

from kvs import KVS, CachedKVS, StoreWriteError
from kvs.replicated import ClusterStore, SentinelStore
from tests.kvs.helpers import InvalidationRecorder
from tests.kvs.test_replicated_store import _replicas_of, keys_on_every_primary


def _node(store, port: int):
    return next(n for n in store.nodes if n.port == port)


def _primary_of(store, key: str):
    return store.primary_for(key) if isinstance(store, ClusterStore) else store.primary()


def _wait_new_primary(store, key: str, old_port: int):
    if isinstance(store, ClusterStore):
        return store.wait_new_primary(key, old_port)
    return store.wait_new_primary(old_port)


def _rejoin(store, node) -> None:
    """``node`` back as a replica of its shard's new primary, in sync."""
    if isinstance(store, ClusterStore):
        node.start()  # its nodes.conf makes it a replica of the node that replaced it
        store.wait_in_sync()
    else:
        store.rejoin(node)
        store.wait_replicas_attached(1)


@pytest.mark.parametrize("kind", ["sentinel", "cluster"])
def test_a_write_no_replica_confirms_is_refused(kind, request):
    """The replica stops answering: put/mput must not be acknowledged (NOREPLICAS, a
    StoreWriteError), since a failover now would lose them; they are again once it answers."""
    store = request.getfixturevalue(f"{kind}_store")
    key = "stopped-replica"
    (port,) = _replicas_of(store, key)
    replica = _node(store, port)
    with KVS.from_url(store.url + "?wait_timeout=0.3") as kvs:
        kvs.put(key, 1)
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreWriteError, match="NOREPLICAS 0 of 1 replica"):
                kvs.put(key, 2)
            with pytest.raises(StoreWriteError, match="NOREPLICAS"):
                kvs.mput({key: 3})
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        kvs.put(key, 4)
        assert kvs.get(key) == 4


@pytest.mark.parametrize("kind", ["sentinel", "cluster"])
def test_no_replica_wait_when_the_url_says_so(kind, request):
    store = request.getfixturevalue(f"{kind}_store")
    key = "unwaited"
    (port,) = _replicas_of(store, key)
    replica = _node(store, port)
    with KVS.from_url(store.url + "?wait_replicas=0") as kvs:
        os.kill(replica.pid, signal.SIGSTOP)
        try:
            kvs.put(key, 1)  # acknowledged by the primary alone
        finally:
            os.kill(replica.pid, signal.SIGCONT)
        assert kvs.get(key) == 1


@pytest.mark.parametrize("make", [SentinelStore, ClusterStore], ids=["sentinel", "cluster"])
def test_kill_the_primary(make, tmp_path):
    """kill -9 of the primary holding a key: acknowledged writes are on the promoted
    replica, reads of it answer again, the cache was flushed and caches again on the new
    primary, with its invalidations; writes that wait for a replica are refused until the
    old node is back as a replica, then go on; on a Cluster the other shards never stop."""
    with make(dir=tmp_path) as store, KVS.from_url(store.url) as writer, CachedKVS.from_url(store.url) as cached:
        keys = keys_on_every_primary(store, "d", per_node=1)
        key = keys[0]
        others = [k for k in keys if _primary_of(store, k).port != _primary_of(store, key).port]
        durable = [f"{{{key}}}:{i}" for i in range(50)]  # on the key's primary (its hash tag)
        for i, k in enumerate(durable):  # acknowledged, so on the replica: none may be lost
            writer.put(k, i)
        writer.mput({k: f"v {k}" for k in keys})
        assert cached.mget(keys) == [f"v {k}" for k in keys] and cached.holds(key)
        recorder = InvalidationRecorder()
        cached.add_invalidation_listener(recorder)
        old = _primary_of(store, key)
        old.kill()
        for k in others:  # other shards answer throughout (a Cluster)
            assert writer.get(k) == f"v {k}"
        assert recorder.wait_for_flush(10), "the lost tracking connection must flush the cache"
        assert not cached.holds(key)
        assert cached.get(key) == f"v {key}"  # retried until the failover, then from the new primary
        assert writer.mget(durable) == list(range(50))
        new = _wait_new_primary(store, key, old.port)
        assert new.port != old.port
        assert cached.wait_tracking(10)
        assert cached.get(key) == f"v {key}" and cached.holds(key)  # cached again
        recorder.clear()
        with KVS.from_url(store.url + "?wait_replicas=0") as raw:  # the new primary has no replica yet
            raw.put(key, "changed")
        assert recorder.wait_for_key(key), "the new primary must track the cache's reads"
        assert cached.get(key) == "changed"
        for k in others:
            writer.put(k, "still writable")  # shards with their replica take waited writes
        with pytest.raises(StoreWriteError, match="NOREPLICAS"):
            writer.put(key, "no replica to confirm it")
        _rejoin(store, old)
        writer.put(key, "confirmed")
        assert cached.get(key) == "confirmed"


@pytest.mark.parametrize("make", [SentinelStore, ClusterStore], ids=["sentinel", "cluster"])
def test_a_manual_failover_never_leaves_a_stale_value_cached(make, tmp_path):
    """The old primary stays up as a replica (SENTINEL FAILOVER, CLUSTER FAILOVER): a value
    the cache read from it and the new primary changes must not be served from the cache."""
    with make(dir=tmp_path) as store, KVS.from_url(store.url) as writer, CachedKVS.from_url(store.url) as cached:
        key = "manual"
        writer.put(key, "before")
        assert cached.get(key) == "before" and cached.holds(key)
        old = _primary_of(store, key)
        if isinstance(store, SentinelStore):
            sentinel = redis.Redis(port=store.sentinels[0].port, protocol=2)
            sentinel.execute_command("SENTINEL", "FAILOVER", store.service)
        else:
            (port,) = _replicas_of(store, key)
            replica = redis.Redis(port=port, password=store.password, protocol=2)
            replica.execute_command("CLUSTER", "FAILOVER")
        _wait_new_primary(store, key, old.port)
        with KVS.from_url(store.url + "?wait_replicas=0") as raw:  # before the old primary follows it
            raw.put(key, "after")
        # either the old primary (now a replica applying the write) invalidates the key, or
        # the lost tracking connection flushed the cache: never the old value
        recorder = InvalidationRecorder()
        cached.add_invalidation_listener(recorder)
        if cached.holds(key):
            assert recorder.wait_for_key(key)
        assert cached.get(key) == "after"


def test_a_resharding_never_leaves_a_stale_value_cached(cluster_store):
    """A slot moved to another primary (MIGRATE, as redis-cli --cluster reshard does): the
    source deletes the key, which invalidates it in the cache; the next read follows MOVED
    to the new primary and is tracked there."""
    from redis.crc import key_slot

    store, key = cluster_store, "resharded"
    with KVS.from_url(store.url) as writer, CachedKVS.from_url(store.url) as cached:
        writer.put(key, "before")
        assert cached.get(key) == "before" and cached.holds(key)
        recorder = InvalidationRecorder()
        cached.add_invalidation_listener(recorder)
        slot = key_slot(key.encode())
        src = _primary_of(store, key)
        dst = next(p for p in store.primaries() if p.port != src.port)
        a, b = (redis.Redis(port=n.port, password=store.password, protocol=2) for n in (src, dst))
        a_id, b_id = (n.execute_command("CLUSTER", "MYID").decode() for n in (a, b))
        b.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", a_id)
        a.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", b_id)
        keys = a.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        a.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "AUTH", store.password, "KEYS", *keys)
        for node in (b, a):
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", b_id)
        assert recorder.wait_for_key(key), "moving the key away must invalidate it"
        assert not cached.holds(key)
        assert cached.get(key) == "before" and cached.holds(key)  # now read from, and tracked on, dst
        recorder.clear()
        writer.put(key, "after")
        assert recorder.wait_for_key(key)
        assert cached.get(key) == "after"
