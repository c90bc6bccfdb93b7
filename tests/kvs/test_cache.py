"""``CachedKVS``: hits, server-pushed invalidation, races, eviction, restarts, fork."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from flow import Flow
from flow.errors import FlowValueError, UnreachableError
from kvs import KVS, CachedKVS, KeyNotFoundError, RedisServer, SerializationError
from kvs.cache import ENTRY_OVERHEAD
from kvs.serialization import encode
from tests.kvs.helpers import InvalidationRecorder, run_in_fork, wait_until


@pytest.fixture
def other(kvs, redis_url):
    """A second, independent client (its own connections, named so CLIENT LIST can
    tell it apart)."""
    with KVS.from_url(redis_url, client_name="other-client") as store:
        yield store


@pytest.fixture
def recorder(cached_kvs):
    rec = InvalidationRecorder()
    cached_kvs.add_invalidation_listener(rec)
    return rec


# -- hits ------------------------------------------------------------------------------


def test_second_read_is_a_hit(cached_kvs, other):
    other.put("k", np.arange(10.0))
    first = cached_kvs.get("k")
    second = cached_kvs.get("k")
    assert second is first  # the same decoded object, no decode and no round trip
    stats = cached_kvs.stats()
    assert (stats.hits, stats.misses, stats.entries) == (1, 1, 1)
    assert stats.nbytes == len(encode(np.arange(10.0))) + ENTRY_OVERHEAD
    assert cached_kvs.holds("k") and cached_kvs.cached_keys() == ["k"]


def test_hit_needs_no_server(tmp_path):
    """A hit does not touch the network: it still answers while the server is frozen."""
    with RedisServer(dir=tmp_path) as server:
        store = CachedKVS.from_url(server.url, health_check_interval=30, retry_timeout=0.2, socket_timeout=0.2)
        store.put("k", np.ones(1000))
        store.get("k")
        os.kill(server.pid, signal.SIGSTOP)
        try:
            start = time.perf_counter()
            value = store.get("k")
            assert time.perf_counter() - start < 0.05
            np.testing.assert_array_equal(value, np.ones(1000))
            with pytest.raises(UnreachableError):  # a miss does need it
                store.get("other")
        finally:
            os.kill(server.pid, signal.SIGCONT)
        store.close()


def test_mget_mixes_hits_and_one_round_trip_for_misses(cached_kvs, other):
    other.mput({"a": 1, "b": 2, "c": 3})
    cached_kvs.get("a")
    missing = object()
    assert cached_kvs.mget(["a", "b", "c", "zz"], missing) == [1, 2, 3, missing]
    stats = cached_kvs.stats()
    assert (stats.hits, stats.misses) == (1, 4)
    assert set(cached_kvs.cached_keys()) == {"a", "b", "c"}  # a missing key is not cached
    with pytest.raises(KeyNotFoundError, match="'zz'"):
        cached_kvs.mget(["a", "zz"])


def test_missing_key(cached_kvs):
    with pytest.raises(KeyNotFoundError, match="'nope'"):
        cached_kvs.get("nope")
    assert cached_kvs.get("nope", 5) == 5
    assert not cached_kvs.holds("nope")


def test_exists_answers_from_the_cache(cached_kvs, other):
    other.put("k", 1)
    assert not cached_kvs.holds("k") and cached_kvs.exists("k")
    cached_kvs.get("k")
    assert cached_kvs.exists("k")
    assert not cached_kvs.exists("absent")


# -- shared values are safe ------------------------------------------------------------


def test_cached_arrays_are_read_only(cached_kvs):
    cached_kvs.put("a", np.zeros(4))
    arr = cached_kvs.get("a")
    with pytest.raises(ValueError):
        arr[0] = 1
    np.testing.assert_array_equal(cached_kvs.get("a"), np.zeros(4))


def test_a_lookup_of_one_row_shares_the_cached_array(cached_kvs, other):
    """A hit is not copied by get, mget, the lookup operator or its 1-row column."""
    other.put("emb", np.arange(2048, dtype=np.float32))  # 8 KB
    cached = cached_kvs.get("emb")  # a miss: now cached
    assert cached_kvs.get("emb") is cached and cached_kvs.mget(["emb"])[0] is cached
    flow = Flow("lookup")
    flow.lookup(column="key", name="v")
    out = flow.run([{"key": "emb"}], kvs=cached_kvs)
    assert np.shares_memory(out["v"], cached) and not out["v"].flags.writeable
    assert cached_kvs.stats().hits == 3
    out = flow.run([{"key": "emb"}, {"key": "emb"}], kvs=cached_kvs)  # two rows: one new array
    assert out["v"].tolist() == [cached.tolist()] * 2 and not np.shares_memory(out["v"], cached)


def test_cached_json_containers_are_fresh_copies(cached_kvs):
    cached_kvs.put("cfg", {"layers": [1, 2]})
    first = cached_kvs.get("cfg")
    first["layers"].append(3)
    assert cached_kvs.get("cfg") == {"layers": [1, 2]}
    assert cached_kvs.stats().hits == 1


def test_trusted_values_are_cached_but_still_need_trust(cached_kvs):
    cached_kvs.put_trusted("fn", lambda x: x + 1)
    with pytest.raises(SerializationError):
        cached_kvs.get("fn")
    fn = cached_kvs.get("fn", trusted=True)
    assert fn(1) == 2 and cached_kvs.holds("fn")
    assert cached_kvs.get("fn", trusted=True) is fn
    with pytest.raises(SerializationError, match="trusted"):  # a hit must check it too
        cached_kvs.get("fn")


# -- invalidation by other clients -----------------------------------------------------


def test_write_by_another_client_invalidates(cached_kvs, other, recorder):
    other.put("k", "v1")
    assert cached_kvs.get("k") == "v1"
    other.put("k", "v2")
    assert recorder.wait_for_key("k"), "no invalidation arrived"
    assert not cached_kvs.holds("k")
    assert cached_kvs.get("k") == "v2"
    assert cached_kvs.stats().invalidations == 1


def test_delete_by_another_client_invalidates(cached_kvs, other, recorder):
    other.put("k", np.arange(3))
    cached_kvs.get("k")
    other.delete("k")
    assert recorder.wait_for_key("k")
    with pytest.raises(KeyNotFoundError):
        cached_kvs.get("k")


def test_raw_write_invalidates_too(cached_kvs, other, recorder):
    other.put("k", 1)
    cached_kvs.get("k")
    other.redis.set("k", encode(2))  # a raw write, bypassing the codec
    assert recorder.wait_for_key("k")
    assert cached_kvs.get("k") == 2


def test_expiry_invalidates(cached_kvs, other, recorder):
    other.put("k", 1)
    other.redis.pexpire("k", 500)
    assert cached_kvs.get("k") == 1 and cached_kvs.holds("k")
    assert recorder.wait_for_key("k")  # sent by the server when the key expires
    assert cached_kvs.get("k", None) is None


def test_flushdb_flushes_the_cache(cached_kvs, other, recorder):
    other.mput({"a": 1, "b": 2})
    cached_kvs.mget(["a", "b"])
    other.redis.flushdb()
    assert recorder.wait_for_flush()
    assert cached_kvs.cached_keys() == []
    assert cached_kvs.stats().flushes == 1


def test_another_cached_client_sees_writes(redis_url, cached_kvs):
    with CachedKVS.from_url(redis_url) as peer:
        recorder = InvalidationRecorder()
        peer.add_invalidation_listener(recorder)
        cached_kvs.put("k", 1)
        assert peer.get("k") == 1
        cached_kvs.put("k", 2)
        assert recorder.wait_for_key("k")
        assert peer.get("k") == 2


def test_every_read_connection_is_tracked(cached_kvs, other):
    """Misses from many threads use several pooled connections: all must be tracked
    and redirect to the live listener."""
    other.mput({f"k{i}": i for i in range(40)})
    barrier = threading.Barrier(8)

    def reader(offset):
        barrier.wait()
        for i in range(offset, 40, 8):
            cached_kvs.get(f"k{i}")

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    clients = other.redis.client_list()
    listeners = [c for c in clients if c["name"] == "flowserve" and c["sub"] == "1"]
    readers = [c for c in clients if c["name"] == "flowserve" and c["cmd"] in ("get", "mget")]
    assert len(listeners) == 1 and readers
    assert all("t" in c["flags"] and c["redir"] == listeners[0]["id"] for c in readers)


# -- own writes ------------------------------------------------------------------------


def test_own_writes_are_read_back(cached_kvs):
    cached_kvs.put("k", 1)
    assert cached_kvs.get("k") == 1
    cached_kvs.put("k", 2)  # no waiting: dropped locally
    assert cached_kvs.get("k") == 2
    cached_kvs.mput({"k": 3, "j": 4})
    assert cached_kvs.mget(["k", "j"]) == [3, 4]
    assert cached_kvs.delete("k") == 1
    assert cached_kvs.get("k", None) is None


# -- the read/invalidate race ----------------------------------------------------------


class _WriteDuringRead:
    """Wraps the cache's tracked reader: after the server answered a GET with the old
    value, another client overwrites the key and the invalidation is applied, all
    before the reader gets to insert its (now stale) value."""

    def __init__(self, real, other, recorder):
        self.real, self.other, self.recorder = real, other, recorder

    def get(self, key):
        stale = self.real.get(key)
        self.other.put(key, "new")
        assert self.recorder.wait_for_key(key)
        return stale

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_invalidation_during_a_read_is_not_lost(cached_kvs, other, recorder):
    other.put("k", "old")
    cached_kvs.get("k")  # tracked, so the overwrite below sends an invalidation
    other.put("k", "old")
    assert recorder.wait_for_key("k")
    recorder.clear()
    cached_kvs._reader = _WriteDuringRead(cached_kvs._reader, other, recorder)
    assert cached_kvs.get("k") == "old"  # the read itself began before the write
    cached_kvs._reader = cached_kvs._reader.real
    assert not cached_kvs.holds("k"), "a value invalidated during its read was cached"
    assert cached_kvs.get("k") == "new"


def test_concurrent_readers_and_a_writer_converge(cached_kvs, other):
    """Readers hammer the cache while another client writes: once the writes stop,
    every key must converge to its last value (a lost invalidation would leave a stale
    entry forever and time out here)."""
    keys = [f"c{i}" for i in range(4)]
    other.mput({k: -1 for k in keys})
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader():
        try:
            while not stop.is_set():
                cached_kvs.mget(keys)
                for k in keys:
                    cached_kvs.get(k)
        except BaseException as exc:  # surface in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for n in range(300):
            other.put(keys[n % len(keys)], n)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    final = other.mget(keys)
    assert wait_until(lambda: cached_kvs.mget(keys) == final, timeout=5.0), (
        f"cache stuck at {cached_kvs.mget(keys)}, server has {final}"
    )


# -- eviction --------------------------------------------------------------------------


def test_eviction_by_byte_budget_in_lru_order(redis_url, kvs):
    entry = len(encode(np.zeros(125))) + ENTRY_OVERHEAD
    with CachedKVS.from_url(redis_url, cache_max_bytes=3 * entry + 10) as store:
        store.mput({k: np.zeros(125) for k in "abcd"})
        store.mget(["a", "b", "c"])
        store.get("a")  # a is now the most recently used; b the least
        assert not store.evicted_within(3600)
        store.get("d")  # needs room: evicts b
        assert store.cached_keys() == ["c", "a", "d"]
        assert store.evicted_within(3600) and not store.evicted_within(0)
        stats = store.stats()
        assert stats.evictions == 1 and stats.nbytes == 3 * entry <= stats.max_bytes
        store.get("b")  # evicts c
        assert store.cached_keys() == ["a", "d", "b"]


def test_value_larger_than_the_budget_is_served_but_not_cached(redis_url, kvs):
    with CachedKVS.from_url(redis_url, cache_max_bytes=1000) as store:
        store.put("big", np.zeros(1000))
        np.testing.assert_array_equal(store.get("big"), np.zeros(1000))
        assert not store.holds("big") and store.stats().nbytes == 0


def test_zero_budget_disables_caching(redis_url, kvs):
    with CachedKVS.from_url(redis_url, cache_max_bytes=0) as store:
        store.put("k", 1)
        assert store.get("k") == 1 and store.get("k") == 1
        assert store.stats().hits == 0


# -- connection loss and restarts ------------------------------------------------------


def test_lost_invalidation_connection_flushes_and_retracks(cached_kvs, other, recorder):
    """Killing only the listener connection: the cache must flush (messages may be
    lost), and reads through pooled connections must be re-registered with the new
    listener, or later writes would never invalidate them."""
    other.put("k", 1)
    cached_kvs.get("k")
    listener = next(c for c in other.redis.client_list() if c["name"] == "flowserve" and c["sub"] == "1")
    other.redis.client_kill_filter(_id=listener["id"])
    assert recorder.wait_for_flush()
    assert not cached_kvs.holds("k")
    assert cached_kvs.wait_tracking(5.0)
    assert cached_kvs.get("k") == 1  # same pooled reader connection, re-registered
    assert cached_kvs.holds("k")
    recorder.clear()
    other.put("k", 2)
    assert recorder.wait_for_key("k"), "reader was not re-registered with the new listener"
    assert cached_kvs.get("k") == 2


def test_server_restart_flushes_and_recovers(tmp_path):
    with RedisServer(dir=tmp_path) as server:
        store = CachedKVS.from_url(server.url, retry_timeout=5.0)
        other = KVS.from_url(server.url)
        recorder = InvalidationRecorder()
        store.add_invalidation_listener(recorder)
        store.put("k", "before")
        assert store.get("k") == "before" and store.holds("k")
        server.restart()  # no persistence: the data is gone
        assert recorder.wait_for_flush()
        assert not store.holds("k")
        assert store.get("k", None) is None  # never the stale cached value
        store.put("k", "after")
        assert store.wait_tracking(5.0)
        assert store.get("k") == "after" and store.get("k") == "after"
        assert store.holds("k")
        recorder.clear()
        other.put("k", "changed")  # invalidation works on the new server too
        assert recorder.wait_for_key("k")
        assert store.get("k") == "changed"
        assert store.stats().flushes >= 1
        store.close()
        other.close()


def test_reads_through_repeated_server_kills_are_answered_not_failed(tmp_path):
    """A read that reconnects to a restarted server before the cache's listener has noticed
    the restart names a listener the new server does not know: that read must wait for
    the listener (retried), not fail (a 500 InternalError: "The client ID you want
    redirect to does not exist")."""
    # 64 MiB: each restart reads them back for a moment, answering LOADING, and a listener
    # that subscribes then loses its connection to the first PING (LOADING) and comes back
    # with a new id: reads registered with the first one in between meet the refusal
    values = {f"k{i}": np.random.default_rng(i).standard_normal(2**18, dtype=np.float32) for i in range(64)}
    with RedisServer(dir=tmp_path, appendonly=True) as server:
        with KVS.from_url(server.url) as writer:
            writer.mput(values)
        stop = threading.Event()
        failures: list[str] = []
        reads = [0]

        def reader(first: int) -> None:
            # no value fits the cache: every read goes to the server, over connections that
            # register with the cache's listener anew after each restart
            with CachedKVS.from_url(server.url, retry_timeout=20.0, cache_max_bytes=2**20) as store:
                i = first
                while not stop.is_set():
                    key = f"k{i % 64}"
                    try:
                        got = store.get(key)
                    except Exception as e:  # any failure is the test's
                        failures.append(f"{type(e).__name__}: {e}")
                    else:
                        if not np.array_equal(got, values[key]):
                            failures.append(f"{key}: wrong value")
                        reads[0] += 1
                    i += 7

        threads = [threading.Thread(target=reader, args=(j,)) for j in range(3)]
        for t in threads:
            t.start()
        for _ in range(10):
            stop.wait(0.2)  # the faults' schedule: reads go on between kills, whatever state they are in
            server.kill()
            server.restart()
        assert wait_until(lambda: reads[0] > 100, timeout=30), "no read was answered"
        stop.set()
        for t in threads:
            t.join(60)
    assert not failures, failures[:5]


def test_server_down_gives_a_clear_error_not_a_stale_value(tmp_path):
    with RedisServer(dir=tmp_path) as server:
        store = CachedKVS.from_url(server.url, retry_timeout=0.5, connect_timeout=0.5)
        recorder = InvalidationRecorder()
        store.add_invalidation_listener(recorder)
        store.put("k", 1)
        store.get("k")
        server.kill()
        assert recorder.wait_for_flush()
        start = time.monotonic()
        with pytest.raises(UnreachableError, match=str(server.port)):
            store.get("k")
        assert time.monotonic() - start < 3.0
        store.close()


def test_close_stops_the_listener_thread(redis_url, kvs):
    store = CachedKVS.from_url(redis_url)
    thread = store._tracker._thread
    assert thread.is_alive()
    store.close()
    assert not thread.is_alive()
    with pytest.raises(FlowValueError, match="closed"):
        store.get("k")
    store.close()  # idempotent


# -- fork ------------------------------------------------------------------------------


def test_fork_child_gets_its_own_cache_and_listener(cached_kvs, other, recorder):
    other.put("k", "parent-view")
    cached_kvs.get("k")

    def child():
        before = cached_kvs.cached_keys()  # the child must not trust inherited entries
        value = cached_kvs.get("k")
        cached_kvs.get("k")
        hits = cached_kvs.stats().hits
        other.put("k", "changed-in-child")
        invalidated = wait_until(lambda: not cached_kvs.holds("k"), timeout=5.0)
        return before, value, hits, invalidated, cached_kvs.get("k")

    before, value, hits, invalidated, after = run_in_fork(child)
    assert before == [] and value == "parent-view" and hits == 1
    assert invalidated and after == "changed-in-child"
    # the parent's listener survived the child (its socket was not shut down)
    assert recorder.wait_for_key("k")
    assert cached_kvs.get("k") == "changed-in-child"
