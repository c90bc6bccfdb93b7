"""The local plan interpreter: flow.run's meaning, batching, wait-for-one, errors."""

from __future__ import annotations

import pytest

from executors.worker.interpreter import Interpreter, run_many, run_plan
from executors.worker.stage_runner import BoundStage
from flow import Flow, Table
from flow.errors import (
    FlowTypeError,
    LookupKeyError,
    NoValidResultError,
    OperatorFailedError,
    SchemaError,
)
from optimizer import BatchConfig, OptimizerOptions, optimize
from tests.flowgen import assert_same_rows
from tests.optimizer import examples as ex

RULE_LISTS = [[], ["fusion"], ["competition"], None]


def rows_for(name):
    if name == "recommender":
        return ex.RECOMMENDER_ROWS, ex.RECOMMENDER_STORE
    return ex.RAW_ROWS, None


@pytest.mark.parametrize("name", sorted(ex.EXAMPLES))
@pytest.mark.parametrize("rules", RULE_LISTS, ids=str)
def test_examples_match_flow_run(name, rules):
    flow = ex.EXAMPLES[name]()
    rows, store = rows_for(name)
    expected = flow.run(rows, kvs=store)
    assert run_plan(optimize(flow, rules=rules), rows, kvs=store).equals(expected)


def single_requests(rows, schema=None):
    return [Table.from_pylist([r], qid=[q], schema=schema) for q, r in enumerate(rows)]


def test_batching_stages_merge_requests_up_to_the_batch_size():
    flow = ex.ensemble()
    plan = optimize(flow, options=OptimizerOptions(batch=BatchConfig(max_batch_size=2)))
    reqs = single_requests(ex.RAW_ROWS, flow.schema)
    result = Interpreter(plan).run_many(reqs)
    assert result.stats.calls["resnet"] == [2, 2, 1]
    assert result.stats.calls["inception"] == [2, 2, 1]
    assert result.stats.calls["preprocess"] == [1] * 5  # not a batching stage
    assert result.stats.batches == {"preprocess": 0, "resnet": 2, "inception": 2, "join+pick_best": 0}
    for req, got in zip(reqs, result.tables()):
        assert got.equals(flow.run(req))


def test_without_the_batching_rule_nothing_merges():
    flow = ex.ensemble()
    result = run_many(optimize(flow, rules=["fusion"]), single_requests(ex.RAW_ROWS, flow.schema))
    assert all(n == 0 for n in result.stats.batches.values())


def test_requests_with_other_columns_are_not_merged():
    flow = Flow("free")  # no schema: each request brings its own columns
    flow.map(lambda t: t["x"] * 2, names=["y"], batching=True)
    reqs = [
        Table.from_pylist([{"x": 1}], qid=[0]),
        Table.from_pylist([{"x": 2, "z": 0}], qid=[1]),
        Table.from_pylist([{"x": 3}], qid=[2]),
    ]
    result = run_many(optimize(flow), reqs)
    assert sorted(result.stats.calls["lambda"]) == [1, 2]
    assert [t.to_pylist() for t in result.tables()] == [
        [{"qid": 0, "y": 2}],
        [{"qid": 1, "y": 4}],
        [{"qid": 2, "y": 6}],
    ]


class Picky:
    """A batching model that fails the whole batch if any row is negative."""

    def __call__(self, table):
        if (table["x"] < 0).any():
            raise ValueError("negative input")
        return table["x"] + 100


def test_a_failing_request_does_not_fail_the_others_in_its_batch():
    flow = Flow("picky", schema={"x": int})
    flow.map(Picky(), names=["y"], batching=True)
    reqs = [Table.from_pylist([{"x": x}], qid=[q], schema=flow.schema) for q, x in enumerate([1, -1, 2])]
    result = run_many(optimize(flow), reqs)
    assert result.stats.fallbacks == {"Picky": 1}
    assert result.results[0].to_pylist() == [{"qid": 0, "y": 101}]
    assert isinstance(result.results[1], OperatorFailedError) and result.results[1].qid is None
    assert result.results[2].to_pylist() == [{"qid": 2, "y": 102}]
    with pytest.raises(OperatorFailedError, match="negative input"):
        result.tables()


def test_overlapping_qids_are_rejected():
    flow = ex.ensemble()
    reqs = [Table.from_pylist([{"raw": 1.0}], qid=[5]), Table.from_pylist([{"raw": 2.0}], qid=[5])]
    with pytest.raises(SchemaError, match="both have qid 5"):
        run_many(optimize(flow), reqs)


def test_interpreter_checks_its_arguments():
    with pytest.raises(FlowTypeError, match="expects a Plan, got Flow"):
        Interpreter(ex.ensemble())
    with pytest.raises(FlowTypeError, match="list of requests"):
        Interpreter(optimize(ex.ensemble())).run_many(Table.from_pylist([{"raw": 1.0}]))
    with pytest.raises(SchemaError, match="missing column"):
        run_plan(optimize(ex.ensemble()), [{"other": 1.0}])


