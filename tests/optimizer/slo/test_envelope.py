"""The arrival envelope: trailing counts, peaks, and traffic beyond a planned envelope."""

from __future__ import annotations

import numpy as np
import pytest

from flow.errors import FlowValueError
from optimizer.slo import ArrivalEnvelope, bursty, envelope_of


def test_counts_arrivals_in_trailing_windows():
    env = ArrivalEnvelope(windows_ms=[10, 100])
    for t in (0.0, 5.0, 9.0, 10.0):
        env.record(t)
    assert env.current(10.0) == {10: 3, 100: 4}  # (0, 10] holds 5, 9 and 10
    env.record(50.0)
    assert env.current(50.0) == {10: 1, 100: 5}
    assert env.current(105.0) == {10: 0, 100: 3}  # (5, 105] holds 9, 10 and 50
    assert env.current(120.0) == {10: 0, 100: 1}
    assert env.peak() == {10: 3, 100: 5}


def test_a_burst_shows_in_short_windows_before_the_rate_does():
    steady = np.arange(0, 60_000, 10.0)  # 100 req/s
    planned = envelope_of(steady)
    assert planned[1_000] == 100 and planned[10] == 1
    env = ArrivalEnvelope()
    for t in steady[:3000]:
        env.record(t)
    for t in np.linspace(30_000, 30_020, 10):  # 10 requests in 20 ms
        env.record(t)
    over = env.exceeds(planned)
    assert over[0] == 10 and 20 in over and 60_000 not in over
    assert env.exceeds(planned, now_ms=40_000) == []  # the burst has left the short windows


def test_a_higher_rate_exceeds_the_long_windows():
    planned = envelope_of(bursty(100, 60, seed=1))
    env = ArrivalEnvelope()
    for t in bursty(300, 60, seed=2):
        env.record(t)
    assert {1_000, 10_000, 60_000} <= set(env.exceeds(planned))


def test_bad_input_is_named():
    env = ArrivalEnvelope([10])
    env.record(5.0)
    with pytest.raises(FlowValueError, match=r"arrival times must not go back: 4.0 after 5.0"):
        env.record(4.0)
    with pytest.raises(FlowValueError, match=r"reference envelope has no count for window\(s\) \[10.0\] ms"):
        env.exceeds({100: 3})
    with pytest.raises(FlowValueError, match="window length"):
        ArrivalEnvelope([0])
