"""The racing benchmark's arithmetic: the order-statistics bound and the interval of the gap
to it (benchmarks/competition.py), on samples whose answers are known."""

from __future__ import annotations

import numpy as np

from benchmarks.competition import gap_interval, min_of_k


def test_the_bound_of_three_uniform_draws_is_their_minimum():
    x = np.random.default_rng(1).uniform(0, 1, 40_000)
    b = min_of_k(x, 3)
    # the minimum of 3 uniform(0, 1) draws: median 1 - 0.5^(1/3), mean 1/4, p99 1 - 0.01^(1/3)
    assert abs(b["p50_ms"] - (1 - 0.5 ** (1 / 3))) < 0.01
    assert abs(b["mean_ms"] - 0.25) < 0.005
    assert abs(b["p99_ms"] - (1 - 0.01 ** (1 / 3))) < 0.01


def test_a_race_that_reaches_the_bound_has_a_gap_interval_around_zero():
    """Free copies: the raced latencies are the minimum of 3 single-replica draws. Chance
    alone puts one run's gap a few points either side of 0 (with 900 samples a side, as a
    benchmark's rounds have), and the 90% interval holds 0 in about 9 runs of 10."""
    held, widths = 0, []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        single = rng.gamma(3.0, 1.0, 900) + 0.5
        raced = rng.gamma(3.0, 1.0, (900, 3)).min(axis=1) + 0.5
        got = gap_interval(single, raced, 3, resamples=200)
        lo, hi = got["p50_gap_interval_points"]
        held += lo < 0 < hi
        widths.append(hi - lo)
    assert held >= 30, held  # 52 of 60 seeds when this was written
    assert max(widths) < 12, widths  # a few points each way, not a meaningless spread


def test_a_race_that_pays_for_its_copies_has_its_cost_in_the_gap():
    rng = np.random.default_rng(3)
    single = rng.gamma(3.0, 1.0, 900) + 0.5
    cost = 0.6  # ms a request for the copies
    raced = rng.gamma(3.0, 1.0, (900, 3)).min(axis=1) + 0.5 + cost
    got = gap_interval(single, raced, 3)
    median = np.median(single)
    lo, hi = got["p50_gap_interval_points"]
    assert lo < 100 * cost / median < hi, (lo, hi, 100 * cost / median)
    assert lo > 5  # so far from the bound that no resample puts it within 5 points
