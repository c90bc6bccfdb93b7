"""The profiler core on a deterministic fake clock: exact figures, warm-up left out."""

from __future__ import annotations

import pytest

from flow.errors import FlowTypeError, FlowValueError
from optimizer.slo import Profile, default_batch_sizes, measure_batches


class FakeClock:
    """Seconds that move only when the fake stage runs."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def fake_stage(clock, calls, cold_ms=50.0):
    """latency(b) = 2 ms + 0.5 ms per row; the first call of all is cold (a model loading)."""

    def run(batch):
        calls.append(list(batch))
        ms = 2.0 + 0.5 * len(batch) + (cold_ms if len(calls) == 1 else 0.0)
        clock.now += ms / 1000.0
        return [x * 2 for x in batch]

    return run


def test_default_batch_sizes_are_powers_of_two_and_points_between():
    assert default_batch_sizes(32) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
    assert default_batch_sizes(20) == (1, 2, 3, 4, 6, 8, 12, 16, 20)
    assert default_batch_sizes(1) == (1,)


def test_measures_each_batch_size_after_warm_up():
    clock, calls = FakeClock(), []
    out = measure_batches(fake_stage(clock, calls), [1, 2, 3], batch_sizes=[4, 1], warmup=1, repeats=3, clock=clock)
    assert list(out) == [1, 4]
    assert out[1] == pytest.approx((2.5, 2.5, 2.5))  # the cold call was a warm-up
    assert out[4] == pytest.approx((4.0, 4.0, 4.0))
    assert len(calls) == 8
    # batches cycle through the samples, so every sample is used and big batches repeat them
    assert calls[:5] == [[1], [2], [3], [1], [2, 3, 1, 2]]


def test_without_warm_up_the_cold_call_shows():
    clock, calls = FakeClock(), []
    out = measure_batches(
        fake_stage(clock, calls),
        ["a"],
        batch_sizes=[1],
        warmup=0,
        repeats=2,
        clock=clock,
        make_batch=lambda rows: rows * 1,
    )
    assert out[1] == pytest.approx((52.5, 2.5))


def test_measurements_make_a_profile_whose_fit_recovers_the_curve():
    clock, calls = FakeClock(), []
    measured = measure_batches(fake_stage(clock, calls), list(range(10)), max_batch=16, clock=clock)
    assert tuple(measured) == default_batch_sizes(16)
    fit = Profile({}).with_stage("double", "cpu", measured).fit("double", "cpu")
    assert fit.a_ms == pytest.approx(2.0) and fit.c_ms == pytest.approx(0.5)


def test_bad_arguments_are_named():
    with pytest.raises(FlowTypeError, match="run must be a callable"):
        measure_batches(None, [1])
    with pytest.raises(FlowValueError, match="samples must be a non-empty sequence"):
        measure_batches(len, [])
    with pytest.raises(FlowValueError, match="batch size must be >= 1, got 0"):
        measure_batches(len, [1], batch_sizes=[0, 1])
    with pytest.raises(FlowValueError, match="repeats must be >= 1, got 0"):
        measure_batches(len, [1], repeats=0)
