"""The prediction cache of a ``map(..., cache=...)``: one per replica (per built stage), so a
redeploy (a new flow version, new replicas) starts it empty.

A row's key is a hash of the values the map reads (``flow.prediction.row_keys``); a hit
returns the output row that an earlier call produced (with this query's qid), a miss is
computed with the other misses of the call in one call of the operator (a batching map
still gets one Table, never an empty one). CLOCK (Clipper's choice: one reference bit
per entry, a hand that clears bits until it finds a clear one to evict) or LRU, bounded
by a number of entries.

    cached = CachedOperator(bound_map, CacheSpec(size=10_000))
    out = cached([table], store)

Shared (``CacheSpec(shared=True)``, deployed): the executor names a KVS prefix per flow
version and operator (``flow.prediction.cache_prefix``, set by ``executors.worker.hedging.equip``).
Local misses are then looked up in the KVS in one MGET through the executor's cached
KVS; what is found there is a hit (counted apart, ``shared_hits``) and kept locally; what
is computed is written there (one row as a Table: Arrow, never pickle) with the spec's
TTL. The store failing degrades to a local cache, never to a failed request. Without a
prefix (``flow.run``, the in-process interpreter) a shared spec is a local cache.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

import numpy as np

from executors import tracing
from flow.operators import BoundOperator
from flow.prediction import CacheSpec, row_keys
from flow.table import Table
from kvs.serialization import encode

log = logging.getLogger("flowserve.executor")


class LRU:
    def __init__(self, size: int):
        self.size = size
        self.data: OrderedDict = OrderedDict()

    def get(self, key):
        v = self.data.get(key)
        if v is not None:
            self.data.move_to_end(key)
        return v

    def put(self, key, value) -> None:
        self.data[key] = value
        self.data.move_to_end(key)
        while len(self.data) > self.size:
            self.data.popitem(last=False)

    def __len__(self) -> int:
        return len(self.data)


class Clock:
    """CLOCK: a ring of slots with a reference bit each; a hit sets the bit, an insert into
    a full ring advances the hand, clearing set bits, and evicts the first clear slot."""

    def __init__(self, size: int):
        self.size = size
        self.keys: list = []
        self.values: list = []
        self.ref: list[bool] = []
        self.index: dict = {}
        self.hand = 0

    def get(self, key):
        i = self.index.get(key)
        if i is None:
            return None
        self.ref[i] = True
        return self.values[i]

    def put(self, key, value) -> None:
        i = self.index.get(key)
        if i is not None:
            self.values[i] = value
            self.ref[i] = True
            return
        if len(self.keys) < self.size:
            self.index[key] = len(self.keys)
            self.keys.append(key)
            self.values.append(value)
            self.ref.append(False)
            return
        while self.ref[self.hand]:
            self.ref[self.hand] = False
            self.hand = (self.hand + 1) % self.size
        i = self.hand
        del self.index[self.keys[i]]
        self.keys[i], self.values[i], self.ref[i] = key, value, False
        self.index[key] = i
        self.hand = (i + 1) % self.size

    def __len__(self) -> int:
        return len(self.keys)


class CachedOperator(BoundOperator):
    """A bound map behind a prediction cache; counts hits and misses (reported to the
    gateway's /metrics with the stage's trace entry, ``take_counts``)."""

    def __init__(self, inner: BoundOperator, spec: CacheSpec):
        super().__init__(inner.op, inner.name)
        self.inner = inner
        self.spec = spec
        self.entries = Clock(spec.size) if spec.policy == "clock" else LRU(spec.size)
        self.lock = threading.Lock()
        self.hits = self.misses = self.shared_hits = 0
        self._reported = (0, 0, 0)
        self.prefix: str | None = None  # set by share(): entries also live in the KVS
        self._warned = False

    def share(self, prefix: str) -> None:
        """Keep entries in the KVS under ``prefix`` too (a ``CacheSpec(shared=True)``)."""
        self.prefix = prefix

    def __call__(self, inputs, store=None):
        span = tracing.child(f"prediction_cache {self.name}") if tracing.tracer is not None else None
        if span is None:
            return self._call(inputs, store)[0]
        with span:  # a traced run's lookup: how many rows hit, where, and how many were computed
            out, hits, shared, misses = self._call(inputs, store)
            span.set_attributes(
                {
                    "flowserve.cache.hits": hits,
                    "flowserve.cache.shared_hits": shared,
                    "flowserve.cache.misses": misses,
                    "flowserve.cache.result": "miss" if not hits + shared else ("hit" if not misses else "partial"),
                }
            )
            return out

    def _call(self, inputs, store) -> tuple[Table, int, int, int]:
        """The output, and the rows found locally, found in the KVS, and computed."""
        (table,) = inputs
        n = len(table)
        if n == 0:
            return self.inner(inputs, store), 0, 0, 0
        keys = row_keys(table, self.op.col)
        with self.lock:
            found = [self.entries.get(k) for k in keys]
        miss = [i for i, v in enumerate(found) if v is None]
        shared = 0
        if miss and self.prefix is not None and store is not None:
            shared = self._read_shared(store, keys, found, miss)
            if shared:
                miss = [i for i in miss if found[i] is None]
        if miss:
            first: dict = {}  # a key missed twice in one call is computed once
            for i in miss:
                first.setdefault(keys[i], i)
            todo = list(first.values())
            sub = table if len(todo) == n else table.take(np.asarray(todo, dtype=np.int64))
            computed = self.inner([sub], store)
            fresh = {keys[i]: computed.take(np.asarray([j])) for j, i in enumerate(todo)}
            with self.lock:
                for key, row in fresh.items():
                    self.entries.put(key, row)
            if self.prefix is not None and store is not None:
                self._write_shared(store, fresh)
            for i in miss:
                found[i] = fresh[keys[i]]
            miss = todo
            if len(todo) == n:
                with self.lock:
                    self.misses += n
                return computed, 0, 0, n
        hits = n - len(miss) - shared
        with self.lock:
            self.hits += hits
            self.shared_hits += shared
            self.misses += len(miss)
        out = Table.concat(found)
        return Table({c: out.column(c) for c in out.columns}, table.qid), hits, shared, len(miss)

    def _read_shared(self, store, keys: list[bytes], found: list, miss: list[int]) -> int:
        """Fill ``found`` at ``miss`` from the KVS; returns how many distinct keys it found."""
        wanted = list(dict.fromkeys(keys[i] for i in miss))
        try:
            values = store.mget([self.prefix + k.hex() for k in wanted], default=None)
        except Exception as e:  # the store is down or slow: compute, as a local cache would
            self._warn("read", e)
            return 0
        got = {k: v for k, v in zip(wanted, values) if isinstance(v, Table) and len(v) == 1}
        if not got:
            return 0
        with self.lock:
            for k, v in got.items():
                self.entries.put(k, v)
        for i in miss:
            v = got.get(keys[i])
            if v is not None:
                found[i] = v
        return len(got)  # a key repeated within the call counts as one shared hit and local hits

    def _write_shared(self, store, fresh: dict) -> None:
        redis = getattr(store, "redis", None)
        if redis is None:
            return
        try:
            pipe = redis.pipeline(transaction=False)
            ttl_ms = int(self.spec.ttl_s * 1000)
            for key, row in fresh.items():
                pipe.set(self.prefix + key.hex(), encode(row), px=ttl_ms)
            pipe.execute()
        except Exception as e:  # unencodable output or the store down: the local cache still has it
            self._warn("write", e)

    def _warn(self, what: str, e: Exception) -> None:
        if not self._warned:
            self._warned = True
            log.warning("prediction cache of %r: shared %s failed, using the local cache: %s", self.name, what, e)

    def take_counts(self) -> tuple[int, int, int]:
        """(local hits, misses, shared hits) since the last call: what this stage's next trace entry reports."""
        with self.lock:
            now = (self.hits, self.misses, self.shared_hits)
            before = self._reported
            self._reported = now
        return tuple(a - b for a, b in zip(now, before))


def wrap(bound: BoundOperator) -> BoundOperator:
    """``bound`` behind a prediction cache if its operator asks for one, else as it is."""
    spec = getattr(bound.op, "cache", None)
    return bound if spec is None else CachedOperator(bound, spec)
