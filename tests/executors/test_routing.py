"""Continuation routing: rows go to the key's owner (rendezvous hashing) unless the
sending executor holds the key in its own cache (and is not a racing copy); key-split
parts carry their rows' positions and merge back in the request's row order."""

from __future__ import annotations

import json

import numpy as np
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from executors.wire.routing import complete, deliveries, keeps_rows, merge, rendezvous, whole
from executors.worker.stage_runner import BoundStage
from flow import Flow, optimize
from flow.errors import FlowValueError
from flow.table import Table
from kvs.cache import ENTRY_OVERHEAD
from kvs.serialization import encode
from optimizer import positions
from tests.executors.conftest import unique

ADDRESSES = ["ipc:///a", "ipc:///b", "ipc:///c"]


def _continuation_stage():
    f = Flow("routed", schema={"k": str})
    f.lookup(column="k", name="v").map(lambda r: float(r.v.sum()), names=["total"])
    plan = optimize(f)
    (stage,) = [s for s in plan.stages.values() if s.continuation == "k"]
    return stage


def _owner_groups(keys):
    return {a: [k for k in keys if rendezvous(k, ADDRESSES) == a] for a in ADDRESSES}


def test_rows_go_to_their_keys_owner_and_parts_make_the_whole():
    keys = [f"key:{i}" for i in range(30)]
    table = Table.from_any([{"k": k} for k in keys])
    sent = deliveries(table, _continuation_stage(), ADDRESSES)
    got = {d.address: d.table.column("k").to_list() for d in sent}
    assert got == {a: ks for a, ks in _owner_groups(keys).items() if ks}
    assert complete([d.path for d in sent])


def test_rows_whose_key_the_sender_holds_stay_with_the_sender():
    keys = [f"key:{i}" for i in range(30)]
    held = set(keys[::3])
    here = ADDRESSES[1]
    table = Table.from_any([{"k": k} for k in keys])
    sent = deliveries(table, _continuation_stage(), ADDRESSES, here=here, holds=held.__contains__)
    got = {d.address: set(d.table.column("k").to_list()) for d in sent}
    for addr, ks in _owner_groups(keys).items():
        expected = held | set(ks) if addr == here else set(ks) - held
        assert got.get(addr, set()) == expected, addr
    assert complete([d.path for d in sent])
    # a sender that is not a replica of the stage never keeps rows
    sent = deliveries(table, _continuation_stage(), ADDRESSES, here="ipc:///elsewhere", holds=held.__contains__)
    assert {d.address: d.table.column("k").to_list() for d in sent} == {
        a: ks for a, ks in _owner_groups(keys).items() if ks
    }


def _keyed(n: int, qids=None) -> Table:
    return Table.from_pylist([{"k": f"key:{i % 7}", "x": i} for i in range(n)], qid=qids)


def _shuffled(parts: dict) -> dict:
    """The same parts, arrived in another order (merging must not depend on it)."""
    return dict(reversed(list(parts.items())))


def test_key_split_parts_merge_back_in_row_order():
    table = _keyed(30)
    sent = deliveries(table, _continuation_stage(), ADDRESSES)
    assert len(sent) == 3
    for d in sent:  # each part: its rows in order, with their positions in the split table
        pos = positions.positions(d.table)
        assert (np.diff(pos) > 0).all()
        assert d.table["x"].tolist() == pos.tolist()
    merged = merge(_shuffled({d.path: d.table for d in sent}))
    assert merged.equals(table)  # every row back in its place, the positions column gone


def test_nested_splits_merge_back_by_root_position():
    table = _keyed(40)
    stage = _continuation_stage()
    leaves = {}
    for d in deliveries(table, stage, ADDRESSES):
        # the part runs (a filter drops some rows), and its output is split again
        out = d.table.filter(np.asarray(d.table["x"]) % 3 != 0)
        for sub in deliveries(out, stage, ADDRESSES[:2], d.path):
            leaves[sub.path] = sub.table
    assert complete(leaves) and len(leaves) > 3
    assert merge(_shuffled(leaves)).equals(table.filter(np.asarray(table["x"]) % 3 != 0))


