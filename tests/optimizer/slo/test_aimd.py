"""The AIMD batcher on a deterministic clock with a synthetic latency(b) curve."""

from __future__ import annotations

import pytest

from optimizer.slo import AIMDBatcher, SLOError


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
    assert min(settled) == 33 and max(settled) == 37  # 37 is over budget: back to floor(0.9 * 37)
    # throughput within 10% of the best fixed batch size (36 rows per 20 ms)
    rows = sum(settled)
    ms = sum(latency(b) for b in settled)
    assert rows / ms >= 0.9 * 36 / latency(36)
    over = sum(latency(b) > 20 for b in settled)
    assert over / len(settled) < 0.25  # only the probes past the knee miss the budget


def test_a_short_batch_says_nothing_about_bigger_ones():
    batcher = AIMDBatcher(budget_ms=20, start=10)
    assert batcher.observe(3, 1.0) == 10
    assert batcher.observe(10, 1.0) == 11


def test_decrease_cuts_ten_percent_of_the_batch_that_was_too_slow():
    batcher = AIMDBatcher(budget_ms=20, start=30)
    assert batcher.observe(30, 25.0) == 27
    assert batcher.observe(5, 25.0) == 4  # a small slow batch: cut from its size, at least by one
    assert AIMDBatcher(budget_ms=20).observe(1, 50.0) == 1  # never below min_batch


def test_delay_window_follows_the_arrival_rate_and_the_headroom():
    clock = Clock()
    batcher = AIMDBatcher(budget_ms=20, start=10, clock=clock)
    assert batcher.delay_ms() == 0.0  # nothing observed yet
    for _ in range(1000):  # one request per ms for a second
        clock.s += 0.001
        batcher.arrived()
    assert batcher.rate_per_ms() == pytest.approx(1.0)
    batcher.observe(5, 2.5)  # 0.5 ms per row seen: a batch of 10 ~ 5 ms, 15 ms of headroom
    assert batcher.batch_size == 10
    assert batcher.delay_ms() == pytest.approx(9.0)  # 9 more requests take 9 ms to arrive
    batcher.observe(5, 6.0)  # slower: a batch of 10 ~ 12 ms leaves 8 ms
    assert batcher.delay_ms() == pytest.approx(8.0)
    clock.s += 0.5  # half the window empties: the batch now takes 18 ms to fill
    assert batcher.rate_per_ms() == pytest.approx(0.5)
    assert batcher.delay_ms() == pytest.approx(8.0)
    assert AIMDBatcher(budget_ms=20, start=10, clock=clock, max_delay_ms=2).delay_ms() == 0.0
    clock.s += 1.0  # no traffic: nothing to wait for
    assert batcher.delay_ms() == 0.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"budget_ms": 0}, "AIMDBatcher.budget_ms must be a finite number > 0, got 0"),
        ({"budget_ms": 5, "decrease": 1.5}, r"AIMDBatcher.decrease must be in \(0, 1\), got 1.5"),
        ({"budget_ms": 5, "start": 8, "max_batch": 4}, r"AIMDBatcher.start \(8\) exceeds max_batch \(4\)"),
        ({"budget_ms": 5, "min_batch": 4, "max_batch": 2}, "AIMDBatcher.max_batch must be >= 4, got 2"),
    ],
)
def test_bad_settings_are_quoted(kwargs, message):
    with pytest.raises(SLOError, match=message):
        AIMDBatcher(**kwargs)
