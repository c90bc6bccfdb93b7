"""The AIMD batcher on a deterministic clock with a synthetic latency(b) curve."""

from __future__ import annotations

import pytest

from flow.errors import FlowValueError
from optimizer.slo import AIMDBatcher


class Clock:
    def __init__(self):
        self.s = 0.0

    def __call__(self):
        return self.s


def latency(b: int) -> float:
    """2 ms per call + 0.5 ms per row: the largest batch within 20 ms is 36."""
    return 2.0 + 0.5 * b


def run_saturated(batcher, clock, steps):
    """A queue that always holds more than the batcher allows: every batch is full."""
    sizes = []
    for _ in range(steps):
        b = batcher.batch_size
        clock.s += latency(b) / 1000
        batcher.observe(b, latency(b))
        sizes.append(b)
    return sizes


def test_converges_to_the_largest_batch_within_the_budget():
    clock = Clock()
    batcher = AIMDBatcher(budget_ms=20, clock=clock)
    sizes = run_saturated(batcher, clock, 400)
    assert sizes[:5] == [1, 2, 3, 4, 5]  # additive increase from 1
    settled = sizes[100:]
    # 37 is over budget: back to 90% of 36, the largest batch the fitted curve puts within it
    assert min(settled) == 32 and max(settled) == 37
    # throughput within 10% of the best fixed batch size (36 rows per 20 ms)
    rows = sum(settled)
    ms = sum(latency(b) for b in settled)
    assert rows / ms >= 0.9 * 36 / latency(36)
    over = sum(latency(b) > 20 for b in settled)
    assert over / len(settled) < 0.25  # only the probes past the knee miss the budget


def run_open(batcher, clock, rate_per_ms, ms, lat=latency, slow=()):
    """The runtime's batcher loop on a deterministic clock: requests every 1/rate ms; a free
    replica takes up to the cap of what is queued, or, holding one request, waits up to the
    delay window for more; ``slow``: batch numbers that take 50 ms (a stall). Returns the
    (cap, batch size, window) of each batch."""
    gap = 1.0 / rate_per_ms
    t, next_arrival, queue, seen = 0.0, 0.0, 0, []

    def arrive_until(until):
        nonlocal next_arrival, queue
        while next_arrival <= until:
            clock.s = next_arrival / 1000
            batcher.arrived()
            queue += 1
            next_arrival += gap

    while t < ms:
        arrive_until(t)
        if queue == 0:
            t = next_arrival
            continue
        clock.s = t / 1000
        cap, window = batcher.batch_size, 0.0
        if queue == 1:
            window = batcher.delay_ms()
            end = t + window
            while queue < cap and next_arrival <= end:
                arrive_until(next_arrival)
            t = end if queue < cap else max(t, next_arrival - gap)
        b = min(cap, queue)
        queue -= b
        took = 50.0 if len(seen) in slow else lat(b)
        t += took
        arrive_until(t)
        clock.s = t / 1000
        batcher.observe(b, took)
        seen.append((cap, b, window))
    return seen


def test_increase_without_full_batches_finds_the_largest_batch_within_budget():
    """At a moderate rate batches are small and never full: the fitted curve still takes
    the cap to the largest batch within the budget (36), ready for a backlog."""
    clock = Clock()
    batcher = AIMDBatcher(budget_ms=20, clock=clock)
    seen = run_open(batcher, clock, rate_per_ms=0.5, ms=5000)
    assert max(b for _, b, _ in seen) < 10  # batches stay small
    assert batcher.batch_size == 36
    assert latency(36) <= 20 < latency(37)
    assert batcher.decreases == 0


def test_a_slow_batch_cuts_ten_percent_from_the_batch_or_the_curve():
    batcher = AIMDBatcher(budget_ms=20, start=30, max_batch=30)
    batcher.observe(2, latency(2))
    batcher.observe(10, latency(10))  # the curve: 2 + 0.5 b, 36 within budget
    assert batcher.batch_size == 30
    assert batcher.observe(30, 25.0) == 27  # a full batch over budget: Clipper's 10%
    assert batcher.fitted_cap() == 24  # the curve has learnt that 30 was too slow
    # a batch of 3 over budget is a stall (the curve says 4 ms): 10% below the curve's
    # largest batch, where the rule before cut to 90% of the slow batch (2), and the backlog
    # the stall left then drained 2 at a time
    assert batcher.observe(3, 25.0) == 21
    assert batcher.observe(21, 30.0) == 18  # at least one less
    fresh = AIMDBatcher(budget_ms=20, start=3)
    assert fresh.observe(3, 25.0) == 2  # nothing known: cut from the batch
    assert AIMDBatcher(budget_ms=20).observe(1, 50.0) == 1  # never below min_batch


