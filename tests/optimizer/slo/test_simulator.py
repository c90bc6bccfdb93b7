"""The simulator against closed-form queueing results and hand-checked small cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flow.errors import FlowValueError
from optimizer import INPUT, optimize
from optimizer.slo import (
    Profile,
    SimPipeline,
    SimStage,
    StageConfig,
    exponential,
    fixed,
    linear,
    pipeline_from_plan,
    poisson,
    simulate,
)
from tests.optimizer import examples as ex


def one_stage(service, replicas=1, routing="least_loaded", **kw):
    return SimPipeline((SimStage("s", (INPUT,), service, replicas=replicas, **kw),), "s", routing=routing)


def erlang_c(c: int, a: float) -> float:
    """The probability that an arrival waits in an M/M/c queue with offered load a = lambda/mu."""
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**k / math.factorial(k) for k in range(c)) + top)


def test_md1_mean_wait_matches_pollaczek_khinchine():
    service_ms, rho = 10.0, 0.6
    result = simulate(one_stage(fixed(service_ms)), poisson(rho / service_ms * 1000, 80_000, seed=1), seed=1)
    expected = rho * service_ms / (2 * (1 - rho))  # Wq = rho / (2 mu (1 - rho))
    assert result.stages["s"].mean_wait_ms == pytest.approx(expected, rel=0.03)
    assert result.mean_ms == pytest.approx(expected + service_ms, rel=0.03)
    assert result.stages["s"].utilisation == pytest.approx(rho, rel=0.02)


@pytest.mark.parametrize("c", [1, 4])
def test_mmc_mean_wait_matches_erlang_c(c):
    mean_ms, rho = 10.0, 0.6
    lam = rho * c / mean_ms  # per ms
    result = simulate(
        one_stage(exponential(mean_ms), replicas=c, routing="shared"), poisson(lam * 1000, 80_000, seed=1), seed=1
    )
    expected = erlang_c(c, lam * mean_ms) / (c / mean_ms - lam)
    assert result.stages["s"].mean_wait_ms == pytest.approx(expected, rel=0.05)
    assert result.throughput_rps == pytest.approx(lam * 1000, rel=0.02)


def test_least_loaded_routing_beats_round_robin_and_single_queue_beats_both():
    trace = poisson(350, 20_000, seed=3)
    waits = {
        r: simulate(one_stage(exponential(10.0), replicas=4, routing=r), trace, seed=3).stages["s"].mean_wait_ms
        for r in ("round_robin", "least_loaded", "shared")
    }
    assert waits["shared"] < waits["least_loaded"] < waits["round_robin"]


def test_batches_form_from_the_queue_and_the_wait_window():
    # one request every 1 ms; a call costs 10 ms whatever the batch: batches of up to 4
    trace = np.arange(0.0, 40.0, 1.0)
    no_wait = simulate(one_stage(fixed(10.0), max_batch=4), trace)
    assert no_wait.latencies_ms[0] == 10.0  # the first request runs alone, at once
    assert no_wait.stages["s"].batches == 1 + math.ceil(39 / 4)
    # a 3 ms window: the first batch waits for requests 1-3 and starts at t=3
    windowed = simulate(one_stage(fixed(10.0), max_batch=4, max_wait_ms=3.0), trace)
    assert windowed.latencies_ms[:4].tolist() == [13.0, 12.0, 11.0, 10.0]
    assert windowed.stages["s"].mean_batch == 4.0
    # a window never holds a full batch: with max_batch=1 nothing waits
    assert simulate(one_stage(fixed(10.0), max_wait_ms=3.0), [0.0]).latencies_ms[0] == 10.0


def test_a_late_lone_request_leaves_when_its_window_expires():
    result = simulate(one_stage(linear(1.0, 1.0), max_batch=8, max_wait_ms=5.0), [0.0, 100.0])
    assert result.latencies_ms.tolist() == [7.0, 7.0]  # 5 ms window + 1 + 1*1 ms


def test_hops_and_joins_add_up_on_the_critical_path():
    stages = (
        SimStage("pre", (INPUT,), fixed(1.0)),
        SimStage("a", ("pre",), fixed(5.0)),
        SimStage("b", ("pre",), fixed(8.0)),
        SimStage("join", ("a", "b"), fixed(0.5)),
    )
    result = simulate(SimPipeline(stages, "join", hop_ms=0.25), [0.0, 1000.0])
    # 4 hops: gateway -> pre -> b -> join -> gateway; b is the slower branch
    assert result.latencies_ms.tolist() == [1.0 + 8.0 + 0.5 + 4 * 0.25] * 2


def test_first_input_wins_for_an_anyof_stage():
    stages = (
        SimStage("fast", (INPUT,), fixed(2.0)),
        SimStage("slow", (INPUT,), fixed(9.0)),
        SimStage("choose", ("fast", "slow"), fixed(1.0), wait="first"),
    )
    result = simulate(SimPipeline(stages, "choose"), [0.0, 50.0])
    assert result.latencies_ms.tolist() == [3.0, 3.0]
    assert result.stages["choose"].batches == 2  # the slow answers are dropped, not run again


def test_competitive_replicas_take_the_fastest_of_k():
    # far-apart requests: no queueing, so latency is the minimum of k exponentials (mean / k)
    trace = np.arange(20_000) * 1000.0
    one = simulate(one_stage(exponential(12.0), replicas=3), trace, seed=5)
    race = simulate(one_stage(exponential(12.0), replicas=3, competitive=3), trace, seed=5)
    assert one.mean_ms == pytest.approx(12.0, rel=0.03)
    assert race.mean_ms == pytest.approx(4.0, rel=0.03)
    assert race.stages["s"].batches == 3 * 20_000  # every copy runs


def test_same_seed_same_result():
    pipe = one_stage(exponential(5.0), replicas=2)
    trace = poisson(300, 2000, seed=2)
    assert np.array_equal(simulate(pipe, trace, seed=4).latencies_ms, simulate(pipe, trace, seed=4).latencies_ms)
    assert not np.array_equal(simulate(pipe, trace, seed=4).latencies_ms, simulate(pipe, trace, seed=5).latencies_ms)


def test_pipeline_from_an_optimized_plan():
    plan = optimize(ex.ensemble())
    names = list(plan.stages)
    profile = Profile({n: {"cpu": {1: [1.0], 4: [2.0]}} for n in names})
    configs = {n: StageConfig() for n in names}
    batching = [n for n, s in plan.stages.items() if s.batch is not None]
    configs[batching[0]] = StageConfig(batch_size=4, replicas=2)
    pipe = pipeline_from_plan(plan, profile, configs, hop_ms=0.1)
    assert [s.name for s in pipe.stages] == names and pipe.sink == plan.sink
    assert simulate(pipe, [0.0]).latencies_ms[0] > 0
    unbatched = next(n for n, s in plan.stages.items() if s.batch is None)
    with pytest.raises(FlowValueError, match=f"stage '{unbatched}' cannot batch"):
        pipeline_from_plan(plan, profile, {**configs, unbatched: StageConfig(batch_size=2)})
    with pytest.raises(FlowValueError, match=r"no StageConfig for stage\(s\)"):
        pipeline_from_plan(plan, profile, {})


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: SimStage("s", (INPUT,), fixed(1.0), replicas=2, competitive=3),
            "competitive=3 needs as many replicas",
        ),
        (
            lambda: SimPipeline((SimStage("s", ("t",), fixed(1.0)),), "s"),
            "stage 's' reads 't', which is not an earlier stage",
        ),
        (lambda: SimPipeline((SimStage("s", (INPUT,), fixed(1.0)),), "s", routing="random"), "routing='random'"),
        (lambda: simulate(one_stage(fixed(1.0)), [3.0, 1.0]), r"must be sorted: 3.0 comes before 1.0 \(index 1\)"),
        (lambda: simulate(one_stage(fixed(1.0)), []), "non-empty"),
    ],
)
def test_bad_pipelines_and_traces_are_named(build, message):
    with pytest.raises(FlowValueError, match=message):
        build()


def test_measured_hop_times_are_drawn_per_hop():
    from optimizer.plan import INPUT
    from optimizer.slo import SimPipeline, SimStage, fixed, poisson, simulate

    pipe = SimPipeline((SimStage("m", (INPUT,), fixed(0.0), replicas=4),), "m", hop_samples=(1.0, 3.0))
    r = simulate(pipe, poisson(10, 4000, seed=2), seed=5)
    # two hops (in, back), each 1 or 3 ms: 2, 4 or 6 ms end to end, 4 on average
    assert set(np.unique(np.round(r.latencies_ms, 6))) == {2.0, 4.0, 6.0}
    assert r.mean_ms == pytest.approx(4.0, rel=0.05)


def test_hop_per_request_uses_one_draw_for_all_of_a_requests_hops():
    pipe = SimPipeline(
        (SimStage("m", (INPUT,), fixed(0.0), replicas=4),), "m", hop_samples=(1.0, 3.0), hop_per_request=True
    )
    r = simulate(pipe, poisson(10, 4000, seed=2), seed=5)
    # both hops of a request draw alike: 2 or 6 ms, never the mixed 4
    assert set(np.unique(np.round(r.latencies_ms, 6))) == {2.0, 6.0}


def chain_ab(routing="gateway", placement=None):
    return SimPipeline(
        (
            SimStage("a", (INPUT,), fixed(1.0)),
            SimStage("b", ("a",), fixed(10.0), replicas=2),
        ),
        "b",
        hop_ms=0.5,
        routing=routing,
        placement=placement,
    )


def test_gateway_routing_spreads_over_replicas_on_executors_of_their_own():
    # 10 ms stage, 2 replicas, 140 req/s: utilisation 0.7 per replica when both are used
    trace = poisson(140, 20_000, seed=4)
    alone = simulate(chain_ab(), trace, seed=1)
    assert alone.stages["b"].utilisation == pytest.approx(0.7, rel=0.05)
    assert alone.throughput_rps == pytest.approx(140, rel=0.05)


def test_gateway_routing_balances_a_stage_on_an_executor_every_request_uses():
    # b's second replica shares executor e0 with a, which every request uses. The dispatcher
    # balances b's replicas on b's own requests in flight, so that replica takes its share
    # and b waits as long as with the replicas apart (ranking by the executor's requests
    # alone, the old rule, starved it: b's wait was over 3x)
    trace = poisson(140, 20_000, seed=4)
    apart = simulate(chain_ab(placement={"a": ("e0",), "b": ("e1", "e2")}), trace, seed=1)
    shared = simulate(chain_ab(placement={"a": ("e0",), "b": ("e1", "e0")}), trace, seed=1)
    per_replica = simulate(chain_ab(routing="least_loaded"), trace, seed=1)
    assert shared.stages["b"].mean_wait_ms == pytest.approx(apart.stages["b"].mean_wait_ms, rel=0.25)
    assert apart.stages["b"].mean_wait_ms == pytest.approx(per_replica.stages["b"].mean_wait_ms, rel=0.5)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"placement": {"a": ("e0",), "b": ("e1",)}}, r"stage 'b': placement must name one executor per replica \(2\)"),
        ({"placement": {"a": ("e0",), "b": ("e1", "e1")}}, "two replicas on one executor"),
        (
            {"placement": {"a": ("e0",), "b": ("e1", "e2")}, "routing": "least_loaded"},
            "only used by routing='gateway'",
        ),
    ],
)
def test_bad_placements_are_named(kw, message):
    with pytest.raises(FlowValueError, match=message):
        chain_ab(**kw)


@pytest.mark.parametrize("routing", ["least_loaded", "shared", "gateway"])
def test_one_replica_with_worker_threads_is_an_mmc_queue(routing):
    # a stage that does not batch runs on the executor's worker pool: one replica, 4 threads
    c, mean_ms, rho = 4, 10.0, 0.6
    lam = rho * c / mean_ms
    result = simulate(
        one_stage(exponential(mean_ms), threads=c, routing=routing), poisson(lam * 1000, 80_000, seed=1), seed=1
    )
    expected = erlang_c(c, lam * mean_ms) / (c / mean_ms - lam)
    assert result.stages["s"].mean_wait_ms == pytest.approx(expected, rel=0.05)
    assert result.stages["s"].utilisation == pytest.approx(rho, rel=0.03)


def test_stages_that_do_not_batch_get_the_executors_threads():
    from optimizer.slo import Shape, StageShape

    shape = Shape((StageShape("pre", (INPUT,), batchable=False), StageShape("m", ("pre",))), "m")
    profile = Profile({"pre": {"cpu": {1: [1.0]}}, "m": {"cpu": {1: [1.0], 4: [2.0]}}})
    pipe = shape.pipeline(profile, {"pre": StageConfig(1, 2), "m": StageConfig(4, 1)}, threads=4)
    assert [(s.name, s.threads) for s in pipe.stages] == [("pre", 4), ("m", 1)]


def aimd_stage(budget_ms=20.0, **kw):
    from optimizer.slo.aimd import AIMDConfig

    return SimStage("s", (INPUT,), linear(2.0, 0.5), max_batch=64, aimd=AIMDConfig(budget_ms, **kw))


@pytest.mark.parametrize(
    ("a", "c", "gap_ms", "cap", "waits"),
    [(2.0, 0.5, 2.0, 36, False), (0.4, 0.05, 0.8, 64, True)],
    ids=["busy", "cheap-with-window"],
)
def test_aimd_stage_batches_as_the_runtime_loop_does(a, c, gap_ms, cap, waits):
    """The simulator's AIMD replica against the runtime's batcher loop written out on a
    deterministic clock (tests/optimizer/slo/test_aimd.py ``run_open``), one request every
    ``gap_ms``: the same batches under the same caps. Busy (2 + 0.5 b ms every 2 ms) the
    window stays shut; cheap (0.4 + 0.05 b ms every 0.8 ms) a lone request waits."""
    from optimizer.slo import AIMDBatcher
    from optimizer.slo.aimd import AIMDConfig
    from tests.optimizer.slo.test_aimd import Clock, run_open

    clock = Clock()
    n = 1500
    batcher = AIMDBatcher(budget_ms=20, max_batch=64, clock=clock)
    seen = run_open(batcher, clock, rate_per_ms=1 / gap_ms, ms=n * gap_ms, lat=lambda b: a + c * b)
    stage = SimStage("s", (INPUT,), linear(a, c), max_batch=64, aimd=AIMDConfig(20.0, max_batch=64))
    stats = simulate(SimPipeline((stage,), "s"), np.arange(n) * gap_ms).stages["s"]
    # a window is the time the next arrivals take, so on an even trace they land on its
    # end: ties, which the two clocks may break apart (885 batches against 880)
    rel = 0.01 if waits else 1e-6
    assert stats.batches == pytest.approx(len(seen), rel=rel)
    assert stats.mean_batch == pytest.approx(np.mean([b for _, b, _ in seen]), rel=rel)
    assert stats.mean_cap == pytest.approx(np.mean([cap for cap, _, _ in seen]), rel=rel)
    assert any(window > 0 for _, _, window in seen) is waits
    assert seen[-1][0] == cap  # the cap found the largest batch within budget (or its max)


def test_aimd_keeps_up_where_a_small_fixed_cap_falls_behind():
    """1.2 requests/ms against 2 + 0.5 b ms: a cap of 2 serves 0.67/ms and its queue grows
    without end; AIMD (from 1) grows its batches to what the rate needs, within budget."""
    trace = poisson(1200, 6000, seed=3)
    capped = simulate(one_stage(linear(2.0, 0.5), max_batch=2), trace, seed=1)
    adaptive = simulate(SimPipeline((aimd_stage(),), "s"), trace, seed=1)
    assert capped.p99_ms > 1000
    assert adaptive.p99_ms < 25 and adaptive.throughput_rps == pytest.approx(1200, rel=0.05)
    stats = adaptive.stages["s"]
    assert 4 < stats.mean_batch < 10 and stats.mean_cap > 30


def test_aimd_delay_window_in_the_simulation():
    """A cheap stage (0.4 + 0.05 b ms) at 1.2 requests/ms, 10 ms per batch: a batch of one
    keeps the replica 54% busy, so a lone request waits for one more (0.83 ms, inside the
    default window of 10% of the budget): fewer, bigger batches (less busy), each request
    later by about the window. Without the window (max_delay_ms=0) every request runs at
    once."""
    from optimizer.slo.aimd import AIMDConfig

    def run(**kw):
        stage = SimStage("s", (INPUT,), linear(0.4, 0.05), max_batch=64, aimd=AIMDConfig(10.0, **kw))
        return simulate(SimPipeline((stage,), "s"), poisson(1200, 5000, seed=5), seed=1)

    windowed, eager = run(), run(max_delay_ms=0)
    w, e = windowed.stages["s"], eager.stages["s"]
    assert w.mean_batch > e.mean_batch + 0.25
    assert w.utilisation < e.utilisation - 0.05
    assert eager.p50_ms < windowed.p50_ms < eager.p50_ms + 1.0
    assert windowed.p99_ms < eager.p99_ms + 1.0


@pytest.mark.parametrize("rate", [300, 600])
def test_aimd_delay_window_costs_a_busy_stage_nothing(rate):
    """A stage whose batch of one is 84% busy at 300 requests/s (2.5 + 0.3 b ms, as the torch
    stage looked over HTTP) and one that needs batches at 600: the window stays shut and
    the default AIMD is the eager one. (The first rule waited for the batch the rate needs:
    here p99 6.7 against 6.3 ms at 300/s; over HTTP, on a busy machine, it ran p99 past
    the budget: benchmarks/README.md "AIMD over HTTP".)"""
    from optimizer.slo.aimd import AIMDConfig

    def run(**kw):
        stage = SimStage("s", (INPUT,), linear(2.5, 0.3), max_batch=64, aimd=AIMDConfig(10.0, **kw))
        return simulate(SimPipeline((stage,), "s"), poisson(rate, 5000, seed=5), seed=1)

    default, eager = run(), run(max_delay_ms=0)
    assert default.p99_ms == pytest.approx(eager.p99_ms)
    assert default.stages["s"].mean_batch == pytest.approx(eager.stages["s"].mean_batch)
    assert default.p99_ms < 20


def test_pipeline_from_a_plan_served_under_an_slo_batches_with_aimd():
    from dataclasses import replace

    from optimizer.slo import SLO, ServingSLO
    from optimizer.slo.aimd import BATCH_SHARE, AIMDConfig

    plan = optimize(ex.ensemble())
    names = list(plan.stages)
    batching = [n for n, s in plan.stages.items() if s.batch is not None]
    profile = Profile({n: {"cpu": {1: [1.0], 4: [2.0]}} for n in names})
    configs = {n: StageConfig(batch_size=4 if n in batching else 1) for n in names}
    served = replace(plan, slo=ServingSLO(SLO(40), budgets={n: 10.0 for n in names}, configs=configs))
    pipe = pipeline_from_plan(served, profile, configs)
    for s in pipe.stages:
        assert s.aimd == (AIMDConfig(10.0 * BATCH_SHARE, start=4, max_batch=8) if s.name in batching else None)
    assert all(s.aimd is None for s in pipeline_from_plan(served, profile, configs, adapt=False).stages)
    assert all(s.aimd is None for s in pipeline_from_plan(plan, profile, configs).stages)
    assert simulate(pipe, poisson(100, 200, seed=1)).throughput_rps > 0
    with pytest.raises(FlowValueError, match="AIMD batches per replica; routing='shared'"):
        simulate(SimPipeline((aimd_stage(),), "s", routing="shared"), [0.0])
    with pytest.raises(FlowValueError, match="an AIMD stage runs one batch at a time, got threads=4"):
        SimStage("s", (INPUT,), fixed(1.0), threads=4, aimd=AIMDConfig(10.0))
