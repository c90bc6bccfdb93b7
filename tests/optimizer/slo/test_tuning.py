"""The tuner's re-plans (optimizer/slo/tuning.py): the planner over a new rate from what
runs, the ladder planned with the flow, and which rung runs as traffic moves (time passed in)."""

from __future__ import annotations

import pytest

from flow import Flow
from flow.errors import FlowValueError
from optimizer import optimize
from optimizer.slo import SLO, PlannerOptions, Profile, Shape, StageConfig, plan_for_slo, poisson
from optimizer.slo.sizing import serve_under, with_rung
from optimizer.slo.tuning import RePlanner, Rung, ladder, pinned_profile, replan

# latency(b) = 4 + 1 x b ms, measured at the sizes the profiler uses
LINEAR = {b: [4.0 + b] for b in (1, 2, 4, 8, 16)}


def test_a_replan_for_a_higher_rate_grows_the_batch_not_only_the_replicas():
    profile = Profile({"m": {"cpu": LINEAR}})
    current = {"m": StageConfig(1, 1, "cpu")}  # 200 req/s a replica at batch 1
    result = replan(Shape.chain("m"), profile, SLO(40), 600.0, current)
    # 600 req/s: at batch 1 that is 3 replicas at 100%; batch 4 (8 ms for 4) serves 500 req/s
    # a replica, batch 8 (12 ms) 667: one replica with a bigger batch is enough
    assert result.configs() == {"m": StageConfig(batch_size=8, replicas=1, executor_class="cpu")}
    assert result.tail_ms <= 40 and "batch 1->" in result.stages["m"].reason


def test_a_replan_keeps_each_stage_on_its_class():
    profile = Profile({"m": {"cpu": {1: [10.0]}, "gpu": {1: [2.0]}}})
    options = PlannerOptions(prices={"cpu": 1.0, "gpu": 3.0})
    # on the cpu class a replan adds cpu replicas, though one gpu replica would also do
    result = replan(Shape.chain("m"), profile, SLO(30), 250.0, {"m": StageConfig(1, 1, "cpu")}, options)
    assert result.configs()["m"].executor_class == "cpu" and result.configs()["m"].replicas >= 3
    assert pinned_profile(profile, {"m": StageConfig(1, 1, "gpu")}).classes("m") == ("gpu",)


def test_a_start_on_an_unpriced_class_names_the_stage():
    profile = Profile({"m": {"cpu": LINEAR}})
    with pytest.raises(FlowValueError, match="stage 'm' on 'gpu'"):
        plan_for_slo(Shape.chain("m"), profile, SLO(40), poisson(100, 200), start={"m": StageConfig(1, 1, "gpu")})


def test_the_ladder_re_plans_each_rate_from_the_rung_below_and_stops_where_the_slo_cannot_hold():
    profile = Profile({"m": {"cpu": LINEAR}})
    options = PlannerOptions(max_replicas=2, max_batch=16)
    shape = Shape.chain("m")
    planned = plan_for_slo(shape, profile, SLO(40), poisson(100, 2000), options)
    rungs = ladder(shape, profile, SLO(40), 100.0, planned, options, factors=(2, 4, 8, 64))
    assert [r.rate_rps for r in rungs] == [100.0, 200.0, 400.0, 800.0]  # 6,400 req/s: over 2 x batch 16
    assert rungs[0].configs == planned.configs()
    assert all(r.tail_ms <= 40 for r in rungs)
    # capacity per second grows with the rate: batch x replicas / latency(batch)
    cap = [r.configs["m"].replicas * r.configs["m"].batch_size / (4 + r.configs["m"].batch_size) for r in rungs]
    assert cap == sorted(cap) and cap[-1] * 1000 > 800
    assert Rung.from_dict(rungs[2].to_dict()) == rungs[2]
    with pytest.raises(FlowValueError, match="over 1"):
        ladder(shape, profile, SLO(40), 100.0, planned, options, factors=(0.5,))


def env(rate):
    """A literal envelope: at most 1.5x the rate's mean count in each window (ms -> arrivals)."""
    return {w: int(1.5 * rate * w / 1000) for w in (100.0, 1000.0)}


def rungs(*rates):
    return [Rung(r, {"m": StageConfig(1, 1, "cpu")}, {"m": 20.0}, 10.0, 1.0, env(r)) for r in rates]


def counts(rate):
    """The arrivals now in each window at a steady ``rate`` (req/s)."""
    return {w: int(rate * w / 1000) for w in (100.0, 1000.0)}


