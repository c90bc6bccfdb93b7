"""The scaling policy on recorded metric traces; every expectation is computed by hand.

See traces.py for the load -> need table the comments below use (service time 100 ms,
so load = rate / 10 busy replicas; up need = ceil(load / 0.7), down need = ceil(load / 0.63)).
"""

from __future__ import annotations

import random

import pytest

from executors.hosts.autoscale import Autoscaler, AutoscalingConfig, StageMetrics, simulate

from .traces import NAIVE, changes, run, sample, steps, trace

D = AutoscalingConfig()


# -- step up ---------------------------------------------------------------------------------------


def test_step_up_reacts_within_upscale_delay_plus_one_interval():
    # load 1.2 on 2 replicas (need 2), doubling to 2.4 (need 4) at t=30, samples every 1 s.
    # The need of 4 holds through [30, 31] at t=31: 2 -> 4 (within the doubling step).
    r = run(steps("s", [(0, 30, 12), (30, 60, 24)], replicas=2))
    assert changes(r, "s") == [(31.0, 2, 4)]
    first = r.decisions[0]
    assert first.time <= 30 + D.upscale_delay_s + 1.0
    assert first.direction == "up" and first.drain == 0 and first.device == "cpu"
    assert first.reason.startswith("scale up: need 4 for 1 s (24 req/s x 100 ms = 2.40 busy replicas")


def test_step_up_at_fast_sampling_still_within_delay_plus_one_interval():
    # samples every 0.25 s; the load doubles at t=10.1, first seen at 10.25. Smoothing (1 s)
    # averages 4 samples: at 10.25 (3 x 1.2 + 2.4) / 4 = 1.5 -> need 3, 10.5: 1.8 -> 3,
    # 10.75: 2.1 -> 3 (2.1 / 0.7 = 3 exactly), from 11.0 on 2.4 -> 4. At 11.25 the window
    # [10.25, 11.25] has needs 3,3,3,4,4: scale 2 -> 3; cooldown 2 s, then 3 -> 4 at 13.25.
    r = run(steps("s", [(0, 10.25, 12), (10.25, 20, 24)], replicas=2, dt=0.25))
    assert changes(r, "s") == [(11.25, 2, 3), (13.25, 3, 4)]
    assert r.decisions[0].time <= 10.1 + 1.0 + 0.25


def test_step_up_with_a_longer_smoothing_window_takes_two_steps():
    # smoothing 2 s: at t=30 the mean of {29, 30} is 1.8 -> need 3 (raw says 4; up uses the
    # lower); at 31 both say 4. Window [30, 31] -> min 3: 2 -> 3 at 31. Up cooldown 2 s: 3 -> 4 at 33.
    r = run(steps("s", [(0, 30, 12), (30, 60, 24)], replicas=2), AutoscalingConfig(smoothing_window_s=2))
    assert changes(r, "s") == [(31.0, 2, 3), (33.0, 3, 4)]


def test_queue_pressure_alone_scales_up():
    # queue only: need = ceil(queue / 2). Queue 3 -> 2 (down: 3 / 1.8 -> 2): steady on 2.
    # Queue 12 from t=10 -> 6: at 11, 2 -> 4 (doubling limit), at 13 (cooldown), 4 -> 6.
    cfg = AutoscalingConfig(target_utilisation=None)
    t = steps("s", [(0, 10, 5)], replicas=2, queue_length=3) + steps("s", [(10, 30, 5)], replicas=2, queue_length=12)
    r = run(t, cfg)
    assert changes(r, "s") == [(11.0, 2, 4), (13.0, 4, 6)]
    assert "limited to x2 per step" in r.decisions[0].reason
    assert "queue 12, target 2/replica" in r.decisions[0].reason


