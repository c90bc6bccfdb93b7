"""Marker keys that tell a store that lost its data from one that never had it.

Redis restarted without persistence (or an evicted/flushed store) answers "no such key"
for everything, exactly like a fresh store. Two marker keys make the difference visible:

* ``STORE_MARKER`` -- written when a cluster (daemon or standalone gateway) starts and
  whenever a gateway re-publishes its flows. Missing means the runtime's own state
  (plans, registry, version counters) was lost: gateways re-publish what they serve.
* ``DATA_MARKER`` -- written when a cluster starts and by every user data write through
  ``KVS.put``/``mput``. Missing means the user's data was lost: a lookup of a missing key
  is then a retryable ``StoreLostError`` (HTTP 503), not a missing key (422). It is *not*
  restored by a re-publish: only writing data again says the data is back.

On a Redis Cluster each marker lives on the shard its slot falls in, so it speaks for that
shard: ``STORE_MARKER``'s hash tag is the registry's whole name (``flowserve:deployed``),
which puts it in the registry's slot (a gateway reads both in one MULTI:
``executors/gateway/durability.py``) without renaming the registry, which persisted stores
hold. A shard that lost its data along with its replicas is not noticed by a marker on
another shard; with a replica per shard, a failover loses nothing a marker would flag.
"""

from __future__ import annotations

STORE_MARKER = "flowserve:marker:store:{flowserve:deployed}"  # in the registry's Cluster slot
DATA_MARKER = "flowserve:marker:data"


def mark_started(redis) -> None:
    """A cluster starts: both markers, unless present (``SET NX``: a restart of a gateway
    against a store that is intact changes nothing)."""
    pipe = redis.pipeline(transaction=False)
    pipe.set(STORE_MARKER, "1", nx=True)
    pipe.set(DATA_MARKER, "1", nx=True)
    pipe.execute()
