"""simulate(): replaying a recorded trace gives the replica timeline a live loop would."""

from __future__ import annotations

import pytest

from executors.hosts.autoscale import Autoscaler, AutoscalingConfig, SimulationResult, simulate

from .traces import sample, steps


def _two_stage_trace() -> list:
    # "a" doubles to need 4 at t=3 (2 -> 4 at t=4); "b" stays at need 2 on 2
    t = steps("a", [(0, 3, 12), (3, 8, 24)], replicas=2) + steps("b", [(0, 8, 12)], replicas=2)
    return sorted(t, key=lambda x: x[0])


def test_timeline_has_one_point_per_step_per_stage():
    r = simulate(Autoscaler({"a": AutoscalingConfig(), "b": AutoscalingConfig()}), _two_stage_trace())
    assert isinstance(r, SimulationResult)
    assert r.series("a") == ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [2, 2, 2, 2, 4, 4, 4, 4])
    assert r.series("b") == ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [2] * 8)
    assert [(d.time, d.stage, d.from_replicas, d.to_replicas) for d in r.changes()] == [(4.0, "a", 2, 4)]
    assert r.changes("b") == []
    assert (r.replicas_at("a", 3.9), r.replicas_at("a", 4.0), r.replicas_at("a", 100)) == (2, 4, 4)
    assert r.replicas_at("a", -1) is None and r.series("unknown") == ([], [])


def test_a_stage_appears_in_the_timeline_from_its_first_sample():
    t = steps("a", [(0, 4, 12)], replicas=2) + [(2.0, "b", sample(2, 12, 3)), (3.0, "b", sample(3, 12, 3))]
    r = simulate(Autoscaler({"a": AutoscalingConfig(), "b": AutoscalingConfig()}), sorted(t, key=lambda x: x[0]))
    assert r.series("b") == ([2.0, 3.0], [3, 3])


def test_replay_is_deterministic():
    configs = {"a": AutoscalingConfig(), "b": AutoscalingConfig(max_replicas=3)}
    first = simulate(Autoscaler(configs), _two_stage_trace())
    second = simulate(Autoscaler(configs), _two_stage_trace())
    assert first == second


def test_the_documented_example():
    a = Autoscaler({"s": AutoscalingConfig()})
    r = simulate(a, [(float(t), "s", sample(t, 0, 3)) for t in range(20)])
    assert r.series("s")[1][14:17] == [3, 1, 1]


def test_bad_traces_are_rejected():
    a = Autoscaler({"s": AutoscalingConfig()})
    with pytest.raises(ValueError, match=r"must not decrease: trace\[1\] has t=1.0 after 2.0"):
        simulate(a, [(2.0, "s", sample(2, 1, 1)), (1.0, "s", sample(1, 1, 1))])
    with pytest.raises(TypeError, match=r"trace\[0\] must be a \(t, stage, StageMetrics\) tuple, got 3"):
        simulate(a, [3])
    with pytest.raises(TypeError, match="simulate needs an Autoscaler, got None"):
        simulate(None, [])


def test_a_long_trace_is_fast():
    # 1 hour at 1 sample/s for 3 stages (about 40 us per sample): the policy keeps only what
    # its windows need, so the cost per sample does not grow with the trace
    import time

    t = sorted(
        steps("a", [(0, 1800, 12), (1800, 3600, 24)], replicas=2)
        + steps("b", [(0, 3600, 30)], replicas=2, device="gpu")
        + steps("c", [(0, 3600, 5)], replicas=1),
        key=lambda x: x[0],
    )
    start = time.perf_counter()
    r = simulate(Autoscaler({s: AutoscalingConfig() for s in "abc"}), t)
    assert time.perf_counter() - start < 2.0
    assert r.replicas_at("a", 1799) == 2 and r.replicas_at("a", 3599) == 4