def test_measured_utilisation_counts_even_when_rates_say_less():
    # service time not known yet (0 ms) but the replicas report 90 % busy: 3 x 0.9 = 2.7 busy
    # replicas -> ceil(2.7 / 0.7) = 4. Up at t=1 (window [0, 1]): 3 -> 4.
    t = trace("s", [(i, 50, 3, {"service_time_ms": 0.0, "utilisation": 0.9}) for i in range(5)])
    assert changes(run(t), "s") == [(1.0, 3, 4)]


def test_a_load_exactly_at_the_target_needs_no_extra_replica():
    # 42 req/s x 100 ms = 4.2 busy replicas = 6 x 0.7 exactly (in floats 4.2 / 0.7 is a hair
    # above 6): need 6, so 6 replicas hold; 43 req/s (4.3 / 0.7 = 6.14) needs 7.
    assert changes(run(steps("s", [(0, 30, 42)], replicas=6)), "s") == []
    assert changes(run(steps("s", [(0, 5, 43)], replicas=6)), "s") == [(1.0, 6, 7)]


# -- step down -------------------------------------------------------------------------------------


def test_step_down_waits_downscale_delay_then_drains():
    # load 2.4 on 4 replicas (need 4) until t=40, then 0.6 (need 1). The lower need holds
    # through [40, t] from t=55 = 40 + 15 on; not at 54 (window starts with t=39's need of 4).
    r = run(steps("s", [(0, 40, 24), (40, 80, 6)], replicas=4))
    assert changes(r, "s") == [(55.0, 4, 1)]
    d = r.decisions[0]
    assert d.direction == "down" and d.drain == 3
    assert "need at most 1 for 15 s" in d.reason
    assert "drain 3 replica(s) first: stop routing to them, remove each once its in-flight count is 0" in d.reason
    assert r.replicas_at("s", 54) == 4 and r.replicas_at("s", 55) == 1


def test_step_down_with_smoothing_goes_down_in_two_steps():
    # smoothing 2 s: at 40 the mean of {39, 40} is 1.5 -> down need ceil(1.5 / 0.63) = 3 (down
    # uses the higher of raw and smoothed); from 41 on 1. At 55 window [40, 55]: max 3 -> 4 -> 3.
    # Down cooldown 15 s: 3 -> 1 at 70.
    r = run(steps("s", [(0, 40, 24), (40, 90, 6)], replicas=4), AutoscalingConfig(smoothing_window_s=2))
    assert changes(r, "s") == [(55.0, 4, 3), (70.0, 3, 1)]


def test_a_dip_shorter_than_downscale_delay_does_not_scale_down():
    # 10 s of low load inside a high level: the window [t-15, t] always holds a high sample
    r = run(steps("s", [(0, 40, 24), (40, 50, 6), (50, 120, 24)], replicas=4))
    assert changes(r, "s") == []


# -- spikes ------------------------------------------------------------------------------------------


def test_one_sample_spike_does_not_scale():
    # load 1.2 on 2; one sample at t=20 of load 6 (need 9). At t=21 the window [20, 21] holds
    # 9 and 2: not all above 2. Observed for 1 s (20 -> 21), not longer than the delay.
    r = run(steps("s", [(0, 20, 12), (20, 21, 60), (21, 60, 12)], replicas=2))
    assert changes(r, "s") == []


def test_sub_second_spike_at_fast_sampling_does_not_scale():
    # samples every 0.25 s; high from 20.0 to 20.75, normal again at 21.0: observed 1 s.
    r = run(steps("s", [(0, 20, 12), (20, 21, 60), (21, 40, 12)], replicas=2, dt=0.25))
    assert changes(r, "s") == []


def test_spike_longer_than_the_delay_scales_up_then_back_down():
    # two samples of need 9 (t=20, 21): at 21 window [20, 21] all 9: 2 -> 4 (doubling).
    # From 22 on need 2: the down window [22, 37] is all below 4 at 37 (cooldown: 16 s >= 15).
    r = run(steps("s", [(0, 20, 12), (20, 22, 60), (22, 60, 12)], replicas=2))
    assert changes(r, "s") == [(21.0, 2, 4), (37.0, 4, 2)]