def test_backs_off_under_slow_batches_and_recovers_after_a_stall():
    clock = Clock()
    batcher = AIMDBatcher(budget_ms=20, clock=clock)
    seen = run_open(batcher, clock, rate_per_ms=0.5, ms=3000)
    assert batcher.batch_size == 36
    n = len(seen)
    seen += run_open(batcher, clock, rate_per_ms=0.5, ms=1000, slow={0, 1})  # two stalled batches
    caps = [c for c, _, _ in seen[n:]]
    assert caps[:3] == [36, 32, 28]  # each slow batch cuts 10%...
    assert caps[-1] == 36  # ...and the curve, which left the stalls out, brings it back
    # a stage that got slower for good (latency doubled) settles lower, within budget, though
    # no batch went over it (batches of 2 and 3): the curve takes the cap down step by step
    seen = run_open(batcher, clock, rate_per_ms=0.35, ms=5000, lat=lambda b: 2 * latency(b))
    assert max(b for _, b, _ in seen[-100:]) <= 3 and batcher.decreases == 2
    assert batcher.batch_size == 16
    assert 2 * latency(16) <= 20 < 2 * latency(17)


def test_a_full_batch_over_budget_stops_the_curve_from_probing_past_it():
    """A knee no line shows (1 ms up to 6 rows, 40 ms from 7): once a full batch of 7 went
    over budget, small batches within budget do not take the cap back to 7 on the curve's
    word for CEILING_BATCHES batches; a full batch within budget (Clipper's evidence) may."""
    from optimizer.slo.aimd import CEILING_BATCHES

    batcher = AIMDBatcher(budget_ms=12.5, start=7, max_batch=20)
    batcher.observe(2, 1.0)
    batcher.observe(3, 1.0)  # the curve: flat, everything fits
    assert batcher.batch_size == 9
    batcher.observe(9, 40.0)
    assert batcher.ceiling == 9 and batcher.batch_size == 8
    for _ in range(CEILING_BATCHES - 1):
        batcher.observe(2, 1.0)
    assert batcher.batch_size == 8  # the curve alone does not reach the ceiling again
    batcher.observe(2, 1.0)
    assert batcher.ceiling is None and batcher.batch_size == 9  # the ceiling expired: probe again
    batcher.observe(9, 40.0)
    assert batcher.batch_size == 8
    assert batcher.observe(8, 1.0) == 9  # a full batch within budget still raises it


