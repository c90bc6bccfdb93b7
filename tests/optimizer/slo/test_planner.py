"""The planner: literal cases whose cheapest answer is known, and infeasible SLOs."""

from __future__ import annotations

import numpy as np
import pytest

from flow.errors import FlowTypeError, FlowValueError
from optimizer import optimize
from optimizer.slo import SLO, InfeasibleSLOError, PlannerOptions, Profile, Shape, StageConfig, plan_for_slo, simulate
from tests.optimizer import examples as ex


def every(ms: float, n: int = 300) -> np.ndarray:
    """A request every ``ms``: with constant service times the right answer is exact."""
    return np.arange(n) * ms


def test_replicas_grow_until_the_queue_stops_growing():
    # 10 ms per request, one every 4 ms: 2 replicas fall behind, 3 never queue
    result = plan_for_slo(Shape.chain("m"), Profile({"m": {"cpu": {1: [10.0]}}}), SLO(15), every(4.0))
    assert result.configs() == {"m": StageConfig(batch_size=1, replicas=3, executor_class="cpu")}
    assert (result.tail_ms, result.cost_per_s) == (10.0, 3.0)
    assert result.cost == pytest.approx(3.0 * 299 * 4.0 / 1000)  # replica-seconds over the trace
    assert "replicas 1->3 to meet the SLO" in result.stages["m"].reason


def test_a_free_bigger_batch_beats_a_paid_replica():
    # batch 8 costs 12 ms: one replica keeps up with a request every 2 ms (batch 1 needs 5)
    profile = Profile({"m": {"cpu": {1: [10.0], 8: [12.0]}}})
    result = plan_for_slo(Shape.chain("m"), profile, SLO(30), every(2.0))
    assert result.configs()["m"] == StageConfig(batch_size=8, replicas=1)
    assert result.tail_ms <= 30 and "batch 1->8" in result.stages["m"].reason


def test_a_stage_that_cannot_batch_gets_replicas_instead():
    profile = Profile({"m": {"cpu": {1: [10.0], 8: [12.0]}}})
    result = plan_for_slo(Shape.chain("m", batchable=False), profile, SLO(30), every(2.0))
    assert result.configs()["m"] == StageConfig(batch_size=1, replicas=5)


GPU_OR_CPU = Profile({"m": {"cpu": {1: [10.0]}, "gpu": {1: [2.0]}}})
PRICES = PlannerOptions(prices={"cpu": 1.0, "gpu": 3.0})


def test_a_tight_slo_needs_the_dearer_faster_class():
    result = plan_for_slo(Shape.chain("m"), GPU_OR_CPU, SLO(5), every(10.0), PRICES)
    assert result.configs()["m"] == StageConfig(1, 1, "gpu") and result.cost_per_s == 3.0


def test_one_fast_replica_is_cheaper_than_four_slow_ones():
    # cpu needs 4 replicas (cost 4) for a request every 3 ms, gpu one (cost 3): phase 2 finds it
    result = plan_for_slo(Shape.chain("m"), GPU_OR_CPU, SLO(15), every(3.0), PRICES)
    assert result.configs()["m"] == StageConfig(1, 1, "gpu")
    assert "then class cpu->gpu, replicas 4->1 to cut cost" in result.stages["m"].reason


def test_two_slow_replicas_are_cheaper_than_one_fast():
    result = plan_for_slo(Shape.chain("m"), GPU_OR_CPU, SLO(15), every(6.0), PRICES)
    assert result.configs()["m"] == StageConfig(1, 2, "cpu") and result.cost_per_s == 2.0


def test_each_stage_of_a_chain_is_sized_for_its_own_cost():
    profile = Profile({"a": {"cpu": {1: [1.0]}}, "b": {"cpu": {1: [10.0]}}})
    result = plan_for_slo(Shape.chain("a", "b"), profile, SLO(20), every(4.0), PlannerOptions(hop_ms=0.5))
    assert result.configs() == {"a": StageConfig(1, 1, "cpu"), "b": StageConfig(1, 3, "cpu")}
    assert result.tail_ms == 1.0 + 10.0 + 3 * 0.5
    assert result.stages["a"].reason.startswith("the cheapest start")
    # the budget splits the SLO less the path's three hops by each stage's latency
    assert result.stages["a"].budget_ms == pytest.approx((20 - 1.5) * 1 / 11)
    assert result.stages["b"].budget_ms == pytest.approx((20 - 1.5) * 10 / 11)
    assert "b: cpu x3, batch 1" in result.explain()