def test_spike_observed_for_just_over_the_delay_scales():
    # 0.25 s samples, high from 20.0 to 21.0 inclusive (observed 1.25 s). Needs with 1 s smoothing:
    # 20.0: min(9, ceil(2.4 / 0.7)=4) = 4; 20.25: min(9, 6) = 6; then 8, 9, 9. At 21.0 the
    # window [20, 21] is all above 2, min 4: 2 -> 4.
    r = run(steps("s", [(0, 20, 12), (20, 21.25, 60), (21.25, 30, 12)], replicas=2, dt=0.25))
    assert changes(r, "s")[0] == (21.0, 2, 4)


# -- noise -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_random_noise_within_the_hysteresis_band_never_changes(seed):
    # load 1.7 +- 20 % in [1.36, 2.04] on 3 replicas: up need <= ceil(2.04 / 0.7) = 3, down need
    # >= ceil(1.36 / 0.63) = 3, whatever the noise (a mean stays in the same range): 0 changes.
    rng = random.Random(seed)
    points = [(t, 17 * (1 + rng.uniform(-0.2, 0.2)), 3) for t in range(600)]
    assert changes(run(trace("s", points)), "s") == []


def _alternating(level: float, n: int, replicas: int) -> list:
    return trace("s", [(t, level * (1.2 if t % 2 == 0 else 0.8), replicas) for t in range(n)])


def test_alternating_noise_does_not_oscillate():
    # load 2.4 +- 20 % on 4: 2.88 (need 5) and 1.92 (up need 3, down need 4), alternating. No
    # two consecutive samples ask for more, no 15 s all ask for fewer: 0 changes in 60 s.
    assert changes(run(_alternating(24, 60, 4)), "s") == []


def test_same_noise_makes_a_naive_policy_flap():
    # control for the test above: with no delays, cooldowns, smoothing or hysteresis, 2.88 ->
    # 5 and 1.92 -> ceil(1.92 / 0.7) = 3 flip the count at every one of the 60 samples.
    r = run(_alternating(24, 60, 4), NAIVE)
    assert changes(r, "s")[:3] == [(0.0, 4, 5), (1.0, 5, 3), (2.0, 3, 5)]
    assert len(r.decisions) == 60


def test_hysteresis_alone_stops_flapping_between_two_counts():
    # no delays, cooldowns or smoothing; load alternates 2.9 (up need 5) and 2.6 (up need 4,
    # down need ceil(2.6 / 0.63) = 5). 4 -> 5 at t=0, then 5 holds. Without hysteresis the
    # 2.6 samples would take it back to 4 every other second.
    cfg = AutoscalingConfig(
        upscale_delay_s=0, downscale_delay_s=0, upscale_cooldown_s=0, downscale_cooldown_s=0, smoothing_window_s=0
    )
    t = trace("s", [(i, 29 if i % 2 == 0 else 26, 4) for i in range(40)])
    assert changes(run(t, cfg), "s") == [(0.0, 4, 5)]
    assert len(run(t, NAIVE).decisions) == 40


@pytest.mark.parametrize("seed", range(8))
def test_random_noise_changes_are_rare_and_never_flap(seed):
    # near a threshold (2.4 +- 20 % on 4) noise may move the count; the cooldowns still bound it:
    # a scale-down comes >= 15 s after any change, a scale-up >= 2 s; never outside [1, 8].
    rng = random.Random(seed)
    level = rng.choice([14, 21, 24, 28, 35])
    points = [(t, level * (1 + rng.uniform(-0.2, 0.2)), 4) for t in range(300)]
    r = run(trace("s", points))
    last = None
    for d in r.decisions:
        assert 1 <= d.to_replicas <= 8
        if last is not None:
            gap = d.time - last.time
            assert gap >= (15 if d.direction == "down" else 2), (last, d)
        last = d
    assert len(r.decisions) <= 300 / 15 + 1