def test_a_budget_out_of_reach_does_not_cut_the_cap_below_what_the_rate_needs():
    """Every batch over a 2 ms budget (a batch of one takes 2.5 ms), 0.8 requests/ms: cutting
    to one request per batch would serve 0.4/ms and the queue would grow without end; the cap
    stops at the batch that keeps up with the replica at most 80% busy (0.8 b >= 0.8 (2 +
    0.5 b): 4)."""
    clock = Clock()
    batcher = AIMDBatcher(budget_ms=2, start=10, max_delay_ms=0, clock=clock)
    seen = run_open(batcher, clock, rate_per_ms=0.8, ms=3000)
    settled = seen[len(seen) // 2 :]
    assert min(c for c, _, _ in settled) >= 4
    rows = sum(b for _, b, _ in settled)
    assert rows / sum(latency(b) for _, b, _ in settled) >= 0.8 * 0.95  # it keeps up
    assert batcher.stable_batch() == 4


def test_saturated_and_backlogged_batches_take_the_cap_at_once():
    """Over capacity at batch 1 (0.6/ms against 1 per 2.5 ms): the queue builds up, batches
    grow to what the rate needs and stay within the budget."""
    clock = Clock()
    batcher = AIMDBatcher(budget_ms=20, clock=clock)
    seen = run_open(batcher, clock, rate_per_ms=0.6, ms=5000)
    settled = seen[len(seen) // 2 :]
    assert max(b for _, b, _ in settled) <= 36
    assert all(latency(b) <= 20 for _, b, _ in settled)
    rows = sum(b for _, b, _ in settled)
    assert rows / sum(latency(b) for _, b, _ in settled) > 0.6  # it keeps up


def _batcher_on(clock, a, c, **kw):
    """A batcher whose fitted curve is latency(b) = a + c*b (two batches observed)."""
    batcher = AIMDBatcher(budget_ms=20, start=30, max_batch=30, clock=clock, **kw)
    batcher.observe(2, a + 2 * c)
    batcher.observe(10, a + 10 * c)
    assert batcher.latency_ms(20) == pytest.approx(a + 20 * c)
    return batcher


def _at_rate(batcher, clock, per_ms):
    """Arrivals at ``per_ms`` over the last second (the old ones leave the rate window)."""
    clock.s += 2.0
    for _ in range(round(per_ms * 1000)):
        clock.s += 0.001 / per_ms
        batcher.arrived()
    assert batcher.rate_per_ms() == pytest.approx(per_ms)


def test_delay_window_waits_only_while_the_replica_would_idle():
    """The window: the time b - 1 more requests take to arrive, for the largest b whose
    wait fits max_delay_ms and the budget, and whose run keeps the replica at most 80%
    busy at the rate (rate * latency(b) <= 0.8)."""
    clock = Clock()
    assert AIMDBatcher(budget_ms=20, clock=clock).delay_ms() == 0.0  # nothing observed yet
    wide = _batcher_on(clock, 2, 0.5, max_delay_ms=20)  # latency 2 + 0.5 b, windows up to 20 ms
    # 0.2/ms: b = 4 runs 4 ms (80% busy at the rate); 3 more take 15 ms (4 + 15 <= 20)
    _at_rate(wide, clock, 0.2)
    assert wide.delay_ms() == pytest.approx(15.0)
    # 0.25/ms: b = 2 runs 3 ms (75% busy); b = 3 would be 87.5%: one more, 4 ms
    _at_rate(wide, clock, 0.25)
    assert wide.delay_ms() == pytest.approx(4.0)
    # 0.5/ms: a batch of one already keeps it 125% busy; the queue that forms while a
    # batch runs makes the next one bigger, and a wait would be time it owes the queue
    # (the first rule waited 2 ms here for the batch of 2 the rate needs)
    _at_rate(wide, clock, 0.5)
    assert wide.delay_ms() == 0.0
    _at_rate(wide, clock, 1.2)
    assert wide.delay_ms() == 0.0

    # the default window, 10% of the budget (2 ms), on a cheap stage (0.4 + 0.1 b)
    cheap = _batcher_on(clock, 0.4, 0.1)
    _at_rate(cheap, clock, 1.0)  # b = 3 (0.7 ms, 70% busy): 2 more take 2 ms; b = 4 would take 3
    assert cheap.delay_ms() == pytest.approx(2.0)
    _at_rate(cheap, clock, 1.25)  # b = 2 (75% busy); b = 3 would be 87.5%
    assert cheap.delay_ms() == pytest.approx(0.8)
    _at_rate(cheap, clock, 2.0)  # a batch of 2 would keep it 120% busy
    assert cheap.delay_ms() == 0.0
    _at_rate(cheap, clock, 0.3)  # one more takes 3.3 ms, over the window
    assert cheap.delay_ms() == 0.0
    # the budget left by the batch bounds the wait; so does the cap
    tight = _batcher_on(clock, 2, 0.5, max_delay_ms=20)
    tight.budget_ms = 10.0
    _at_rate(tight, clock, 0.2)  # b = 3: 10 ms + 3.5 > 10; b = 2: 5 + 3 <= 10
    assert tight.delay_ms() == pytest.approx(5.0)
    capped = AIMDBatcher(budget_ms=20, start=2, max_batch=2, max_delay_ms=20, clock=clock)
    capped.observe(1, 2.5)
    capped.observe(2, 3.0)
    _at_rate(capped, clock, 0.2)
    assert capped.batch_size == 2 and capped.delay_ms() == pytest.approx(5.0)
    clock.s += 2.0  # no traffic: nothing to wait for
    assert wide.delay_ms() == 0.0


def test_delay_window_never_holds_a_busy_replica_below_the_arrival_rate():
    """The HTTP case that kept the first rule below fixed batch sizes, on the clock: a
    stage whose batch of one looks 85% busy (latency 2.5 + 0.3 b at 0.3 requests/ms).
    The first rule waited 2 ms for the batch of 2 the rate needs; a batch then took its
    wait plus its run, and the replica fell behind the arrivals. Now it runs what is
    queued, and keeps up."""
    clock = Clock()
    batcher = AIMDBatcher(budget_ms=20, start=1, max_batch=32, clock=clock)
    seen = run_open(batcher, clock, rate_per_ms=0.3, ms=4000, lat=lambda b: 2.5 + 0.3 * b)
    assert all(window == 0.0 for _, _, window in seen)
    assert sum(b for _, b, _ in seen) >= 0.3 * 4000 - 1  # every arrival served as it came
    assert max(b for _, b, _ in seen) == 1  # a request never found one ahead of it


def test_config_builds_the_runtime_batcher():
    from optimizer.slo import SLO, ServingSLO, StageConfig
    from optimizer.slo.aimd import BATCH_SHARE, HEADROOM, AIMDConfig, aimd_config

    unplanned = ServingSLO(SLO(20), budgets={"m": 20.0})
    assert aimd_config(unplanned, "m", 32) == AIMDConfig(20 * BATCH_SHARE, max_batch=32)
    planned = ServingSLO(SLO(20), budgets={"m": 20.0}, configs={"m": StageConfig(batch_size=8)})
    assert aimd_config(planned, "m", 8) == AIMDConfig(20 * BATCH_SHARE, start=8, max_batch=8 * HEADROOM)
    assert aimd_config(None, "m", 8) is None
    assert aimd_config(ServingSLO(SLO(20), budgets={"m": 20.0}, adapt=False), "m", 8) is None
    with pytest.raises(FlowValueError, match=r"AIMDBatcher.start \(9\) exceeds max_batch \(4\)"):
        AIMDConfig(10, start=9, max_batch=4)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"budget_ms": 0}, "AIMDBatcher.budget_ms must be a finite number > 0, got 0"),
        ({"budget_ms": 5, "decrease": 1.5}, r"AIMDBatcher.decrease must be in \(0, 1\), got 1.5"),
        ({"budget_ms": 5, "start": 8, "max_batch": 4}, r"AIMDBatcher.start \(8\) exceeds max_batch \(4\)"),
        ({"budget_ms": 5, "min_batch": 4, "max_batch": 2}, "AIMDBatcher.max_batch must be >= 4, got 2"),
        ({"budget_ms": 5, "utilisation": 1.5}, r"AIMDBatcher.utilisation must be in \(0, 1\], got 1.5"),
    ],
)
def test_bad_settings_are_quoted(kwargs, message):
    with pytest.raises(FlowValueError, match=message):
        AIMDBatcher(**kwargs)