def test_a_continuation_keeps_the_positions_of_the_rows_its_filters_keep():
    """Rows of one qid (after a union) are told apart: by position, not by qid."""
    f = Flow("kept", schema={"k": str, "x": int})
    f.lookup(column="k", name="v").filter(lambda r: r.x % 2 == 0).map(lambda r: r.x + r.v, names=["y"])
    (stage,) = optimize(f).stages.values()
    table = Table.from_pylist([{"k": f"key:{i // 2 % 2}", "x": i} for i in range(8)], qid=[5] * 8)
    store = {"key:0": 100, "key:1": 200}
    parts = {d.path: BoundStage(stage)([d.table], store) for d in deliveries(table, stage, ADDRESSES)}
    assert len(parts) == 2 and all(positions.positions(t) is not None for t in parts.values())
    merged = merge(parts)
    whole = BoundStage(stage)([table], store)  # the stage run on all rows at once, unsplit
    assert merged.equals(whole) and merged["y"].tolist() == [100, 202, 104, 206]


def test_a_single_replica_or_an_empty_table_is_one_part_and_merges_to_itself():
    stage = _continuation_stage()
    for table in (_keyed(5), _keyed(0)):
        (d,) = deliveries(table, stage, ADDRESSES[:1])
        # the only part keeps its rows in order: sent as it is, without positions or a copy
        assert d.path == ((0, 1),) and d.table is table and positions.positions(d.table) is None
        assert merge({d.path: d.table}).equals(table)
    part = positions.split(_keyed(4), np.array([1, 3]))  # a part of an earlier split keeps its positions
    (d,) = deliveries(part, stage, ADDRESSES[:1])
    assert d.path == ((0, 1),) and positions.positions(d.table).tolist() == [1, 3]
    (d,) = deliveries(_keyed(0), stage, ADDRESSES)
    assert merge({d.path: d.table}).equals(_keyed(0))
    unsplit = _keyed(3)
    assert merge({(): unsplit}) is unsplit  # the common path: nothing to merge, no copy


def test_racing_producers_never_keep_continuation_rows():
    """A racing stage's copies run on executors with different caches; only pure
    rendezvous makes their splits (and so their parts' labels) agree."""
    plan = optimize(_racing_into_lookup())
    racing, cont = plan.stages.values()
    assert racing.competitive == 3 and cont.continuation == "k"
    assert not keeps_rows(racing, cont)
    assert keeps_rows(racing.with_(competitive=1, replicas=1), cont)
    assert not keeps_rows(cont, racing)  # only continuation consumers route by key at all


def _racing_into_lookup():
    f = Flow("race", schema={"k": str})
    f.map(lambda r: r.k, names=["k"], high_variance=True).lookup(column="k")
    return f


def test_a_continuation_that_changes_its_row_count_is_a_named_error():
    f = Flow("bad", schema={"k": str})
    f.lookup(column="k", name="v").map(lambda r: r.v, names=["w"])
    (stage,) = optimize(f).stages.values()
    table = positions.split(_keyed(4).select(["k"]), np.arange(4))
    bound = BoundStage(stage)
    bound.bound[1] = lambda inputs, store: inputs[0].take([0])  # a broken operator: rows lost
    with pytest.raises(FlowValueError, match="operator 'lambda' gave 1 rows for 4"):
        bound([table], {f"key:{i}": i for i in range(7)})


def second_key(row):
    return row.k2


def read_other(row):
    from flow import current_store

    store = current_store()
    for key in row.k2.split(","):  # read into this executor's cache, in this order
        store.get(key)
    return float(store.get(key).sum())


def total(row):
    return float(row.v2.sum())


VALUE = np.arange(4, dtype=np.float32)