# -- clamps ------------------------------------------------------------------------------------------


def test_max_clamp_and_doubling_steps():
    # load 100 (need 143) from 1 replica: 1 -> 2 at t=1, 2 -> 4 at 3, 4 -> 8 at 5 (cooldown 2 s), then held.
    a = Autoscaler({"s": AutoscalingConfig()})
    r = simulate(a, steps("s", [(0, 20, 1000)], replicas=1))
    assert changes(r, "s") == [(1.0, 1, 2), (3.0, 2, 4), (5.0, 4, 8)]
    assert "max_replicas 8" in r.decisions[-1].reason
    assert a.status()["s"].reason == "holding at max_replicas 8 (need 143)"


def test_max_step_up_one_adds_one_replica_per_step():
    r = run(steps("s", [(0, 8, 1000)], replicas=1), AutoscalingConfig(max_step_up=1))
    assert changes(r, "s") == [(1.0, 1, 2), (3.0, 2, 3), (5.0, 3, 4), (7.0, 4, 5)]


@pytest.mark.parametrize(
    "min_replicas, inflight, expected",
    [
        (2, 0, 2),  # no load: down to min_replicas
        (0, 0, 0),  # scale to zero allowed
        (0, 1, 1),  # ... but not while a request is still running
    ],
)
def test_min_clamp(min_replicas, inflight, expected):
    # no arrivals from t=0 on 6 replicas: the window [0, 15] is complete at t=15
    r = run(steps("s", [(0, 30, 0)], replicas=6, inflight=inflight), AutoscalingConfig(min_replicas=min_replicas))
    assert changes(r, "s") == [(15.0, 6, expected)]


def test_a_count_outside_the_bounds_is_clamped_at_once():
    r = run(steps("s", [(0, 3, 12)], replicas=10))  # need 2, but first fix max_replicas 8
    assert changes(r, "s")[0] == (0.0, 10, 8)
    assert r.decisions[0].drain == 2 and r.decisions[0].reason.startswith("above max_replicas 8; drain 2")
    r = run(steps("s", [(0, 3, 0)], replicas=0), AutoscalingConfig(min_replicas=2))
    assert changes(r, "s") == [(0.0, 0, 2)]
    assert r.decisions[0].reason == "below min_replicas 2"


# -- cooldowns ---------------------------------------------------------------------------------------


def test_upscale_cooldown_spaces_the_steps():
    r = run(steps("s", [(0, 15, 1000)], replicas=1), AutoscalingConfig(upscale_cooldown_s=5))
    assert changes(r, "s") == [(1.0, 1, 2), (6.0, 2, 4), (11.0, 4, 8)]


def test_downscale_cooldown_after_a_scale_up():
    # down delay 0, down cooldown 15: load 2.4 at t=0,1 (1 -> 2 at t=1), then 0.6 (need 1)
    # from t=2. The down is due at 2 but waits for the cooldown: 2 -> 1 at 16 = 1 + 15.
    cfg = AutoscalingConfig(downscale_delay_s=0)
    a = Autoscaler({"s": cfg})
    r = simulate(a, steps("s", [(0, 2, 24), (2, 10, 6)], replicas=1))
    assert changes(r, "s") == [(1.0, 1, 2)]
    assert a.status()["s"].reason == "holding: need 1, scale-down cooldown (8 s of 15 s since the last change)"
    r = run(steps("s", [(0, 2, 24), (2, 30, 6)], replicas=1), cfg)
    assert changes(r, "s") == [(1.0, 1, 2), (16.0, 2, 1)]


def test_upscale_cooldown_after_a_scale_down():
    # no down delay/cooldown: 4 -> 1 at t=0 (need 1); high load from t=1 (need 4) is due at 2
    # but the up cooldown of 5 s holds it until 5; the next step (2 -> 4) until 10.
    cfg = AutoscalingConfig(downscale_delay_s=0, downscale_cooldown_s=0, upscale_cooldown_s=5)
    r = run(steps("s", [(0, 1, 6), (1, 12, 24)], replicas=4), cfg)
    assert changes(r, "s") == [(0.0, 4, 1), (5.0, 1, 2), (10.0, 2, 4)]


