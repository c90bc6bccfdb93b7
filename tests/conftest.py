"""Shared fixtures: a real Redis server for the whole test session.

Fixtures (names are stable; other test packages rely on them):

* ``redis_server`` (session): a started ``kvs.RedisServer`` (persistence off, private
  temporary directory, dies with the test process); stopped at the end of the session.
  Do not stop or restart it in a test: start your own ``RedisServer`` for that.
* ``redis_url`` (session): its ``redis://127.0.0.1:<port>/0`` URL.
* ``kvs`` (function): a ``kvs.KVS`` client on an empty database (FLUSHALL before
  each test), closed afterwards.
* ``cached_kvs`` (function): a ``kvs.CachedKVS`` on the same (flushed) database with
  a 64 MiB cache, closed afterwards.
"""

from __future__ import annotations

import pytest

from kvs import KVS, CachedKVS, RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(dir=tmp_path_factory.mktemp("redis"), appendonly=False)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server) -> str:
    return redis_server.url


@pytest.fixture
def kvs(redis_url):
    store = KVS.from_url(redis_url)
    store.redis.flushall()
    yield store
    store.close()


@pytest.fixture
def cached_kvs(kvs, redis_url):
    store = CachedKVS.from_url(redis_url, cache_max_bytes=64 << 20)
    yield store
    store.close()
