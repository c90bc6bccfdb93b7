"""The flow generator covers every operator, builds runnable flows, and compares fairly."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from flow import Table
from tests.flowgen import FlowCase, assert_same_rows, canonical_rows, random_case

EVERY_VARIANT = {
    "map",
    "map.row",
    "map.multi",
    "map.col",
    "map.class",
    "map.init",
    "map.batching",
    "map.gpu",
    "map.high_variance",
    "map.keep",
    "map.key",
    "map.tensor",
    "filter",
    "filter.batching",
    "agg",
    "groupby.agg",
    "agg.count",
    "agg.sum",
    "agg.min",
    "agg.max",
    "agg.mean",
    "join",
    "join.inner",
    "join.left",
    "join.outer",
    "join.qid",
    "join.on_column",
    "union",
    "lookup",
    "lookup.fixed",
    "lookup.dynamic",
    "lookup.missing_null",
    "anyof",
    "anyof.valid",
    "anyof.batching",
    "anyof.gpu",
    "anyof.failing",
}

CASES = [random_case(seed) for seed in range(200)]


def test_generated_flows_use_every_operator_variant():
    seen = set().union(*(c.features for c in CASES))
    assert EVERY_VARIANT <= seen, f"never generated: {sorted(EVERY_VARIANT - seen)}"


def test_generated_flows_branch_and_have_several_requests():
    assert sum(any(len(cs) > 1 for cs in c.flow.consumers().values()) for c in CASES) > 50
    assert sum(len(c.requests) > 1 for c in CASES) > 50
    assert sum(len(c.rows) == 0 for c in CASES) > 0


def test_generated_cases_run_and_their_requests_partition_the_rows():
    for case in CASES[:60]:
        case.flow.run(case.table, kvs=case.store)  # no error by construction
        qids = [q for r in case.requests for q in r.qid.tolist()]
        assert sorted(qids) == sorted(case.qids) and len(set(qids)) == len(qids)


def test_generated_operators_pickle_for_shipping_to_executors():
    for case in CASES[:40]:
        for node in case.flow.nodes:
            assert pickle.loads(pickle.dumps(node.op)) is not None


def test_random_case_is_deterministic_and_printable():
    a, b = random_case(7), random_case(7)
    assert a.script == b.script and a.rows == b.rows
    assert isinstance(a, FlowCase) and "Flow('gen'" in repr(a) and "rows:" in repr(a)


def t(rows, qids):
    return Table.from_pylist(rows, qid=qids)


def test_assert_same_rows_ignores_row_order_within_and_across_qids():
    a = t([{"x": 1}, {"x": 2}, {"x": 3}], [0, 0, 1])
    b = t([{"x": 3}, {"x": 2}, {"x": 1}], [1, 0, 0])
    assert_same_rows(a, b)


def test_assert_same_rows_ordered_compares_row_by_row():
    a = t([{"x": 1}, {"x": 2}, {"x": 3}], [0, 1, 1])
    assert_same_rows(a, t([{"x": 1.0}, {"x": 2}, {"x": 3}], [0, 1, 1]), ordered=True)  # values still loose
    for other in (a.take([1, 0, 2]), a.take([0, 2, 1])):  # across qids, and within one
        assert_same_rows(other, a)
        with pytest.raises(AssertionError, match="the same rows in another order; first difference at row"):
            assert_same_rows(other, a, ordered=True)


def test_assert_same_rows_fails_on_a_moved_or_changed_row():
    a = t([{"x": 1}, {"x": 2}], [0, 1])
    with pytest.raises(AssertionError, match=r"qid\(s\) \[0, 1\]"):
        assert_same_rows(a, t([{"x": 2}, {"x": 1}], [0, 1]))
    with pytest.raises(AssertionError, match="rows differ"):
        assert_same_rows(a, t([{"x": 1}, {"x": 1}], [0, 1]))
    with pytest.raises(AssertionError, match="rows differ"):  # a duplicate is not the same multiset
        assert_same_rows(t([{"x": 1}], [0]).take([0, 0]), t([{"x": 1}], [0]))


def test_assert_same_rows_checks_columns():
    with pytest.raises(AssertionError, match="columns differ"):
        assert_same_rows(t([{"x": 1, "y": 2}], [0]), t([{"y": 2, "x": 1}], [0]))
    assert_same_rows(t([{"x": 1, "y": 2}], [0]), t([{"y": 2, "x": 1}], [0]), column_order=False)


def test_assert_same_rows_is_loose_only_where_merging_changes_types():
    assert_same_rows(t([{"x": 1}], [0]), t([{"x": 1.0}], [0]))  # int widened to float
    assert_same_rows(t([{"x": None}, {"x": 2.0}], [0, 1]), t([{"x": float("nan")}, {"x": 2.0}], [0, 1]))
    with pytest.raises(AssertionError):
        assert_same_rows(t([{"x": "1"}], [0]), t([{"x": 1}], [0]))  # str is not int
    v = np.array([1.0, 2.0])
    assert canonical_rows(t([{"v": v}], [0])) == canonical_rows(t([{"v": v.copy()}], [0]))
    with pytest.raises(AssertionError):
        assert_same_rows(t([{"v": v}], [0]), t([{"v": v + 1}], [0]))


def test_race_lookups_make_racing_stages_feed_continuations():
    """``race_lookups=`` generates what the key-routing tests need: in the optimized plan,
    a racing stage whose output a continuation routes by key."""
    from optimizer import optimize

    def racing_into_lookup(case):
        stages = optimize(case.flow).stages
        return any(
            i in stages and stages[i].competitive > 1 for s in stages.values() if s.continuation for i in s.inputs
        )

    cases = [random_case(seed, race_lookups=50) for seed in range(20)]
    assert sum(racing_into_lookup(c) for c in cases) >= 15
    assert sum("race.lookup" in random_case(seed).features for seed in range(20)) == 0  # off by default