# -- device classes ----------------------------------------------------------------------------------


def test_cpu_and_gpu_stages_scale_independently():
    # pre (cpu) stays at load 1.2 on 2; net (gpu) doubles 1.2 -> 2.4 at t=10: only net moves.
    cfgs = {"pre": AutoscalingConfig(max_replicas=16), "net": AutoscalingConfig(max_replicas=4)}
    t = sorted(
        steps("pre", [(0, 40, 12)], replicas=2) + steps("net", [(0, 10, 12), (10, 40, 24)], replicas=2, device="gpu"),
        key=lambda x: x[0],
    )
    r = run(t, configs=cfgs)
    assert changes(r) == [(11.0, "net", 2, 4)]
    assert r.decisions[0].device == "gpu" and str(r.decisions[0]).startswith("stage 'net' (gpu): 2 -> 4 replicas")


def test_gpu_capacity_goes_to_the_most_short_stage_and_does_not_limit_cpu():
    # gpu capacity 3. net_a and net_b (gpu) on 1 each need 4 (ratio 4, tie -> name order);
    # pre (cpu) on 1 needs ceil(5 / 0.7) = 8. At t=1: 1 gpu slot free -> net_a 1 -> 2, net_b
    # waits; pre doubles 1 -> 2 -> 4 -> 8. At t=10 net_a's load drops to 0.6 (need 1): at 25
    # it drains to 1 and, in the same round, the freed slot goes to net_b: 1 -> 2.
    t = sorted(
        steps("net_a", [(0, 10, 24), (10, 30, 6)], replicas=1, device="gpu")
        + steps("net_b", [(0, 30, 24)], replicas=1, device="gpu")
        + steps("pre", [(0, 30, 50)], replicas=1),
        key=lambda x: x[0],
    )
    a = Autoscaler({s: AutoscalingConfig() for s in ("net_a", "net_b", "pre")}, capacity={"gpu": 3})
    r = simulate(a, [x for x in t if x[0] < 20])
    assert changes(r) == [(1.0, "net_a", 1, 2), (1.0, "pre", 1, 2), (3.0, "pre", 2, 4), (5.0, "pre", 4, 8)]
    assert "waiting for gpu capacity (3 of 3 replicas in use)" in a.status()["net_b"].reason
    r = simulate(a, [x for x in t if x[0] >= 20])
    assert changes(r) == [(25.0, "net_a", 2, 1), (25.0, "net_b", 1, 2)]


def test_gpu_capacity_goes_first_to_the_stage_most_short_of_replicas():
    # capacity 3, 1 free. "a" on 1 needs ceil(1.2 / 0.7) = 2 (ratio 2), "b" on 1 needs 4 (ratio
    # 4): b gets the slot although a comes first by name.
    t = sorted(
        steps("a", [(0, 5, 12)], replicas=1, device="gpu") + steps("b", [(0, 5, 24)], replicas=1, device="gpu"),
        key=lambda x: x[0],
    )
    r = run(t, configs={"a": AutoscalingConfig(), "b": AutoscalingConfig()}, capacity={"gpu": 3})
    assert changes(r) == [(1.0, "b", 1, 2)]


def test_a_stage_that_moves_to_the_other_class_starts_over():
    # gpu on 2 at load 2.4 (need 4) for t=0..9: 2 -> 4 at 1. From t=10 it reports cpu on 3:
    # target 3, history dropped, so the next up (need 4) needs [10, 11]: 3 -> 4 at 11.
    t = steps("s", [(0, 10, 24)], replicas=2, device="gpu") + steps("s", [(10, 20, 24)], replicas=3)
    r = run(t)
    assert [(d.time, d.device, d.from_replicas, d.to_replicas) for d in r.decisions] == [
        (1.0, "gpu", 2, 4),
        (11.0, "cpu", 3, 4),
    ]


