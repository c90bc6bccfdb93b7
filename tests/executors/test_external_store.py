"""The runtime on an external, replicated store: its keys and scripts on a real Sentinel
set and a real Redis Cluster (every multi-key call within one slot), executor and gateway
processes given each in ``FLOWSERVE_KVS_URL`` (as pods are), and a local cluster pointed at
each (``ClusterConfig.kvs_url``) whose primary is killed under load."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from benchmarks.store_failover import failover_run
from executors.gateway.durability import registry_if_intact, republish
from executors.hosts.cluster_config import ClusterConfig
from executors.plans import (
    DEPLOYED_KEY,
    PLAN_KEY,
    VERSION_KEY,
    load_plan,
    next_version,
    raise_version,
    register_deployed,
)
from executors.wire.membership import ALIVE_KEY, MEMBERS_KEY, Heartbeat, Member, live_members
from flow import Flow
from flow.configuration import ConfigError
from kvs import KVS
from kvs.markers import DATA_MARKER, STORE_MARKER, mark_started
from kvs.replicated import ClusterStore, SentinelStore

SIGNING_KEY = bytes(range(32))


@pytest.fixture(scope="module", params=["sentinel", "cluster"])
def store(request, tmp_path_factory):
    make = SentinelStore if request.param == "sentinel" else ClusterStore
    with make(dir=tmp_path_factory.mktemp(request.param)) as s:
        yield s


@pytest.fixture
def kvs(store):
    with KVS.from_url(store.url, signing_key=SIGNING_KEY) as k:
        k.redis.flushall()  # on a Cluster, on every primary
        yield k


def test_keys_used_together_share_a_slot():
    assert key_slot(STORE_MARKER.encode()) == key_slot(DEPLOYED_KEY.encode())  # one MULTI reads both
    assert {key_slot(k.encode()) for k in (MEMBERS_KEY, ALIVE_KEY.format(id="a"), ALIVE_KEY.format(id="b"))} == {
        key_slot(MEMBERS_KEY.encode())
    }  # one MGET reads every alive key, one MULTI writes a beat


def test_versions_registry_and_plans(kvs):
    versions = [next_version(kvs.redis, "f") for _ in range(3)]
    assert versions == sorted(set(versions))
    raise_version(kvs.redis, "f", versions[-1] + 10)
    assert next_version(kvs.redis, "f") == versions[-1] + 11
    assert register_deployed(kvs.redis, "f", 5) == 5
    assert register_deployed(kvs.redis, "f", 4) == 5
    flow = Flow("f")
    flow.map(lambda r: r.x + 1, names=["y"])
    from optimizer import Plan

    kvs.put_trusted(PLAN_KEY.format(flow="f", version=5), Plan.from_flow(flow))
    assert load_plan(kvs, "f", 5).flow_name == "f"


def test_markers_and_the_registry_read_in_one_transaction(kvs):
    from executors.gateway.records import DeployedFlow
    from optimizer import Plan

    assert registry_if_intact(kvs.redis) is None
    mark_started(kvs.redis)  # two keys in two slots: a pipeline split per node
    assert kvs.redis.exists(STORE_MARKER) and kvs.redis.exists(DATA_MARKER)
    register_deployed(kvs.redis, "kept", 7)
    assert registry_if_intact(kvs.redis) == {"kept": 7}
    kvs.redis.delete(STORE_MARKER, DEPLOYED_KEY, VERSION_KEY.format(flow="kept"))  # the state lost
    f = Flow("kept")
    f.map(lambda r: r.x + 1, names=["y"])
    assert republish(kvs, {"kept": DeployedFlow(Plan.from_flow(f), 42, {})}, {"flowserve:gateways": 3}) == ["kept"]
    assert registry_if_intact(kvs.redis) == {"kept": 42}
    assert int(kvs.redis.get(VERSION_KEY.format(flow="kept"))) == 42


def test_membership(kvs):
    beat = Heartbeat(kvs.redis, Member("e0", "tcp://127.0.0.1:1", "cpu", 2), interval_s=0.1)
    beat.beat()
    Heartbeat(kvs.redis, Member("e1", "tcp://127.0.0.1:2", "gpu", 3)).beat()
    assert set(live_members(kvs.redis)) == {"e0", "e1"}
    kvs.redis.delete(ALIVE_KEY.format(id="e1"))  # as if it expired
    assert set(live_members(kvs.redis)) == {"e0"}
    assert kvs.redis.hkeys(MEMBERS_KEY) == [b"e0"]
    beat.stop()
    assert live_members(kvs.redis) == {}


def test_a_cluster_config_names_what_is_wrong_with_its_store_url():
    with pytest.raises(ConfigError, match=r"ClusterConfig.kvs_url: bad store URL 'redis\+sentinel://:\*\*\*@s1:26379'"):
        ClusterConfig(kvs_url="redis+sentinel://:s3cret@s1:26379")


def emb_key(row):
    return f"emb/{row.i}"


def emb_total(row):
    return float(sum(row.vec))


def test_pods_take_the_store_from_their_environment(store, kvs, tmp_path):
    """The Kubernetes shape: an executor and a gateway that spawns nothing, each given the
    store's URL in ``FLOWSERVE_KVS_URL`` as a pod is; the executor registers in the store,
    the gateway finds it there, and the flow's lookups read keys from every shard."""
    from executors.hosts.cluster import ClusterClient
    from tests.executors.processes import ADMIN, Procs, health, wait_until

    kvs.mput({f"emb/{i}": [float(i), 1.0] for i in range(30)})  # over every primary of a Cluster
    procs = Procs(store.url, tmp_path)
    try:
        procs.executor("e0")
        gateway = procs.gateway("gw")
        wait_until("the gateway to find the executor", lambda: health(gateway).get("executors") == 1, timeout=60)
        flow = Flow("emb", schema={"i": int})
        flow.map(emb_key, names=["key"]).lookup(column="key", name="vec").map(emb_total, names=["total"])
        client = ClusterClient(gateway, store.url, ADMIN)
        try:
            answer = client.deploy(flow).call([{"i": i} for i in range(30)])
        finally:
            client.close()
        assert answer.table.column("total").to_list() == [float(i) + 1.0 for i in range(30)]
    finally:
        procs.stop()


@pytest.mark.parametrize("kind", ["sentinel", "cluster"])
def test_kill_the_primary_under_load(kind, tmp_path):
    """A local cluster on an external store: its primary (holding the lookups' data and, on a
    Cluster, the deploy registry) killed under lookups, puts and deploys. Nothing answered
    wrong or lost; writes and deploys go on after the failover; none acknowledged is lost.
    (benchmarks/store_failover.py measures the same with longer runs: the timings.)"""
    r = failover_run(kind, clients=2, before_s=1.0, after_s=1.0, tmp=str(tmp_path))
    lookups, puts, deploys = r["lookups"], r["puts"], r["deploys"]
    assert (lookups["failed"], lookups["lost"], lookups["wrong"]) == (0, 0, 0), lookups
    assert lookups["during_failover"]["answered"] > 0
    assert lookups["first_answer_needing_the_killed_primary_s"] is not None  # answered after the failover
    assert puts["acknowledged_then_lost"] == 0 and puts["first_acknowledged_after_the_kill_s"] is not None
    assert deploys["acknowledged_then_lost"] == 0 and deploys["first_acknowledged_after_the_kill_s"] is not None
    assert deploys["registered_plan_readable"]