class Counter:
    def __init__(self):
        self.calls = []

    def __call__(self, table):
        self.calls.append(len(table))
        return table["x"] * 10


def test_a_competitive_stage_runs_once_locally():
    count = Counter()
    flow = Flow("race", schema={"x": int})
    flow.map(count, names=["y"], batching=True, high_variance=True)
    plan = optimize(flow)
    assert plan.stages["Counter"].competitive == 3
    assert run_plan(plan, [{"x": 1}, {"x": 2}]).to_pylist() == [{"qid": 0, "y": 10}, {"qid": 1, "y": 20}]
    assert count.calls == [2]


def always(v, conf):
    def alt(row):
        return v, conf

    alt.__name__ = f"alt{v}"
    return alt


def boom(row):
    raise ValueError("alternative crashed")


def anyof_flow(*alternatives, valid=lambda r: r.conf > 0.5):
    flow = Flow("anyof", schema={"x": int})
    flow.anyof(*alternatives, names=["v", "conf"], valid=valid)
    return flow


@pytest.mark.parametrize("rules", RULE_LISTS, ids=str)
def test_first_valid_in_argument_order_even_if_later_ones_are_valid_too(rules):
    flow = anyof_flow(always(1, 0.1), always(2, 0.9), always(3, 0.99))
    assert optimize(flow, rules=rules).stages  # plan builds
    expected = [{"qid": 0, "v": 2, "conf": 0.9}]
    assert flow.run([{"x": 0}]).to_pylist() == expected
    assert run_plan(optimize(flow, rules=rules), [{"x": 0}]).to_pylist() == expected


@pytest.mark.parametrize("rules", RULE_LISTS, ids=str)
def test_a_crashing_alternative_counts_as_invalid(rules):
    flow = anyof_flow(boom, always(2, 0.9))
    assert run_plan(optimize(flow, rules=rules), [{"x": 0}]).to_pylist() == flow.run([{"x": 0}]).to_pylist()


@pytest.mark.parametrize("rules", RULE_LISTS, ids=str)
@pytest.mark.parametrize("alternatives", [(always(1, 0.1), always(2, 0.2)), (boom, boom)], ids=["invalid", "crash"])
def test_no_valid_alternative_fails_the_query_like_flow_run(rules, alternatives):
    flow = anyof_flow(*alternatives)
    with pytest.raises(NoValidResultError):
        flow.run([{"x": 0}])
    with pytest.raises(NoValidResultError, match="no alternative gave a valid result"):
        run_plan(optimize(flow, rules=rules), [{"x": 0}])


def test_choose_head_accepts_rows_of_one_alternative():
    flow = anyof_flow(always(1, 0.1), always(2, 0.9))
    plan = optimize(flow, rules=["competition"])
    bound = BoundStage(plan.stages["anyof(alt1,alt2)"])
    out = BoundStage(plan.stages["anyof(alt1,alt2)[1]"])([Table.from_pylist([{"x": 0}])])
    assert bound.head.accepts(out).tolist() == [True]


@pytest.mark.parametrize("rules", RULE_LISTS, ids=str)
def test_operator_errors_are_the_same_as_flow_run(rules):
    flow = Flow("err", schema={"x": int})
    flow.map(lambda r: r.x + 1, names=["y"]).map(lambda r: 1 // (r.y - 2), names=["z"])
    with pytest.raises(OperatorFailedError) as ref:
        flow.run([{"x": 0}, {"x": 1}])
    with pytest.raises(OperatorFailedError) as got:
        run_plan(optimize(flow, rules=rules), [{"x": 0}, {"x": 1}])
    assert (got.value.operator, got.value.qid) == (ref.value.operator, ref.value.qid) == ("lambda#2", 1)


def test_missing_lookup_keys_fail_like_flow_run():
    flow = ex.recommender()
    rows = [{"request": "u9:home"}]
    with pytest.raises(LookupKeyError):
        flow.run(rows, kvs=ex.RECOMMENDER_STORE)
    with pytest.raises(LookupKeyError, match="'u9'"):
        run_plan(optimize(flow), rows, kvs=ex.RECOMMENDER_STORE)


def test_route_by_key_runs_a_continuation_stage_once_per_key():
    sizes = []

    def score(table):
        sizes.append(len(table))
        return table["v"] * 2

    flow = Flow("route", schema={"k": str})
    flow.lookup(column="k", name="v").map(score, names=["s"], batching=True)
    plan = optimize(flow)
    assert list(plan.stages) == ["lookup(k)+score"]
    rows = [{"k": "a"}, {"k": "b"}, {"k": "a"}, {"k": "c"}]
    store = {"a": 1, "b": 2, "c": 3}
    routed = Interpreter(plan, route_by_key=True).run(rows, kvs=store)
    assert sorted(sizes) == [1, 1, 2]
    assert_same_rows(routed, flow.run(rows, kvs=store), ordered=True)
    assert routed.qid.tolist() == [0, 1, 2, 3]  # run grouped by key, merged back in row order
