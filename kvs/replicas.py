"""Writes that must survive a failover wait until a replica holds them (Redis ``WAIT``).

Redis replicates asynchronously: a primary acknowledges a write before any replica has
it, so a primary killed right after loses it, and the replica promoted in its place
never had it. ``WAIT n timeout`` blocks the connection that wrote until ``n`` replicas
acknowledged everything that connection wrote, so the write and its ``WAIT`` go out on
one connection, in one pipeline (one round trip; on a Cluster, one per node written).

Which writes wait (``ReplicaWait.replicas`` > 0, from the store URL: ``kvs/urls.py``):
``KVS.put``/``mput``/``put_trusted`` (user data and plans) and the deploy record's
scripts (``executors/plans.py``: version counters, the registry). Heartbeats, markers,
prediction-cache entries and selection records do not: losing one costs a beat or a
recomputation, and they would pay the wait on the hot path.

A write no replica confirmed within the timeout raises ``NOREPLICAS`` (the error Redis
itself gives a write refused under ``min-replicas-to-write``), a ``StoreWriteError``
through ``KVS``: the primary may keep it, but a failover may lose it, so the caller is
told it did not succeed (retry). With one replica, a failover leaves the new primary
alone: these writes then fail until a replica is attached to it again (the old primary
restarted, or a second replica); reads and the other writes go on.

    >>> written(client, [Write("k", ("SET", "k", b"v"))])   # doctest: +SKIP
    [True]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, TryAgainError

NOREPLICAS = "NOREPLICAS"


@dataclass(frozen=True)
class ReplicaWait:
    """How many replicas a write that must survive waits for, and for how long."""

    replicas: int = 0
    timeout_s: float = 1.0

    @property
    def timeout_ms(self) -> int:
        return max(1, int(self.timeout_s * 1000))


@dataclass(frozen=True)
class Write:
    """One command for ``written``: ``key`` says which node runs it (on a Cluster), and
    ``wait`` whether it must reach a replica."""

    key: str
    args: tuple
    wait: bool = True


class StoreRedis(redis.Redis):
    """``redis.Redis`` (one server, or a Sentinel-managed primary) that knows which writes
    wait for a replica."""

    replica_wait: ReplicaWait = ReplicaWait()


class StoreCluster(RedisCluster):
    """``RedisCluster`` that knows which writes wait for a replica."""

    replica_wait: ReplicaWait = ReplicaWait()


def policy_of(client: Any) -> ReplicaWait:
    """The client's ``ReplicaWait`` (none for a client this package did not build)."""
    return getattr(client, "replica_wait", None) or ReplicaWait()


def written(client: Any, writes: Sequence[Write]) -> list:
    """Run ``writes`` (replies in order); those with ``wait`` wait for the replicas the
    client's policy names (``policy_of``), on the connection that wrote them.

    Raises ``redis.ResponseError`` ``NOREPLICAS ...`` when fewer confirmed in time, and
    ``redis.ConnectionError`` when a Cluster node moved a slot or went away meanwhile (the
    client's map of the cluster is refreshed first: retrying goes to the right node)."""
    policy = policy_of(client)
    if isinstance(client, RedisCluster):
        return _written_cluster(client, writes, policy)
    return _run(client, list(writes), policy, where="the primary")


def _run(node: redis.Redis, writes: list[Write], policy: ReplicaWait, where: str) -> list:
    waits = policy.replicas > 0 and any(w.wait for w in writes)
    if len(writes) == 1 and not waits:
        return [node.execute_command(*writes[0].args)]
    pipe = node.pipeline(transaction=False)
    for w in writes:
        pipe.execute_command(*w.args)
    if waits:
        pipe.execute_command("WAIT", policy.replicas, policy.timeout_ms)
    replies = pipe.execute()
    if waits:
        acked = int(replies.pop())
        if acked < policy.replicas:
            raise redis.ResponseError(
                f"{NOREPLICAS} {acked} of {policy.replicas} replica(s) confirmed the write within "
                f"{policy.timeout_s:g} s on {where}: a failover could lose it (for a store without "
                "replicas, set wait_replicas=0 in its URL)"
            )
    return replies


def _written_cluster(client: RedisCluster, writes: Sequence[Write], policy: ReplicaWait) -> list:
    by_node: dict[str, tuple[Any, list[int]]] = {}
    for i, w in enumerate(writes):
        node = client.get_node_from_key(w.key)
        by_node.setdefault(node.name, (node, []))[1].append(i)
    replies: list = [None] * len(writes)
    for node, indexes in by_node.values():
        try:
            out = _run(client.get_redis_connection(node), [writes[i] for i in indexes], policy, f"node {node.name}")
        except (AskError, ClusterDownError, TryAgainError, redis.ConnectionError, redis.TimeoutError) as e:
            # a slot moved (MOVED is an AskError), a failover is under way, or the node is
            # gone: learn the new map, then let the caller's retry go where the slot is now
            try:
                client.nodes_manager.initialize()
            except Exception:  # no node answers yet: the retry tries again
                pass
            raise redis.ConnectionError(f"Redis Cluster node {node.name}: {type(e).__name__}: {e}") from e
        for i, reply in zip(indexes, out):
            replies[i] = reply
    return replies