# -- in-flight work and draining ---------------------------------------------------------------------


def _drain_trace(draining_until: float) -> list:
    # load 2.4 (down need 4) on 6 until t=16; then load 0.6 (need 1) on 4 active replicas,
    # 2 of them draining until `draining_until`
    t = steps("s", [(0, 16, 24)], replicas=6)
    t += [(float(i), "s", sample(i, 6, 4, draining=2 if i < draining_until else 0)) for i in range(16, 60)]
    return t


def test_no_second_scale_down_while_replicas_are_draining():
    # down cooldown 0 to isolate the drain rule. 6 -> 4 at 15 (window [0, 15]). The lower need
    # (1) fills the window [16, t] from t=31, but 2 replicas drain until t=40: 4 -> 1 at 40.
    cfg = AutoscalingConfig(downscale_cooldown_s=0)
    r = run(_drain_trace(40), cfg)
    assert changes(r, "s") == [(15.0, 6, 4), (40.0, 4, 1)]
    a = Autoscaler({"s": cfg})
    simulate(a, [x for x in _drain_trace(40) if x[0] <= 35])
    assert a.status()["s"].reason == (
        "holding: need 1, waiting for 2 draining replica(s) to finish their in-flight requests"
    )
    assert a.status()["s"].draining == 2


def test_without_draining_the_second_scale_down_comes_at_once():
    # control for the test above: nothing draining -> 4 -> 1 as soon as the window is full (31)
    assert changes(run(_drain_trace(0), AutoscalingConfig(downscale_cooldown_s=0)), "s") == [(15.0, 6, 4), (31.0, 4, 1)]


def test_last_replica_stays_while_a_request_is_in_flight():
    # min 0, no arrivals, one long request in flight until t=30: 2 -> 1 at 15 (need 1 while
    # work is in flight), 1 -> 0 at 45 (window [30, 45] without work; cooldown 30 s >= 15).
    t = steps("s", [(0, 30, 0)], replicas=2, inflight=1) + steps("s", [(30, 60, 0)], replicas=1)
    r = run(t, AutoscalingConfig(min_replicas=0))
    assert changes(r, "s") == [(15.0, 2, 1), (45.0, 1, 0)]


# -- feed problems -----------------------------------------------------------------------------------


def test_stale_metrics_hold_the_stage():
    # 4 replicas, no load, samples stop at t=10. At 25 the window [10, 25] would say 1, but the
    # newest sample is 15 s old (> 10 s): hold. With stale_after_s=None the old sample is used.
    a = Autoscaler({"s": AutoscalingConfig()})
    for i in range(11):
        a.observe("s", sample(i, 0, 4))
        assert a.decide(float(i)) == []
    assert a.decide(25.0) == []
    assert a.status()["s"].reason == "holding: metrics stale (newest sample 15 s old)"
    b = Autoscaler({"s": AutoscalingConfig()}, stale_after_s=None)
    for i in range(11):
        b.observe("s", sample(i, 0, 4))
    assert [(d.from_replicas, d.to_replicas) for d in b.decide(25.0)] == [(4, 1)]


def test_samples_later_than_now_wait():
    a = Autoscaler({"s": AutoscalingConfig()})
    a.observe("s", sample(0, 24, 1))
    a.observe("s", sample(1, 24, 1))
    assert a.decide(0.5) == []  # only t=0 is known at 0.5; the window [-0.5, 0.5] is not covered
    assert [(d.from_replicas, d.to_replicas) for d in a.decide(1.0)] == [(1, 2)]


def test_target_and_status_before_and_after_metrics():
    a = Autoscaler({"s": AutoscalingConfig(), "t": AutoscalingConfig()})
    assert a.target("s") is None and a.status()["s"].reason == "no metrics yet"
    a.observe("s", sample(0, 12, 2, device="gpu"))
    a.decide(0.0)
    st = a.status()["s"]
    assert (st.device, st.replicas, st.actual, st.need, st.last_change) == ("gpu", 2, 2, 2, None)
    assert st.reason.startswith("steady at 2 (need 2; 12 req/s x 100 ms = 1.20 busy replicas")


