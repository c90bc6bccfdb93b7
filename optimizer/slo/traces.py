"""Arrival traces: sorted request timestamps in milliseconds, for the simulator and planner.

poisson(rate_rps=200, n=5000, seed=1)                     # open-loop Poisson arrivals
bursty(rate_rps=100, duration_s=60, bursts=[(20, 30, 4)])  # 4x the rate from 20 s to 30 s
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from flow.errors import FlowTypeError, FlowValueError
from optimizer.slo._check import positive_int, positive_number


def check_trace(trace) -> np.ndarray:
    """``trace`` as a float array of non-decreasing, finite, >= 0 timestamps (ms)."""
    if isinstance(trace, (str, bytes)):
        raise FlowTypeError(f"an arrival trace must be a sequence of timestamps in ms, got {trace!r:.80}")
    try:
        t = np.asarray(trace, dtype=float)
    except (TypeError, ValueError):
        raise FlowTypeError(f"an arrival trace must be a sequence of timestamps in ms, got {trace!r:.80}") from None
    if t.ndim != 1 or len(t) == 0:
        raise FlowValueError(f"an arrival trace must be a non-empty 1-d sequence of timestamps, got shape {t.shape}")
    if not np.all(np.isfinite(t)) or t[0] < 0:
        raise FlowValueError(f"arrival timestamps must be finite and >= 0, got {trace!r:.80}")
    if np.any(np.diff(t) < 0):
        i = int(np.argmax(np.diff(t) < 0))
        raise FlowValueError(
            f"arrival timestamps must be sorted: {float(t[i])!r} comes before {float(t[i + 1])!r} (index {i + 1})"
        )
    return t


def poisson(rate_rps: float, n: int, seed: int = 0) -> np.ndarray:
    """``n`` Poisson arrivals at ``rate_rps`` requests per second, starting near 0."""
    rate = positive_number("rate_rps", rate_rps)
    n = positive_int("n", n)
    rng = random.Random(seed)
    gaps = [rng.expovariate(rate / 1000.0) for _ in range(n)]
    return np.cumsum(gaps)


def bursty(
    rate_rps: float, duration_s: float, bursts: Sequence[tuple[float, float, float]] = (), seed: int = 0
) -> np.ndarray:
    """Poisson arrivals over ``duration_s`` whose rate is multiplied by ``k`` between
    ``start_s`` and ``end_s`` for each ``(start_s, end_s, k)`` in ``bursts`` (thinning a
    Poisson process at the peak rate gives exact piecewise-constant rates)."""
    rate = positive_number("rate_rps", rate_rps)
    duration_ms = positive_number("duration_s", duration_s) * 1000.0
    spans = []
    for b in bursts:
        if not isinstance(b, (tuple, list)) or len(b) != 3:
            raise FlowValueError(f"a burst is (start_s, end_s, multiplier), got {b!r}")
        start, end, k = (positive_number("burst field", v, allow_zero=True) for v in b)
        if end <= start:
            raise FlowValueError(f"a burst must end after it starts, got {b!r}")
        spans.append((start * 1000.0, end * 1000.0, k))
    peak = max([1.0] + [k for _, _, k in spans]) * rate / 1000.0  # per ms
    rng = random.Random(seed)
    out, t = [], 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration_ms:
            break
        k = next((k for s, e, k in spans if s <= t < e), 1.0)
        if rng.random() * peak < k * rate / 1000.0:
            out.append(t)
    if not out:
        raise FlowValueError(f"no arrivals in {duration_s!r} s at {rate_rps!r} req/s; lengthen the trace")
    return np.array(out)
