"""Clipper's adaptive batching for one stage under a latency budget: AIMD on the batch
size, and a delay window chosen from the arrival rate.

    batcher = AIMDBatcher(budget_ms=20)
    batcher.arrived()                      # the executor's queue saw a request
    size, wait = batcher.batch_size, batcher.delay_ms()
    ...run a batch of up to `size` requests, waiting at most `wait` ms for it to fill...
    batcher.observe(len(batch), elapsed_ms)

- additive increase: a full batch (as big as allowed) that ran within the budget raises
  the allowed size by ``step``: the queue could have used a bigger one;
- multiplicative decrease: a batch over the budget cuts it to 90% of that batch's size
  (at least one less), Clipper's 10% back-off;
- delay window: waiting for more requests pays only while the batch would fill before
  the budget runs out: ``min((size - 1) / rate, budget - latency(size), max_delay_ms)``,
  with latency(size) scaled linearly from the last observed batch (a cautious guess).

Time comes from ``clock`` (seconds, default ``time.monotonic``) so that tests drive it.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from optimizer.slo._check import positive_int, positive_number
from optimizer.slo.errors import SLOError, SLOTypeError


class AIMDBatcher:
    """The allowed batch size and delay window of one stage replica."""

    def __init__(
        self,
        budget_ms: float,
        *,
        step: int = 1,
        decrease: float = 0.9,
        min_batch: int = 1,
        max_batch: int = 256,
        start: int = 1,
        max_delay_ms: float | None = None,
        rate_window_ms: float = 1000.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.budget_ms = positive_number("AIMDBatcher.budget_ms", budget_ms)
        self.step = positive_int("AIMDBatcher.step", step)
        self.decrease = positive_number("AIMDBatcher.decrease", decrease)
        if not self.decrease < 1:
            raise SLOError(f"AIMDBatcher.decrease must be in (0, 1), got {decrease!r}")
        self.min_batch = positive_int("AIMDBatcher.min_batch", min_batch)
        self.max_batch = positive_int("AIMDBatcher.max_batch", max_batch, minimum=self.min_batch)
        self.size = positive_int("AIMDBatcher.start", start, minimum=self.min_batch)
        if self.size > self.max_batch:
            raise SLOError(f"AIMDBatcher.start ({start!r}) exceeds max_batch ({max_batch!r})")
        self.max_delay_ms = (
            self.budget_ms
            if max_delay_ms is None
            else positive_number("AIMDBatcher.max_delay_ms", max_delay_ms, allow_zero=True)
        )
        self.rate_window_ms = positive_number("AIMDBatcher.rate_window_ms", rate_window_ms)
        if not callable(clock):
            raise SLOTypeError(f"clock must be a callable returning seconds, got {clock!r:.80}")
        self.clock = clock
        self._arrivals: deque[float] = deque()  # ms timestamps within the rate window
        self._last: tuple[int, float] | None = None  # (batch size, latency ms) last observed

    @property
    def batch_size(self) -> int:
        """The most requests the next batch may take."""
        return self.size

    def observe(self, batch: int, latency_ms: float) -> int:
        """Feed one finished batch (its size and how long the call took); returns the new
        allowed batch size."""
        batch = positive_int("batch size", batch)
        latency_ms = positive_number("latency_ms", latency_ms, allow_zero=True)
        self._last = (batch, latency_ms)
        if latency_ms > self.budget_ms:
            base = min(self.size, batch)
            self.size = max(self.min_batch, min(base - 1, math.floor(base * self.decrease)))
        elif batch >= self.size:
            self.size = min(self.max_batch, self.size + self.step)
        return self.size

    def arrived(self, n: int = 1) -> None:
        """Count ``n`` requests arriving now (for the arrival rate)."""
        now = self.clock() * 1000.0
        for _ in range(positive_int("n", n)):
            self._arrivals.append(now)
        self._trim(now)

    def _trim(self, now_ms: float) -> None:
        while self._arrivals and self._arrivals[0] <= now_ms - self.rate_window_ms:
            self._arrivals.popleft()

    def rate_per_ms(self) -> float:
        """Arrivals per millisecond over the last ``rate_window_ms``."""
        self._trim(self.clock() * 1000.0)
        return len(self._arrivals) / self.rate_window_ms

    def delay_ms(self) -> float:
        """How long a free replica should wait for its batch to fill (0: take what is queued)."""
        rate = self.rate_per_ms()
        if self.size <= 1 or rate <= 0 or self._last is None:
            return 0.0
        fill_ms = (self.size - 1) / rate
        seen_batch, seen_ms = self._last
        headroom = self.budget_ms - seen_ms * self.size / seen_batch
        return max(0.0, min(fill_ms, headroom, self.max_delay_ms))
