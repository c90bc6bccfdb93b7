"""The arrival envelope (InferLine's tuner): for each window length, the most requests
that arrived within any window of that length.

    planned = envelope_of(planning_trace)            # A_max: what the plan was sized for
    live = ArrivalEnvelope()
    live.record(now_ms)                              # per request, timestamps in ms
    live.exceeds(planned)                            # [100, 200]: bursts beyond the plan

A short window over its planned count means burstier traffic at the same rate; the
longest one over means a higher rate. Timestamps are passed in, so the object is pure.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from flow.errors import FlowTypeError, FlowValueError
from optimizer.slo._check import positive_int, positive_number
from optimizer.slo.traces import check_trace

#: 10 ms to 60 s, roughly doubling (a 1-2-5 series)
WINDOWS_MS: tuple[float, ...] = (10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 60_000)


class ArrivalEnvelope:
    """Counts of arrivals in trailing windows, and the peak count each window has seen."""

    def __init__(self, windows_ms: Sequence[float] = WINDOWS_MS):
        if isinstance(windows_ms, (str, bytes)) or not isinstance(windows_ms, Sequence) or not windows_ms:
            raise FlowTypeError(
                f"windows_ms must be a non-empty sequence of window lengths in ms, got {windows_ms!r:.80}"
            )
        self.windows_ms = tuple(sorted({positive_number("window length (ms)", w) for w in windows_ms}))
        # per window: the (t, n) arrivals within it
        self._events: dict[float, deque[tuple[float, int]]] = {w: deque() for w in self.windows_ms}
        self._count = dict.fromkeys(self.windows_ms, 0)
        self._peak = dict.fromkeys(self.windows_ms, 0)
        self._last = float("-inf")

    def record(self, t_ms: float, n: int = 1) -> None:
        """``n`` requests arrived at ``t_ms`` (timestamps must not go back)."""
        t_ms = positive_number("arrival time (ms)", t_ms, allow_zero=True)
        n = positive_int("n", n)
        if t_ms < self._last:
            raise FlowValueError(f"arrival times must not go back: {t_ms!r} after {self._last!r}")
        self._last = t_ms
        for w in self.windows_ms:
            self._events[w].append((t_ms, n))
            self._count[w] += n
            self._expire(w, t_ms)
            self._peak[w] = max(self._peak[w], self._count[w])

    def _expire(self, w: float, now_ms: float) -> None:
        events = self._events[w]
        while events and events[0][0] <= now_ms - w:
            self._count[w] -= events.popleft()[1]

    def current(self, now_ms: float) -> dict[float, int]:
        """Arrivals in each trailing window ``(now - w, now]``."""
        now_ms = positive_number("now_ms", now_ms, allow_zero=True)
        for w in self.windows_ms:
            self._expire(w, now_ms)
        return dict(self._count)

    def peak(self) -> dict[float, int]:
        """The most arrivals seen in any window of each length (the observed envelope)."""
        return dict(self._peak)

    def exceeds(self, reference: Mapping[float, int], now_ms: float | None = None) -> list[float]:
        """Windows whose count is over ``reference`` (e.g. the planning trace's envelope):
        the current trailing counts at ``now_ms``, or the peaks if ``now_ms`` is None."""
        if not isinstance(reference, Mapping):
            raise FlowTypeError(f"reference must map window length (ms) -> arrivals, got {reference!r:.80}")
        missing = [w for w in self.windows_ms if w not in reference]
        if missing:
            raise FlowValueError(f"reference envelope has no count for window(s) {missing} ms")
        counts = self.peak() if now_ms is None else self.current(now_ms)
        return [w for w in self.windows_ms if counts[w] > reference[w]]


def envelope_of(trace, windows_ms: Sequence[float] = WINDOWS_MS) -> dict[float, int]:
    """The envelope of a whole arrival trace (timestamps, ms): the plan's A_max."""
    env = ArrivalEnvelope(windows_ms)
    for t in check_trace(trace).tolist():
        env.record(t)
    return env.peak()
