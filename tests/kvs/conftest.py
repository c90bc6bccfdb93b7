"""Fixtures of replicated stores: a real Sentinel set and a real Redis Cluster, from the
server binary the project ships (``kvs/replicated.py``), started once for the session.

* ``sentinel_store`` (session): a primary, one replica, three sentinels.
* ``cluster_store`` (session): three primaries with one replica each.
* ``replicated`` (function, parametrized): each of them in turn, flushed before the test.

Tests that kill or fail over a node start their own set: these are shared.
"""

from __future__ import annotations

import pytest
import redis

from kvs.replicated import ClusterStore, SentinelStore


@pytest.fixture(scope="session")
def sentinel_store(tmp_path_factory):
    with SentinelStore(replicas=1, sentinels=3, dir=tmp_path_factory.mktemp("sentinel")) as store:
        yield store


@pytest.fixture(scope="session")
def cluster_store(tmp_path_factory):
    with ClusterStore(masters=3, replicas=1, dir=tmp_path_factory.mktemp("cluster")) as store:
        yield store


@pytest.fixture(params=["sentinel", "cluster"])
def replicated(request):
    """A replicated store (each kind in turn), empty."""
    store = request.getfixturevalue(f"{request.param}_store")
    for node in store.nodes:
        if node.running:
            client = redis.Redis(host="127.0.0.1", port=node.port, password=store.password, protocol=2)
            if client.info("replication")["role"] == "master":
                client.flushall()
            client.close()
    return store
