"""Generated flows: every rule alone, and all of them, give flow.run's rows.

For each generated flow (tests/flowgen.py: every operator, random branching, random
inputs and KVS contents) and each rule list, the optimized plan run by the interpreter
must give
- exactly ``flow.run``'s Table for one request (same rows, order, types);
- exactly ``flow.run``'s rows in ``flow.run``'s order when continuation stages run once
  per key group (as a deployment that routes rows by key does), also where racing stages
  feed them;
- for several requests run together (batching stages merge them), each request's own
  ``flow.run`` rows.
Settings are derandomized and database-less so CI runs the same examples every time.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from executors.worker.interpreter import Interpreter
from optimizer import DEFAULT_RULES, OptimizerOptions, optimize
from tests.flowgen import assert_same_rows, flows_and_inputs

RULE_LISTS = {
    "none": [],
    **{name: [name] for name in DEFAULT_RULES},
    "default": list(DEFAULT_RULES),
    "fusion-first": ["fusion", "batching", "placement", "locality", "competition"],
}

SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def check_plan_matches_reference(case, rules) -> Interpreter:
    plan = optimize(case.flow, rules=rules)
    expected = case.flow.run(case.table, kvs=case.store)
    interp = Interpreter(plan)
    got = interp.run(case.table, kvs=case.store)
    assert got.equals(expected), (
        f"rules {rules}: plan result differs from flow.run\nplan:\n{plan.explain()}\n"
        f"got:      {got.to_pylist()}\nexpected: {expected.to_pylist()}"
    )
    routed = Interpreter(plan, route_by_key=True).run(case.table, kvs=case.store)
    # key groups merge back by row position: flow.run's order, row by row
    assert_same_rows(routed, expected, f"rules {rules}, rows routed by key: ", ordered=True)
    result = interp.run_many(list(case.requests), kvs=case.store)
    for i, (req, got_i) in enumerate(zip(case.requests, result.tables())):
        assert_same_rows(got_i, case.flow.run(req, kvs=case.store), f"rules {rules}, batched request {i}: ")
    return interp


@settings(max_examples=200, **SETTINGS)
@given(case=flows_and_inputs())
def test_optimized_plans_match_flow_run(case):
    for rules in RULE_LISTS.values():
        check_plan_matches_reference(case, rules)


@settings(max_examples=40, **SETTINGS)
@given(case=flows_and_inputs(max_rows=10, race_lookups=50))
def test_racing_maps_feeding_key_routed_lookups_match_flow_run(case):
    """Racing stages feeding per-row lookups (continuations), routed by key: flow.run's rows
    in flow.run's order, for the default rules and for fusion first."""
    for rules in (RULE_LISTS["default"], RULE_LISTS["fusion-first"]):
        check_plan_matches_reference(case, rules)


@settings(max_examples=60, **SETTINGS)
@given(case=flows_and_inputs(max_ops=10, max_rows=4, max_requests=6))
def test_batched_requests_match_running_each_alone(case):
    """Many small requests: batching stages really merge them, and nobody notices."""
    interp = Interpreter(optimize(case.flow))
    result = interp.run_many(list(case.requests), kvs=case.store)
    for i, (req, got) in enumerate(zip(case.requests, result.tables())):
        assert_same_rows(got, case.flow.run(req, kvs=case.store), f"batched request {i}: ")
    batching = [s.name for s in interp.plan.stages.values() if s.batch is not None]
    nonempty = sum(1 for r in case.requests if len(r))
    for name in batching:
        if nonempty >= 2 and name in result.stats.calls and max(result.stats.calls[name]) > 1:
            # every merged call carried at most max_batch_size requests
            assert max(result.stats.calls[name]) <= interp.plan.stages[name].batch.max_batch_size
    for name, sizes in result.stats.calls.items():
        if interp.plan.stages[name].batch is None:
            assert set(sizes) == {1}, f"non-batching stage {name!r} merged requests: {sizes}"


@settings(max_examples=40, **SETTINGS)
@given(case=flows_and_inputs())
def test_default_rules_are_a_fixed_point(case):
    once = optimize(case.flow)
    twice = optimize(once)
    assert list(twice.stages.values()) == list(once.stages.values())


@settings(max_examples=40, **SETTINGS)
@given(case=flows_and_inputs(max_rows=10, race_lookups=50))
def test_racing_stages_with_fused_neighbours_match_flow_run(case):
    """Cheap maps and filters fused into racing copies (``fuse_into_race``, on by default)
    give flow.run's rows, alone, routed by key and batched; with it off, the same rows."""
    check_plan_matches_reference(case, list(DEFAULT_RULES))
    plan = optimize(case.flow)
    off = optimize(case.flow, options=OptimizerOptions(fuse_into_race=False))
    raced = [s for s in plan.stages.values() if s.competitive > 1]
    if any(not n.op.high_variance for s in raced for n in s.nodes):
        assert len(plan.stages) < len(off.stages)  # the fused neighbours saved stage boundaries
    expected = case.flow.run(case.table, kvs=case.store)
    assert Interpreter(off).run(case.table, kvs=case.store).equals(expected)


def test_generated_flows_fuse_neighbours_into_racing_stages():
    """The generator does produce racing stages that took in a cheap neighbour, so the
    test above is not vacuous."""
    from hypothesis import find

    case = find(
        flows_and_inputs(max_rows=10, race_lookups=50),
        lambda c: any(
            s.competitive > 1 and any(not n.op.high_variance for n in s.nodes) for s in optimize(c.flow).stages.values()
        ),
        settings=settings(max_examples=200, **SETTINGS),
    )
    assert case is not None
