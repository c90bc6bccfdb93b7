"""Fixtures for runtime tests: real local clusters (real Redis, executor processes, HTTP).

* ``cluster`` (session): a 2-executor LocalCluster shared by the runtime tests; deploy
  flows with unique names. Stopped at the end of the session.
* ``http`` (session): an httpx.Client for raw HTTP calls.
* ``procs``: gateway and executor processes started by hand (tests/executors/processes.py)
  over the session's Redis, emptied first (no members or flows left from another test).
"""

from __future__ import annotations

import itertools
import os

import httpx
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from kvs import KVS
from tests.executors.processes import Procs

os.environ.setdefault("FLOWSERVE_QUIET", "1")
_names = itertools.count()


def unique(name: str) -> str:
    """A flow name not used before in this session (flows share one cluster)."""
    return f"{name}-{next(_names)}"


@pytest.fixture(scope="session")
def cluster():
    c = LocalCluster(ClusterConfig(executors=2, threads=4, request_timeout_s=20, max_body_bytes=1 << 20)).start()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def http():
    with httpx.Client(timeout=30) as client:
        yield client


@pytest.fixture
def procs(redis_server, tmp_path):
    with KVS.from_url(redis_server.url) as store:
        store.redis.flushall()
    p = Procs(redis_server.url, tmp_path)
    yield p
    p.stop()
