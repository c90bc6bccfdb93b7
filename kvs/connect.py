"""redis-py clients for each store URL form (``kvs/urls.py``), built one way for every
FlowServe process: no retries inside redis-py (``Retrier`` retries, bounded by time),
RESP2 (the cache's invalidation protocol), a blocking pool where redis-py has one.

* one server: ``redis.BlockingConnectionPool`` under a ``StoreRedis``;
* Sentinel: a blocking pool whose connections ask the sentinels for the primary before
  they connect (redis-py's ``SentinelConnectionPool``), and reconnect there after a
  failover (the demoted primary's ``READONLY`` reply, or a lost connection);
* Cluster: a ``StoreCluster`` (redis-py's ``RedisCluster``), which maps slots to primaries
  and follows ``MOVED``; its per-node pools are plain ones of ``max_connections`` each.

Every client carries its store's ``ReplicaWait`` (``kvs/replicas.py``).
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from flow.errors import FlowTypeError, FlowValueError
from kvs.options import KVSOptions
from kvs.redact import redact_url
from kvs.replicas import ReplicaWait, StoreCluster, StoreRedis
from kvs.urls import StoreURL, parse_store_url

StoreClient = StoreRedis | StoreCluster


def make_pool(url: str, options: KVSOptions, connection_class=None, **extra) -> redis.ConnectionPool:
    """A blocking redis-py pool for a one-server ``url`` without redis-py's own retries
    (``Retrier`` does them, bounded by time). Raises ``FlowValueError`` quoting a
    malformed URL."""
    if not isinstance(url, str):
        raise FlowTypeError(f"url must be a str, got {type(url).__name__} ({url!r})")
    kwargs = dict(_connection_kwargs(options), max_connections=options.max_connections, **extra)
    kwargs["timeout"] = options.socket_timeout  # how long to wait for a free connection
    if connection_class is not None:
        kwargs["connection_class"] = connection_class
    try:
        return redis.BlockingConnectionPool.from_url(url, **kwargs)
    except ValueError as exc:
        raise FlowValueError(f"bad store URL {redact_url(url)!r}: {exc}") from None


def open_client(url: str | StoreURL, options: KVSOptions, connection_class=None) -> StoreClient:
    """A client of the store at ``url`` (any form), connecting lazily. ``connection_class``
    replaces redis-py's own (the cache's tracked connections, ``kvs/tracking.py``)."""
    parsed = url if isinstance(url, StoreURL) else parse_store_url(url)
    wait = ReplicaWait(parsed.wait_replicas, parsed.wait_timeout)
    client: StoreClient
    if parsed.kind == "redis":
        client = StoreRedis(connection_pool=make_pool(parsed.url, options, connection_class))
    elif parsed.kind == "sentinel":
        client = StoreRedis(connection_pool=_sentinel_pool(parsed, options, connection_class))
    else:
        client = _cluster(parsed, options, connection_class)
    client.replica_wait = wait
    return client


def close_client(client: StoreClient) -> None:
    """Close every connection of ``client`` (all nodes of a Cluster)."""
    if isinstance(client, StoreCluster):
        client.close()
    else:
        client.connection_pool.disconnect()


def node_connection_kwargs(parsed: StoreURL, options: KVSOptions) -> dict[str, Any]:
    """What a single connection to one node of ``parsed``'s store needs besides its host
    and port (the cache's invalidation connection to each Cluster primary)."""
    return dict(_connection_kwargs(options), username=parsed.username, password=parsed.password)


def _connection_kwargs(options: KVSOptions) -> dict[str, Any]:
    return dict(
        socket_timeout=options.socket_timeout,
        socket_connect_timeout=options.connect_timeout,
        client_name=options.client_name,
        retry=None,  # no hidden retries inside redis-py: one time budget, ours
        # RESP2 explicitly (redis-py 8 defaults to RESP3): the cache's invalidation
        # protocol (tracking REDIRECT + pub/sub) is the RESP2 one, on every Redis >= 6
        protocol=2,
    )


class _BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """redis-py's Sentinel pool, blocking like the one-server pool: callers past
    ``max_connections`` wait for a free connection instead of failing."""


class WatchedSentinel(Sentinel):
    """redis-py's ``Sentinel``, which asks the sentinels for the primary before every new
    connection; with a ``hint`` (a ``CachedKVS``'s ``PrimaryWatch``: the primary as the
    last ``+switch-master`` named it) it takes that instead, so after a failover no new
    connection goes to the old primary on the word of a sentinel that has not heard yet."""

    hint: Any = None  # () -> (host, port) | None

    def discover_master(self, service_name):
        hint = self.hint
        address = hint() if hint is not None else None
        return address if address is not None else super().discover_master(service_name)


def watched_sentinel(client: StoreClient) -> WatchedSentinel | None:
    """The ``WatchedSentinel`` behind a Sentinel store's client (None for other stores)."""
    manager = getattr(client.connection_pool, "sentinel_manager", None) if isinstance(client, StoreRedis) else None
    return manager if isinstance(manager, WatchedSentinel) else None


def _sentinel_pool(parsed: StoreURL, options: KVSOptions, connection_class) -> redis.ConnectionPool:
    # the sentinels are asked for the primary at each new connection: quick timeouts, so a
    # dead sentinel costs one connect timeout before the next is asked
    sentinel_kwargs = dict(
        socket_timeout=options.connect_timeout,
        socket_connect_timeout=options.connect_timeout,
        username=parsed.sentinel_username,
        password=parsed.sentinel_password,
        retry=Retry(NoBackoff(), 0),
        protocol=2,
    )
    manager = WatchedSentinel(list(parsed.hosts), sentinel_kwargs=sentinel_kwargs)
    kwargs = dict(
        _connection_kwargs(options),
        username=parsed.username,
        password=parsed.password,
        db=parsed.db,
        max_connections=options.max_connections,
        timeout=options.socket_timeout,
        is_master=True,
    )
    if connection_class is not None:
        kwargs["connection_class"] = connection_class
    assert parsed.service is not None  # a sentinel URL always names its service
    return _BlockingSentinelPool(parsed.service, manager, **kwargs)


def _cluster(parsed: StoreURL, options: KVSOptions, connection_class) -> StoreCluster:
    kwargs = dict(_connection_kwargs(options))
    del kwargs["retry"]  # RedisCluster refuses it among the node settings
    if connection_class is not None:
        kwargs["connection_class"] = connection_class
    (host, port), *others = parsed.hosts
    try:
        # given a URL, redis-py builds each node's pool with connection_pool_class: blocking
        # pools, as for one server (a caller past max_connections waits for a connection)
        return StoreCluster(
            url=f"redis://{_netloc(host)}:{port}",
            startup_nodes=[ClusterNode(h, p) for h, p in others],
            username=parsed.username,
            password=parsed.password,
            connection_pool_class=redis.BlockingConnectionPool,
            max_connections=options.max_connections,
            timeout=options.socket_timeout,  # how long to wait for a free connection
            # one attempt per call: Retrier retries with backoff within retry_timeout, and
            # redis-py refreshes its map of the slots after each failure
            retry=Retry(NoBackoff(), 0),
            **kwargs,
        )
    except redis.exceptions.RedisClusterException as e:
        # the client asks a node for the map of slots at once: none answered
        raise redis.ConnectionError(f"no node of the Redis Cluster at {redact_url(parsed.url)} answered: {e}") from e


def _netloc(host: str) -> str:
    return f"[{host}]" if ":" in host else host
