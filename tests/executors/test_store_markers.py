"""Markers that tell a store that lost its data from one that never had it (kvs/markers.py),
and the rules built on them: 503 for lookups of lost data, versions that are never reused,
a registry that only moves forward. Against the session's real Redis server."""

from __future__ import annotations

import numpy as np
import pytest

from executors.errors import status_for
from executors.gateway.durability import registry_if_intact, republish
from executors.plans import DEPLOYED_KEY, next_version, register_deployed
from flow import Flow
from flow.errors import LookupKeyError, RetryableError
from kvs import StoreLostError
from kvs.markers import DATA_MARKER, STORE_MARKER, mark_started
from tests.executors.processes import wait_until


def _server_ms(redis) -> int:
    seconds, micros = redis.time()
    return seconds * 1000 + micros // 1000


def test_user_writes_mark_the_data_and_internal_ones_do_not(kvs):
    kvs.put_trusted("plan", {"a": 1})
    assert not kvs.redis.exists(DATA_MARKER)
    kvs.put("k", 1)
    assert kvs.redis.exists(DATA_MARKER)
    kvs.redis.delete(DATA_MARKER)
    kvs.mput({"a": 1, "b": 2})
    assert kvs.redis.exists(DATA_MARKER) and kvs.get("b") == 2


def test_cached_writes_mark_the_data_too(cached_kvs):
    cached_kvs.put("k", np.ones(2))
    assert cached_kvs.redis.exists(DATA_MARKER)


def test_a_lookup_of_a_missing_key_is_503_only_when_the_store_lost_its_data(kvs):
    f = Flow("lk")
    f.lookup(column="k", name="v")
    mark_started(kvs.redis)  # a cluster started on this store: missing keys are the rows' fault
    with pytest.raises(LookupKeyError, match="'nope' is not in the store") as e:
        f.run([{"k": "nope"}], kvs=kvs)
    assert status_for(e.value) == 422

    kvs.redis.flushall()  # what an empty restart looks like: no marker
    with pytest.raises(StoreLostError, match="lost its data") as e:
        f.run([{"k": "nope"}], kvs=kvs)
    assert isinstance(e.value, RetryableError) and status_for(e.value) == 503
    null = Flow("lk-null")
    null.lookup(column="k", name="v", missing="null")
    assert null.run([{"k": "nope"}], kvs=kvs)["v"].tolist() == [None]  # asked for nulls: not checked

    kvs.put("vec", 1.5)  # data written again: the store holds data, a missing key is 422 again
    with pytest.raises(LookupKeyError):
        f.run([{"k": "nope"}], kvs=kvs)
    assert f.run([{"k": "vec"}], kvs=kvs)["v"].tolist() == [1.5]


def test_versions_are_never_reused_even_after_the_store_is_emptied(kvs):
    first = [next_version(kvs.redis, "f") for _ in range(3)]
    assert first == sorted(set(first))
    # versions issued faster than one per millisecond run ahead of the clock by that much;
    # a store's restart takes far longer, which this stands for
    wait_until("the server clock to pass the last version", lambda: _server_ms(kvs.redis) > first[-1], timeout=5)
    kvs.redis.flushall()  # the counter is gone
    again = next_version(kvs.redis, "f")
    assert again > first[-1]
    assert next_version(kvs.redis, "f") == again + 1


def test_the_registry_only_moves_forward(kvs):
    assert register_deployed(kvs.redis, "f", 5) == 5
    assert register_deployed(kvs.redis, "f", 4) == 5  # an older deploy does not replace it
    assert register_deployed(kvs.redis, "f", 7) == 7
    assert int(kvs.redis.hget(DEPLOYED_KEY, "f")) == 7


def test_a_lost_registry_reads_as_lost_not_empty_and_is_republished(kvs):
    from executors.gateway.records import DeployedFlow
    from executors.plans import PLAN_KEY, VERSION_KEY
    from optimizer import Plan

    f = Flow("kept")
    f.map(lambda r: r.x + 1, names=["y"])
    assert registry_if_intact(kvs.redis) is None  # no marker: nothing to trust
    mark_started(kvs.redis)
    assert registry_if_intact(kvs.redis) == {}
    kvs.redis.flushall()
    assert republish(kvs, {"kept": DeployedFlow(Plan.from_flow(f), 42, {})}, {"flowserve:gateways": 3}) == ["kept"]
    assert int(kvs.redis.get("flowserve:gateways")) == 3  # a new gateway's qid block comes after this one's
    assert registry_if_intact(kvs.redis) == {"kept": 42}
    assert int(kvs.redis.get(VERSION_KEY.format(flow="kept"))) == 42
    assert kvs.get(PLAN_KEY.format(flow="kept", version=42), trusted=True).flow_name == "kept"
    assert kvs.redis.exists(STORE_MARKER) and not kvs.redis.exists(DATA_MARKER)  # user data is not back
