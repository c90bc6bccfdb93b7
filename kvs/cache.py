"""``CachedKVS``: a ``KVS`` with an executor-local LRU of decoded values in front.

A hit costs a dict lookup under a lock (about a microsecond), not a network round
trip. Values never go stale silently: every cache-miss read goes over a connection
with Redis ``CLIENT TRACKING`` on, so the server pushes the key to our invalidation
thread when anyone changes it (see ``kvs.tracking``); nothing polls.

Races handled:

* read vs invalidation: a read registers itself before it is sent; an invalidation
  (or flush) that arrives while it is in flight marks it dead, and a dead read does
  not insert its value. Insertion and invalidation share one lock.
* invalidation connection lost: the whole cache is flushed (messages may have been
  missed) and nothing is inserted until a new listener is subscribed; reads meanwhile
  go to the server uncached.
* own writes: ``put``/``mput``/``delete`` drop the key locally (and kill in-flight
  reads of it), so a thread reads its own writes.
* fork: the child starts with an empty cache and its own listener.

Shared values must not be mutated: arrays come back read-only, JSON lists/dicts are
decoded afresh on each hit; flow Tables (immutable by convention) and trusted
(pickled) objects are shared as they are. Raw writes through ``.redis`` are not
dropped locally at once; the server's invalidation removes them a moment later.

    >>> store = CachedKVS.from_url(server.url, cache_max_bytes=64 << 20)  # doctest: +SKIP
    >>> store.get("emb"); store.get("emb"); store.stats().hits             # doctest: +SKIP
    1
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from flow.errors import FlowValueError
from kvs.client import KVS, MISSING, check_key, decode_value, mget
from kvs.connect import close_client, node_connection_kwargs, open_client, watched_sentinel
from kvs.errors import KeyNotFoundError, SerializationError
from kvs.lru import ByteLRU
from kvs.options import KVSOptions
from kvs.replicas import StoreRedis
from kvs.sentinel_watch import PrimaryWatch
from kvs.serialization import is_mutable_payload, is_trusted_payload
from kvs.tracking import NodeTrackers, Tracker, tracked_connection_class

log = logging.getLogger(__name__)

#: bytes charged per entry on top of the encoded size (key, tuple, dict slot)
ENTRY_OVERHEAD = 128

# how a cached entry turns back into a value
_SHARED = 0  # immutable (bytes, str, numbers, read-only arrays, refs): return as is
_REDECODE = 1  # mutable JSON container: keep the bytes, decode a fresh copy per hit
_TRUSTED = 2  # unpickled trusted object: only for get(..., trusted=True)

InvalidationListener = Callable[["list[str] | None"], None]

#: while the runtime traces requests (executors/tracing.py), a function of a span name giving
#: a span under the thread's traced run, or None outside one; None while tracing is off, so
#: an untraced read costs one test of it
lookup_trace: Callable[[str], Any] | None = None


@dataclass(frozen=True)
class CacheStats:
    """Counters of one ``CachedKVS`` since it was created (or forked)."""

    hits: int
    misses: int
    evictions: int  # entries dropped to fit the byte budget
    invalidations: int  # entries dropped because the server said the key changed
    flushes: int  # whole-cache flushes (connection lost, FLUSHDB, clear())
    entries: int
    nbytes: int
    max_bytes: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class _Read:
    """One in-flight cache-miss read; invalidations mark it dead."""

    __slots__ = ("epoch", "dead", "flushed")

    def __init__(self, epoch: int | None):
        self.epoch = epoch
        self.dead: set[str] = set()
        self.flushed = False


class CachedKVS(KVS):
    """A ``KVS`` with a local, server-invalidated LRU cache (same API, plus
    ``stats``, ``holds``, ``cached_keys``, ``clear`` and invalidation listeners).

    Thread-safe. Cache size: ``options.cache_max_bytes`` (default 256 MiB).
    """

    _epoch: int | None  # tracker epoch; None: not tracking, no inserts (set by _init_state)
    _watch: PrimaryWatch | None = None  # a Sentinel store's (kvs/sentinel_watch.py)

    def __init__(self, url: str, options: KVSOptions | None = None, *, signing_key: bytes | None = None):
        super().__init__(url, options, signing_key=signing_key)
        self._listeners: list[InvalidationListener] = []
        self._init_state()
        self._start_tracking()
        _live.add(self)

    # -- reads -------------------------------------------------------------------------

    def get(self, key: str, default: Any = MISSING, *, trusted: bool = False) -> Any:
        """Like ``KVS.get``; served from the local cache when it holds ``key``."""
        if type(key) is not str:
            key = check_key(key)
        if lookup_trace is not None:  # a traced run's read goes the way that says where it came from
            return self._traced_mget("kvs.get", [key], default, trusted)[0]
        if self._restart_needed:
            self._restart_after_fork()
        with self._lock:
            entry = self._lru.get(key)
            if entry is not None:
                self._hits += 1
            else:
                self._misses += 1
        if entry is not None:
            if self._closed:
                raise FlowValueError(f"CachedKVS for {self.url} is closed")  # as a closed file
            return self._value(key, entry, trusted)
        return self._fetch([key], default, trusted)[0]

    def mget(self, keys: Iterable[str], default: Any = MISSING, *, trusted: bool = False) -> list:
        """Like ``KVS.mget``: hits come from the cache, all misses in one MGET."""
        keys = [check_key(k) for k in keys]
        if lookup_trace is not None:
            return self._traced_mget("kvs.mget", keys, default, trusted)
        return self._mget(keys, default, trusted)[0]

    def _traced_mget(self, name: str, keys: list[str], default: Any, trusted: bool) -> list:
        """``mget`` in a span under the thread's traced run (none outside one): how many
        keys, how many the local cache had, and where the values came from."""
        trace = lookup_trace
        span = trace(name) if trace is not None else None
        if span is None:
            return self._mget(keys, default, trusted)[0]
        with span:
            results, fetched = self._mget(keys, default, trusted)
            source = "store" if fetched == len(keys) else ("both" if fetched else "local")
            span.set_attributes(
                {
                    "flowserve.kvs.keys": len(keys),
                    "flowserve.kvs.local_hits": len(keys) - fetched,
                    "flowserve.kvs.source": source,
                }
            )
            return results

    def _mget(self, keys: list[str], default: Any, trusted: bool) -> tuple[list, int]:
        """The values, and how many of them were read from the store."""
        if self._restart_needed:
            self._restart_after_fork()
        results: list[Any] = [None] * len(keys)
        missing: list[int] = []
        with self._lock:
            for i, key in enumerate(keys):
                entry = self._lru.get(key)
                if entry is None:
                    missing.append(i)
                else:
                    results[i] = entry
            self._hits += len(keys) - len(missing)
            self._misses += len(missing)
        if self._closed:
            raise FlowValueError(f"CachedKVS for {self.url} is closed")  # as a closed file
        hit = set(range(len(keys))) - set(missing)
        for i in hit:
            results[i] = self._value(keys[i], results[i], trusted)
        if missing:
            fetched = self._fetch([keys[i] for i in missing], default, trusted)
            for i, value in zip(missing, fetched):
                results[i] = value
        return results, len(missing)

    def exists(self, key: str) -> bool:
        """True at once if the key is cached; otherwise asks the server."""
        key = check_key(key)
        if self.holds(key):
            return True
        return super().exists(key)

    # -- writes: drop the local copy so this client reads its own writes ---------------

    def _set_encoded(self, key: str, data: bytes, mark: bool = False) -> None:
        try:
            super()._set_encoded(key, data, mark)
        finally:  # even on error: the write may have reached the server
            self._drop_local((key,))

    def mput(self, mapping: Mapping[str, Any]) -> None:
        try:
            super().mput(mapping)
        finally:
            self._drop_local([k for k in mapping if isinstance(k, str)])

    def delete(self, *keys: str) -> int:
        try:
            return super().delete(*keys)
        finally:
            self._drop_local([k for k in keys if isinstance(k, str)])

    # -- cache introspection -----------------------------------------------------------

    def holds(self, key: str) -> bool:
        """Whether the local cache holds ``key`` now (no round trip; for schedulers
        placing work where its data is cached)."""
        with self._lock:
            return key in self._lru

    def evicted_within(self, seconds: float) -> bool:
        """Whether the cache dropped an entry to fit its budget in the last ``seconds``:
        its working set does not fit (for schedulers deciding how strictly to
        partition keys between caches)."""
        with self._lock:
            return time.monotonic() - self._lru.last_eviction < seconds

    def cached_keys(self) -> list[str]:
        """A snapshot of the cached keys, least recently used first."""
        with self._lock:
            return self._lru.keys()

    def stats(self) -> CacheStats:
        """Hit/miss/eviction/invalidation counters and current size."""
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                evictions=self._lru.evictions,
                invalidations=self._invalidations,
                flushes=self._flushes,
                entries=len(self._lru),
                nbytes=self._lru.nbytes,
                max_bytes=self._lru.max_bytes,
            )

    def clear(self) -> None:
        """Drop every cached value (counted as a flush)."""
        with self._lock:
            self._flush_locked()

    @property
    def tracking(self) -> bool:
        """True while invalidations are being received (values get cached)."""
        return self._epoch is not None

    def wait_tracking(self, timeout: float) -> bool:
        """Block until the invalidation connection is up (e.g. after a restart);
        returns False on timeout."""
        return self._tracker.ready.wait(timeout)

    def add_invalidation_listener(self, fn: InvalidationListener) -> None:
        """Call ``fn(keys)`` from the invalidation thread after the server invalidated
        ``keys`` (list of str), or ``fn(None)`` after the whole cache was flushed.
        Keep it quick; exceptions are logged. Executors use it to drop derived state
        (e.g. a re-registered function); tests use it to wait for an invalidation."""
        self._listeners.append(fn)

    def remove_invalidation_listener(self, fn: InvalidationListener) -> None:
        self._listeners.remove(fn)

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Stop the invalidation thread, close all connections, drop the cache."""
        if self._closed:
            return
        self._finalizer.detach()
        _stop_tracking(self._tracker, self._readers, self._watch)
        super().close()
        with self._lock:
            self._lru.clear()
            self._epoch = None

    # -- internals ---------------------------------------------------------------------

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._lru = ByteLRU(self._options.cache_max_bytes)
        self._inflight: dict[str, list[_Read]] = {}
        self._epoch = None
        self._hits = self._misses = self._invalidations = self._flushes = 0
        self._restart_needed = False

    def _start_tracking(self) -> None:
        tracker: Tracker | NodeTrackers
        if self._store_url.kind == "cluster":
            # a tracker per node, each started by the first read connection to its node
            tracker = NodeTrackers(
                self, self._options, redis.Connection, node_connection_kwargs(self._store_url, self._options)
            )
            base: type = redis.Connection
        else:
            pool = self._plain_pool()
            tracker = Tracker.for_pool(pool, self, self._options)
            base = pool.connection_class
        self._tracker = tracker
        self._tracked_class = tracked_connection_class(base, tracker)
        # the client of tracked connections; a Cluster's is made on first use (it asks a node
        # for the cluster's map at once, and this process may start before the store does)
        self._readers: list = []  # the finalizer's view of it
        self._reader: Any = None
        if self._store_url.kind != "cluster":
            self._reader = open_client(self._store_url, self._options, self._tracked_class)
            self._readers.append(self._reader)
        # a Sentinel failover that leaves the old primary up is heard here (kvs/sentinel_watch.py)
        watch = None
        if self._store_url.kind == "sentinel":
            watch = self._watch = PrimaryWatch(self._store_url, self._options, self._on_primary)
            for client in (self._reader, self.redis):
                manager = watched_sentinel(client)
                if manager is not None:
                    manager.hint = watch.current
        # the finalizer holds the tracker, the watch and the reader, not self, so self can be collected
        self._finalizer = weakref.finalize(self, _stop_tracking, tracker, self._readers, watch)
        tracker.start()
        if watch is not None:
            watch.start()
        # usually ~1 ms; if the server is down, reads fail or go uncached until it is up
        tracker.ready.wait(self._options.connect_timeout)

    def _tracked_client(self) -> Any:
        reader = self._reader
        if reader is None:
            with self._client_lock:
                if self._reader is None:
                    self._reader = open_client(self._store_url, self._options, self._tracked_class)
                    self._readers.append(self._reader)
                reader = self._reader
        return reader

    def _on_primary(self, address: tuple) -> None:
        """The sentinels name ``address`` as the primary (at the watch's start, and after a
        failover): track only there, and move every connection that is elsewhere."""
        tracker = self._tracker
        if not isinstance(tracker, Tracker) or not tracker.expect(address):
            return
        for client in (self._reader, self.redis):
            if isinstance(client, StoreRedis):  # a Sentinel store's: one pool each
                client.connection_pool.disconnect()  # in-flight commands fail and are retried, there

    def _restart_after_fork(self) -> None:
        with self._lock:
            if not self._restart_needed:
                return
            self._restart_needed = False
        self._start_tracking()

    def _after_fork_in_child(self) -> None:
        """Runs in a forked child (no other threads exist there): fresh locks and an
        empty cache; the listener restarts lazily on first use."""
        self._tracker.abandon()
        if self._watch is not None:
            self._watch.abandon()  # its word is the parent's: forget it until the child's own watch runs
            for client in (self._reader, self.redis):
                manager = watched_sentinel(client)
                if manager is not None:
                    manager.hint = None
        self._finalizer.detach()
        self._init_state()
        self._restart_needed = not self._closed

    def _value(self, key: str, entry: tuple[int, Any], trusted: bool) -> Any:
        kind, obj = entry
        if kind == _SHARED:
            return obj
        if kind == _REDECODE:
            return decode_value(key, obj, trusted, self._signing_key)
        if not trusted:
            raise SerializationError(f"value of key {key!r} is a trusted pickle; read it with get(..., trusted=True)")
        # its signature was checked against this same key when it was read (_fetch), and an
        # entry is only ever filed under the key it was read from
        return obj

    def _fetch(self, keys: list[str], default: Any, trusted: bool) -> list[Any]:
        """Read ``keys`` from the server (tracked when possible), cache what stayed
        valid, return the values (``default`` or ``KeyNotFoundError`` for missing)."""
        read = _Read(None)
        with self._lock:
            read.epoch = self._epoch
            for key in keys:
                self._inflight.setdefault(key, []).append(read)
        entries: list[tuple[int, Any, int] | None] = []
        values: list[Any] = []
        try:

            def attempt():
                # tracked connections while the listener of this read's epoch is up;
                # otherwise the plain pool (the value will not be cached anyway), so a
                # listener that cannot reconnect never blocks reads from a live server
                tracked = read.epoch is not None and read.epoch == self._epoch
                client = self._tracked_client() if tracked else self.redis
                return [client.get(keys[0])] if len(keys) == 1 else mget(client, keys)

            blobs = self._call(attempt, "GET" if len(keys) == 1 else "MGET")
            for key, blob in zip(keys, blobs):
                if blob is None:
                    values.append(MISSING)
                    entries.append(None)
                    continue
                value = decode_value(key, blob, trusted, self._signing_key)
                values.append(value)
                entries.append(_entry(blob, value))
        finally:
            with self._lock:
                for key in keys:
                    reads = self._inflight.get(key)
                    if reads is not None:
                        reads.remove(read)
                        if not reads:
                            del self._inflight[key]
                insertable = read.epoch is not None and read.epoch == self._epoch and not read.flushed
                if insertable:
                    for key, entry in zip(keys, entries):
                        if entry is not None and key not in read.dead:
                            self._lru.put(key, entry[:2], entry[2])
        for i, value in enumerate(values):
            if value is MISSING:
                if default is MISSING:
                    raise KeyNotFoundError(keys[i])
                values[i] = default
        return values

    def _drop_local(self, keys: Iterable[str]) -> None:
        with self._lock:
            for key in keys:
                self._lru.pop(key)
                for read in self._inflight.get(key, ()):
                    read.dead.add(key)

    def _flush_locked(self) -> None:
        self._lru.clear()
        self._flushes += 1
        for reads in self._inflight.values():
            for read in reads:
                read.flushed = True

    # -- called by the Tracker thread --------------------------------------------------

    def _tracking_ready(self, epoch: int) -> None:
        with self._lock:
            self._epoch = epoch

    def _tracking_lost(self, reason: str) -> None:
        with self._lock:
            self._epoch = None
            self._flush_locked()
        self._notify(None)

    def _tracking_invalidate(self, raw_keys: list[bytes] | None) -> None:
        if raw_keys is None:  # FLUSHDB / FLUSHALL
            with self._lock:
                self._flush_locked()
            self._notify(None)
            return
        keys = [k.decode("utf-8", "surrogateescape") for k in raw_keys]
        with self._lock:
            for key in keys:
                if self._lru.pop(key):
                    self._invalidations += 1
                for read in self._inflight.get(key, ()):
                    read.dead.add(key)
        self._notify(keys)

    def _notify(self, keys: list[str] | None) -> None:
        for fn in list(self._listeners):
            try:
                fn(keys)
            except Exception:  # a listener's bug must not stop the others (or the tracking thread)
                log.exception("KVS invalidation listener %r failed", fn)


def _stop_tracking(tracker: Tracker | NodeTrackers, readers: list, watch: PrimaryWatch | None) -> None:
    if watch is not None:
        watch.stop()
    tracker.stop()
    for reader in readers:
        close_client(reader)


def _entry(blob: bytes, value: Any) -> tuple[int, Any, int]:
    """(kind, object to keep, bytes to charge) for a freshly read value."""
    size = len(blob) + ENTRY_OVERHEAD
    if is_trusted_payload(blob):
        return (_TRUSTED, value, size)
    if is_mutable_payload(blob):
        return (_REDECODE, blob, size)
    return (_SHARED, value, size)


# -- fork safety: reset every live CachedKVS in the child ------------------------------

_live: weakref.WeakSet[CachedKVS] = weakref.WeakSet()


def _reset_all_after_fork() -> None:
    for store in list(_live):
        store._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_all_after_fork)