def test_a_planned_batch_may_always_take_what_the_profile_says_it_takes():
    # the planner's budget for "m" is its share at the batch it usually ran (20 ms); half
    # of it (10 ms) is less than the planned batch of 8 takes (4 + 2 x 8 = 20 ms), and less
    # than a batch of 1 (6 ms) would leave room for: AIMD must not undo the plan
    from optimizer.slo import SLO, Profile, ServingSLO, StageConfig
    from optimizer.slo.aimd import BATCH_SHARE, HEADROOM, AIMDConfig, aimd_config

    profile = Profile({"m": {"cpu": {b: [4.0 + 2.0 * b] * 5 for b in (1, 2, 4, 8)}}})
    planned = ServingSLO(
        SLO(40), budgets={"m": 20.0}, configs={"m": StageConfig(batch_size=8)}, profile_json=profile.to_json()
    )
    assert aimd_config(planned, "m", 8) == AIMDConfig(20.0, start=8, max_batch=8 * HEADROOM)
    # a budget that leaves more than the planned batch takes is kept
    roomy = ServingSLO(
        SLO(80), budgets={"m": 60.0}, configs={"m": StageConfig(batch_size=8)}, profile_json=profile.to_json()
    )
    assert aimd_config(roomy, "m", 8) == AIMDConfig(60.0 * BATCH_SHARE, start=8, max_batch=8 * HEADROOM)