def test_the_plan_meets_the_slo_when_simulated_again():
    plan = optimize(ex.ensemble())
    profile = Profile({n: {"cpu": {1: [1.0, 1.2, 3.0], 4: [2.0, 2.5, 4.0], 16: [5.0, 6.0, 9.0]}} for n in plan.stages})
    trace = np.cumsum(np.random.default_rng(3).exponential(2.0, 1500))  # ~500 req/s
    result = plan_for_slo(plan, profile, SLO(25), trace)
    from optimizer.slo import pipeline_from_plan

    again = simulate(pipeline_from_plan(plan, profile, result.configs()), trace)
    assert again.p99_ms == result.tail_ms <= 25
    assert set(result.stages) == set(plan.stages)


def test_a_stage_slower_than_the_slo_is_named():
    profile = Profile({"pre": {"cpu": {1: [1.0]}}, "big": {"cpu": {1: [40.0]}, "gpu": {1: [35.0]}}})
    with pytest.raises(
        InfeasibleSLOError,
        match=r"stage 'big' cannot meet the SLO \(p99 <= 30 ms\): its fastest "
        r"run \(batch 1 on \['cpu', 'gpu'\]\) alone takes 35.0 ms",
    ) as e:
        plan_for_slo(
            Shape.chain("pre", "big"), profile, SLO(30), every(100.0), PlannerOptions(prices={"cpu": 1, "gpu": 2})
        )
    assert e.value.stage == "big"


def test_a_path_slower_than_the_slo_names_its_slowest_stage():
    profile = Profile({"a": {"cpu": {1: [12.0]}}, "b": {"cpu": {1: [14.0]}}})
    with pytest.raises(InfeasibleSLOError, match=r"the path a -> b takes 26.0 ms .* slowest stage is 'b'") as e:
        plan_for_slo(Shape.chain("a", "b"), profile, SLO(20), every(100.0))
    assert e.value.stage == "b"


def test_too_few_replicas_allowed_names_the_bottleneck():
    profile = Profile({"a": {"cpu": {1: [1.0]}}, "b": {"cpu": {1: [10.0]}}})
    with pytest.raises(
        InfeasibleSLOError,
        match=r"stage 'b' \(cpu x2, batch 1, utilisation 1.00\) is the "
        r"bottleneck; raise max_replicas \(2\)",
    ) as e:
        plan_for_slo(Shape.chain("a", "b"), profile, SLO(20), every(4.0), PlannerOptions(max_replicas=2))
    assert e.value.stage == "b"


def test_bad_planner_inputs_are_named():
    profile = Profile({"m": {"tpu": {1: [1.0]}}})
    with pytest.raises(FlowValueError, match=r"stage 'm' was profiled on \['tpu'\] but only \['cpu'\] have a price"):
        plan_for_slo(Shape.chain("m"), profile, SLO(10), every(1.0))
    with pytest.raises(FlowValueError, match="price of 'gpu' must be a finite number > 0, got -1"):
        PlannerOptions(prices={"gpu": -1})
    with pytest.raises(FlowValueError, match=r"no profile for stage 'n'"):
        plan_for_slo(Shape.chain("n"), profile, SLO(10), every(1.0))
    with pytest.raises(FlowTypeError, match="plan_for_slo needs an SLO, got float"):
        plan_for_slo(Shape.chain("m"), profile, 10.0, every(1.0))


def test_headroom_plans_within_a_share_of_the_slo_and_reports_the_slo_itself():
    # cpu 10 ms meets an 11 ms SLO exactly; kept 20% free (8.8 ms) only the gpu's 2 ms does
    plain = plan_for_slo(Shape.chain("m"), GPU_OR_CPU, SLO(11), every(10.0), PRICES)
    assert plain.configs()["m"].executor_class == "cpu"
    options = PlannerOptions(prices={"cpu": 1.0, "gpu": 3.0}, headroom=0.2)
    kept = plan_for_slo(Shape.chain("m"), GPU_OR_CPU, SLO(11), every(10.0), options)
    assert kept.configs()["m"] == StageConfig(1, 1, "gpu") and kept.slo == SLO(11)
    with pytest.raises(FlowValueError, match="headroom"):
        PlannerOptions(headroom=0.6)