# -- bad input ---------------------------------------------------------------------------------------


def test_autoscaler_arguments_are_validated():
    with pytest.raises(TypeError, match=r"must be a dict of stage -> AutoscalingConfig, got \['s'\]"):
        Autoscaler(["s"])
    with pytest.raises(TypeError, match=r"configs\['s'\] must be an AutoscalingConfig, got \{'max_replicas': 3\}"):
        Autoscaler({"s": {"max_replicas": 3}})
    with pytest.raises(TypeError, match="stage name must be a non-empty str, got 3"):
        Autoscaler({3: AutoscalingConfig()})
    with pytest.raises(ValueError, match=r"device class must be one of \('cpu', 'gpu'\), got 'tpu'"):
        Autoscaler({}, capacity={"tpu": 1})
    with pytest.raises(ValueError, match=r"capacity\['gpu'\] must be an int >= 1, got 0"):
        Autoscaler({}, capacity={"gpu": 0})
    with pytest.raises(ValueError, match="stale_after_s must be a number > 0 or None, got 0"):
        Autoscaler({}, stale_after_s=0)


def test_observe_and_decide_reject_bad_calls():
    a = Autoscaler({"s": AutoscalingConfig()})
    with pytest.raises(ValueError, match=r"no AutoscalingConfig for stage 'x'; configured stages: \['s'\]"):
        a.observe("x", sample(0, 1, 1))
    with pytest.raises(TypeError, match="needs a StageMetrics, got 3"):
        a.observe("s", 3)
    a.observe("s", sample(5, 1, 1))
    with pytest.raises(ValueError, match="StageMetrics.time of stage 's' must increase: got 5.0 after 5.0"):
        a.observe("s", sample(5, 1, 1))
    a.decide(5.0)
    with pytest.raises(ValueError, match="decide now must not go backwards: got 4.0 after 5.0"):
        a.decide(4.0)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"arrival_rate": -1}, ValueError, "StageMetrics.arrival_rate must be a number >= 0 (requests/s), got -1"),
        (
            {"service_time_ms": float("nan")},
            ValueError,
            "StageMetrics.service_time_ms must be a number >= 0 (ms), got nan",
        ),
        ({"replicas": -2}, ValueError, "StageMetrics.replicas must be an int >= 0, got -2"),
        ({"replicas": 2.0}, TypeError, "StageMetrics.replicas must be an int >= 0, got 2.0"),
        ({"utilisation": 1.2}, ValueError, "StageMetrics.utilisation must be a number in [0, 1] or None, got 1.2"),
        ({"queue_length": -1}, ValueError, "StageMetrics.queue_length must be a number >= 0, got -1"),
        ({"inflight": True}, TypeError, "StageMetrics.inflight must be an int >= 0, got True"),
        ({"draining": -1}, ValueError, "StageMetrics.draining must be an int >= 0, got -1"),
        ({"device": "tpu"}, ValueError, "StageMetrics.device must be one of ('cpu', 'gpu'), got 'tpu'"),
        ({"device": None}, TypeError, "StageMetrics.device must be one of ('cpu', 'gpu'), got None"),
        ({"time": "now"}, TypeError, "StageMetrics.time must be a finite number (seconds), got 'now'"),
    ],
)
def test_stage_metrics_are_validated(kwargs, error, message):
    fields = dict(time=0.0, arrival_rate=1.0, service_time_ms=10.0, replicas=1) | kwargs
    with pytest.raises(error) as info:
        StageMetrics(**fields)
    assert str(info.value) == message


def test_stage_metrics_are_keyword_only():
    with pytest.raises(TypeError):
        StageMetrics(0.0, 1.0, 10.0, 1)