def _deploy_two_lookups(cluster, name):
    """``two``: lookup(k1) -> lookup(k2), two continuations; ``warm``: lookup(k1), then
    operator code reads the keys listed in k2 on k1's executor."""
    two = Flow(name, schema={"k1": str, "k2": str})
    two.lookup(column="k1", name="v1").map(second_key, names=["key2"]).lookup(column="key2", name="v2").map(
        total, names=["total"]
    )
    d = cluster.deploy(two)
    assert [s.continuation for s in d.plan.stages.values()] == ["k1", "key2"]
    warm = Flow(name + "-warm", schema={"k1": str, "k2": str})
    warm.lookup(column="k1", name="v1").map(read_other, names=["total"])
    return d, cluster.deploy(warm)


def _where(http, deployment, k1, k2):
    r = http.post(deployment.url, json={"k1": k1, "k2": k2})
    assert r.status_code == 200, r.text
    assert r.json()["rows"][0]["total"] == float(VALUE.sum())
    return [executor for _stage, executor, _ms, _batch in json.loads(r.headers["x-flowserve-trace"])]


def _second_key_owned_elsewhere(cluster, http, d, k1, name):
    """A fresh second key (held by nobody: it goes to its owner) owned by another
    executor than k1's; and the two owners."""
    for i in range(40):
        k2 = f"{name}:k2:{i}"
        cluster.kvs.put(k2, VALUE)
        a, b = _where(http, d, k1, k2)
        if a != b:
            return k2, a, b
    raise AssertionError("40 keys in a row were owned by the executor that owns k1")


def test_a_continuation_runs_where_its_key_is_cached(cluster, http):
    """On a real cluster. The first lookup (by k1) runs at k1's owner A. The second (by
    k2) goes from A to k2's owner B, until A holds k2 too; then it stays on A."""
    name = unique("routed")
    d, w = _deploy_two_lookups(cluster, name)
    k1 = f"{name}:k1"
    cluster.kvs.put(k1, np.zeros(4))
    k2, a, b = _second_key_owned_elsewhere(cluster, http, d, k1, name)
    assert _where(http, d, k1, k2) == [a, b]  # A does not hold k2: the hop to its owner again
    assert _where(http, w, k1, k2) == [a]  # A reads k2 (not as a lookup: operator code)
    assert _where(http, d, k1, k2) == [a, a]  # A holds k2 now: no hop


def test_a_cache_that_evicts_sends_rows_to_their_owners(http):
    """An executor whose cache had to evict lately holds less than its share: it sends
    rows on to their keys' owners even for keys it holds, so its own keys stay."""
    entry = len(encode(VALUE)) + ENTRY_OVERHEAD
    config = ClusterConfig(executors=2, threads=2, executor_cache_bytes=int(3.5 * entry))
    with LocalCluster(config) as cluster:
        name = "pressure"
        d, w = _deploy_two_lookups(cluster, name)
        k1 = f"{name}:k1"
        cluster.kvs.put(k1, VALUE)
        k2, a, b = _second_key_owned_elsewhere(cluster, http, d, k1, name)
        cluster.kvs.mput({f"{name}:x": VALUE, f"{name}:y": VALUE})
        # A's cache holds 3 values: reading x, y, k2 after k1 evicts k1; the next request
        # reads k1 again (evicting x), so when its row is routed A holds y, k2 and k1
        assert _where(http, w, k1, f"{name}:x,{name}:y,{k2}") == [a]
        assert _where(http, d, k1, k2) == [a, b]  # A holds k2 but evicted lately: to B


@pytest.mark.parametrize(
    "path", [(), ((0, 1),), ((0, 1), (0, 1)), ((0, 2),), ((1, 2),), ((0, 1), (2, 3)), ((0, 3), (0, 1))]
)
def test_one_part_is_whole_exactly_when_it_alone_is_complete(path):
    assert whole(path) == complete((path,))