def test_the_replanner_goes_up_at_once_and_down_after_15_s_below():
    r = RePlanner(rungs(60, 90, 120, 240))  # 100 ms windows: at most 9, 13, 18, 36 arrivals
    assert r.decide(counts(80), now=0.0) is None  # over the mean rate, within rung 0's envelope
    assert r.decide({100.0: 20, 1000.0: 90}, now=1.0) == 3  # a burst in the last 100 ms: at once
    assert r.decide(counts(1000), now=1.5) is None  # over the top rung: stays on it (the tuner adds replicas)
    for t in range(2, 17):
        assert r.decide(counts(55), now=float(t)) is None, t  # below, but not yet for 15 s
    assert r.decide(counts(55), now=17.0) == 0  # every reading since 2.0 wanted rung 0
    assert r.current == 0


def test_a_rung_without_an_envelope_compares_rates():
    bare = Rung(60.0, {"m": StageConfig(1, 1, "cpu")}, {"m": 20.0}, 10.0, 1.0)
    assert bare.covers({1000.0: 60, 100.0: 6}, (100.0, 1000.0))
    assert not bare.covers({1000.0: 61}, (100.0, 1000.0))


def test_the_replanner_steps_down_to_the_highest_rung_wanted_within_the_window():
    r = RePlanner(rungs(60, 90, 120, 240))
    assert r.decide(counts(230), now=0.0) == 3
    t, got = 0.0, None
    while got is None and t < 30:
        t += 0.5 + 0.0031  # the scaling loop's ticks never land on the window's edge
        got = r.decide(counts(150 if t < 10 else 80), now=t)
    assert got == 2 and 15.0 <= t < 15.6  # 150 req/s was seen within the window: rung 120 covers it
    assert r.decide(counts(80), now=t + 0.5) is None
    assert r.decide(counts(300), now=t + 1.0) == 3


def test_the_ladder_keeps_each_rungs_planning_envelope():
    profile = Profile({"m": {"cpu": LINEAR}})
    shape = Shape.chain("m")
    trace = poisson(100, 2000)
    planned = plan_for_slo(shape, profile, SLO(40), trace)
    low, high = ladder(shape, profile, SLO(40), 100.0, planned, factors=(4,), trace=trace)
    # a Poisson trace's own bursts are in its envelope: 1 s at 100 req/s saw up to ~130
    assert 100 < low.envelope[1000.0] < 160 and 400 < high.envelope[1000.0] < 500
    assert RePlanner([low, high]).want({1000.0: 120, 100.0: 15}) == 0
    assert Rung.from_dict(high.to_dict()) == high


def test_rungs_must_come_in_rate_order():
    with pytest.raises(FlowValueError, match="increasing rate"):
        RePlanner(rungs(90, 60))


def test_serve_under_plans_the_ladder_and_with_rung_applies_one():
    f = Flow("tuned")
    f.map(lambda r: r.x, names=["y"], batching=True)
    plan = optimize(f, rules=["batching"])
    stage = plan.sink
    profile = Profile({stage: {"cpu": LINEAR}})
    served = serve_under(plan, SLO(40), profile=profile, rate_rps=100, ladder=(2, 4))
    rungs = served.slo.rungs()
    assert [r.rate_rps for r in rungs] == [100.0, 200.0, 400.0]
    top = with_rung(served, rungs[-1])
    c = rungs[-1].configs[stage]
    assert (top.stages[stage].batch.max_batch_size, top.stages[stage].replicas) == (c.batch_size, c.replicas)
    assert top.slo.budgets == rungs[-1].budgets and top.slo.rate_rps == 400.0
    assert top.slo.ladder == served.slo.ladder and "re-planned for 400 req/s" in top.slo.reasons[stage]
    with pytest.raises(FlowValueError, match="re-plans"):
        with_rung(plan, rungs[0])


@pytest.mark.parametrize("ladder", [(1.0,), (0.5, 2), ("2",), "23", (True,)])
def test_a_ladder_that_is_not_multiples_above_1_is_refused(ladder):
    with pytest.raises(FlowValueError, match=r"PlannerOptions.ladder must be multiples of the planning rate above 1"):
        PlannerOptions(ladder=ladder)


def test_the_ladder_is_opt_in_and_kept_as_floats():
    assert PlannerOptions().ladder == ()
    assert PlannerOptions(ladder=(2, 4)).ladder == (2.0, 4.0)
