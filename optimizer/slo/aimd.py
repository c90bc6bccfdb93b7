"""Clipper's adaptive batching for one stage under a latency budget: AIMD on the batch
size, and a delay window chosen from the arrival rate.

    batcher = AIMDBatcher(budget_ms=20)
    batcher.arrived()                      # the executor's queue saw a request
    size, wait = batcher.batch_size, batcher.delay_ms()
    ...run a batch of up to `size` requests, waiting at most `wait` ms for it to fill...
    batcher.observe(len(batch), elapsed_ms)

- additive increase: a batch that ran within the budget raises the allowed size (the cap)
  by ``step`` when it was full (the queue could have used a bigger one) or when the
  stage's latency curve, fitted on the batches seen, puts a batch of cap + step within
  the budget (a stage that is seldom full still finds the largest batch within budget,
  so that it has it when a backlog comes) and no full batch of that size went over the
  budget in the last ``CEILING_BATCHES`` batches (a curve with a knee no line shows);
  when the curve puts the cap itself over the budget, the cap steps back by one;
- multiplicative decrease: a batch over the budget cuts the cap (at least one) to 90% of
  the largest batch the fitted curve puts within the budget, Clipper's back-off; not to
  90% of the slow batch: on a shared machine one stalled batch of 3 used to drop the cap
  to 2, and the next backlog then drained 2 at a time. Nor below the batch the arrival
  rate needs to keep up (``stable_batch``, from each size's recent cost: a batch that
  started while requests waited costs the time since the previous one ended, CPU waits
  included); a full batch over budget whose throughput is below the arrival rate raises
  the cap instead; and when even the smallest batch is over the budget (the curve says
  so) a cut buys nothing and is not made: on a machine too slow for the budget the cap
  fell to 1 and the queue grew without bound;
- delay window: a free replica holding one request waits for b - 1 more, the time they
  take to arrive at the current rate, for the largest b whose wait fits ``max_delay_ms``
  (default ``DELAY_SHARE`` of the budget) and the budget left by latency(b), and only while
  the replica would otherwise idle: the requests that arrive while the batch of b runs
  keep it at most ``utilisation`` busy (rate * latency(b) <= utilisation), so that the
  next batch again starts from an empty queue. A wait is time the replica serves no one:
  once requests arrive faster than that, the queue that forms during each batch makes
  the next one bigger by itself, and a wait on top only lowers the throughput (the first
  rule, which waited for the batch the rate needed, ran below the arrival rate over HTTP:
  docs/slo.md "AIMD batcher"). So the window buys fewer, bigger batches (less
  work) on a stage that is cheap for its rate, and a stage that is busy never waits.

latency(b) is an exponentially weighted least-squares fit ``a + c*b`` of the batches
seen (a batch over twice the prediction is a stall and left out, unless three come in a
row); with a single batch size seen, or a line with a negative part, it scales the mean
batch's latency linearly (a cautious guess: it charges the fixed cost per row).

Time comes from ``clock`` (seconds, default ``time.monotonic``) so that tests and the
simulator drive it. ``AIMDConfig`` holds the settings (plain values: the runtime and
the simulator build their batchers from one), ``aimd_config`` what a stage of a plan
served under an SLO gets.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from flow.errors import FlowTypeError, FlowValueError
from optimizer.slo._check import positive_int, positive_number

FIT_WEIGHT = 0.05  # weight of the newest batch in the latency fit (about the last 20 batches)
EPS_MS = 1e-6  # the fit's rounding: a batch the curve puts at the budget is within it
OUTLIER = 2.0  # a batch this many times slower than the fit is a stall...
OUTLIER_RUN = 3  # ...unless this many come in a row
BY_SIZE_WEIGHT = 0.2  # weight of a batch in its size's recent latency
CEILING_BATCHES = 200  # a full batch over budget stops the curve's increases past it this long

#: the longest delay window, as a share of the budget (Clipper: 2 ms at a 20 ms SLO). A
#: replica that waits for a batch serves the rate with less work, but each waiting request
#: pays the wait in full (docs/slo.md "AIMD batcher")
DELAY_SHARE = 0.1
#: the share of a stage's budget one batch may take (``aimd_config``): a request that
#: arrives while a batch runs waits for it, then runs in its own (docs/slo.md "AIMD
#: batcher")
BATCH_SHARE = 0.5
#: a planned stage's batch may grow to this many times the planned size
HEADROOM = 2


class _LatencyFit:
    """latency(b) = a + c*b by exponentially weighted least squares over observed batches.
    A batch that took over ``OUTLIER`` times the prediction is a stall and left out, unless
    ``OUTLIER_RUN`` come in a row (then the stage got slower, and the fit follows)."""

    def __init__(self, weight: float = FIT_WEIGHT):
        self.w = weight
        self.n = 0
        self.s = [0.0] * 5  # means of 1, b, b*b, L, b*L (weighted)
        self.outliers = 0  # in a row

    def add(self, b: int, ms: float) -> bool:
        """Add a batch; False if it was left out as a stall."""
        if self.n and ms > OUTLIER * self(b):
            self.outliers += 1
            if self.outliers < OUTLIER_RUN:
                return False
        self.outliers = 0
        w = 1.0 if self.n == 0 else self.w
        for i, v in enumerate((1.0, b, b * b, ms, b * ms)):
            self.s[i] += w * (v - self.s[i])
        self.n += 1
        return True

    def _line(self) -> tuple[float, float] | None:
        """(a, c) when the batches seen pin a line down, else None."""
        _, mb, mbb, ml, mbl = self.s
        var = mbb - mb * mb
        if var < 0.01:  # one size seen
            return None
        c = (mbl - mb * ml) / var
        a = ml - c * mb
        return None if c < 0 or a < 0 else (a, c)  # noise (or a change) a line cannot follow

    @property
    def line(self) -> bool:
        return self.n > 0 and self._line() is not None

    def __call__(self, b: float) -> float:
        line = self._line()
        if line is None:  # scale the mean batch: charges the fixed cost per row (cautious)
            return self.s[3] * b / self.s[1]
        return line[0] + line[1] * b


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
        utilisation: float = 0.8,
        rate_window_ms: float = 1000.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.budget_ms = positive_number("AIMDBatcher.budget_ms", budget_ms)
        self.step = positive_int("AIMDBatcher.step", step)
        self.decrease = positive_number("AIMDBatcher.decrease", decrease)
        if not self.decrease < 1:
            raise FlowValueError(f"AIMDBatcher.decrease must be in (0, 1), got {decrease!r}")
        self.min_batch = positive_int("AIMDBatcher.min_batch", min_batch)
        self.max_batch = positive_int("AIMDBatcher.max_batch", max_batch, minimum=self.min_batch)
        self.size = positive_int("AIMDBatcher.start", start, minimum=self.min_batch)
        if self.size > self.max_batch:
            raise FlowValueError(f"AIMDBatcher.start ({start!r}) exceeds max_batch ({max_batch!r})")
        self.max_delay_ms = (
            self.budget_ms * DELAY_SHARE
            if max_delay_ms is None
            else positive_number("AIMDBatcher.max_delay_ms", max_delay_ms, allow_zero=True)
        )
        self.utilisation = positive_number("AIMDBatcher.utilisation", utilisation)
        if self.utilisation > 1:
            raise FlowValueError(f"AIMDBatcher.utilisation must be in (0, 1], got {utilisation!r}")
        self.rate_window_ms = positive_number("AIMDBatcher.rate_window_ms", rate_window_ms)
        if not callable(clock):
            raise FlowTypeError(f"clock must be a callable returning seconds, got {clock!r:.80}")
        self.clock = clock
        self._arrivals: deque[float] = deque()  # ms timestamps within the rate window
        self.fit = _LatencyFit()
        self.increases = self.decreases = 0
        self.ceiling: int | None = None  # the last full batch over budget (the curve may not pass it)
        self.by_size: dict[int, float] = {}  # batch size -> its cost (ms), weighted to the recent
        self._last_done: float | None = None  # clock when the last batch was observed
        self._arrived = self._served = 0  # requests counted by arrived() / observe()
        self._waiting_at_done = 0  # requests left waiting when the last batch ended
        self._since_over = 0

    @property
    def batch_size(self) -> int:
        """The most requests the next batch may take."""
        return self.size

    def latency_ms(self, batch: int) -> float | None:
        """The fitted latency of a batch of ``batch`` requests (None before any batch)."""
        return self.fit(batch) if self.fit.n else None

    def observe(self, batch: int, latency_ms: float) -> int:
        """Feed one finished batch (its size and how long the call took); returns the new
        allowed batch size."""
        batch = positive_int("batch size", batch)
        latency_ms = positive_number("latency_ms", latency_ms, allow_zero=True)
        known = self.fit.n > 0
        fits = self.fitted_cap() if known else None
        now = self.clock()
        full = batch >= self.size
        # a batch that started while requests were waiting ran back to back with the one
        # before: the time between their ends is what the replica really spends on it (on a
        # loaded machine the thread also waits for a CPU between calls, which the call's own
        # latency does not show)
        cost = latency_ms
        if self._waiting_at_done > 0 and self._last_done is not None:
            cost = max(latency_ms, (now - self._last_done) * 1000.0)
        self._last_done = now
        self._served += batch
        self._waiting_at_done = self._arrived - self._served
        if self.fit.add(batch, latency_ms):
            seen = self.by_size.get(batch)
            self.by_size[batch] = cost if seen is None else seen + BY_SIZE_WEIGHT * (cost - seen)
        if latency_ms > self.budget_ms:
            if full and batch * self.utilisation < self.rate_per_ms() * cost and self.size < self.max_batch:
                # a full batch over budget that does not even keep up with the arrivals (with
                # the replica at most ``utilisation`` busy): a smaller cap would let the queue
                # grow without bound, and then no request meets any budget (a machine too
                # slow for it): keep up first
                self.size = min(self.max_batch, self.size + self.step)
                self.increases += 1
                return self.size
            if known and self.fit(self.min_batch) > self.budget_ms:
                return self.size  # out of reach even for the smallest batch: a cut buys nothing
            # cut 10% from the largest batch the curve (before this one) puts within budget:
            # from this batch's size when nothing is known yet; not from a stalled small batch
            if full:  # a full batch: the knee may be where no line bends
                self.ceiling, self._since_over = batch, 0
            base = min(batch, self.size) if fits is None else min(fits, self.size)
            cut = max(self.min_batch, min(self.size - 1, math.floor(base * self.decrease)))
            self.size = max(cut, min(self.size, self.stable_batch()))  # not below what keeps up
            self.decreases += 1
            return self.size
        self._since_over += 1
        if self.ceiling is not None and self._since_over >= CEILING_BATCHES:
            self.ceiling = None
        curve_allows = (self.ceiling is None or self.size + self.step < self.ceiling) and self.fit(
            self.size + self.step
        ) <= self.budget_ms + EPS_MS
        if self.size < self.max_batch and (batch >= self.size or curve_allows):
            self.size = min(self.max_batch, self.size + self.step)
            self.increases += 1
        elif self.fit.line and self.size > self.min_batch and self.fit(self.size) > self.budget_ms + EPS_MS:
            self.size -= 1  # the curve no longer puts the cap within budget: one step back
        return self.size

    def fitted_cap(self) -> int:
        """The largest batch (up to ``max_batch``) the fitted curve puts within the budget."""
        lo, hi = self.min_batch, self.max_batch
        budget = self.budget_ms + EPS_MS
        if self.fit(lo) > budget:
            return lo
        while lo < hi:  # the fit is non-decreasing in b
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.fit(mid) <= budget else (lo, mid - 1)
        return lo

    def arrived(self, n: int = 1) -> None:
        """Count ``n`` requests arriving now (for the arrival rate)."""
        now = self.clock() * 1000.0
        n = positive_int("n", n)
        self._arrived += n
        for _ in range(n):
            self._arrivals.append(now)
        self._trim(now)

    def _trim(self, now_ms: float) -> None:
        while self._arrivals and self._arrivals[0] <= now_ms - self.rate_window_ms:
            self._arrivals.popleft()

    def rate_per_ms(self) -> float:
        """Arrivals per millisecond over the last ``rate_window_ms``."""
        self._trim(self.clock() * 1000.0)
        return len(self._arrivals) / self.rate_window_ms

    def stable_batch(self) -> int:
        """The smallest batch size seen whose throughput (its recent cost) keeps up with the
        arrival rate with the replica at most ``utilisation`` busy (a queue at 100% grows
        without bound); ``min_batch`` when none does or no traffic."""
        rate = self.rate_per_ms()
        for b in sorted(self.by_size):
            if rate > 0 and b * self.utilisation >= rate * self.by_size[b] - EPS_MS:
                return b
        return self.min_batch

    def delay_ms(self) -> float:
        """How long a free replica holding one request should wait for more (0: run it):
        the time b - 1 more requests take to arrive, for the largest b (up to the cap) whose
        wait fits ``max_delay_ms`` and the budget left by latency(b), and whose run keeps
        the replica under ``utilisation`` at the current rate (else the wait is time the
        replica owes to the queue)."""
        rate = self.rate_per_ms()
        if not self.fit.n or rate <= 0:
            return 0.0
        window = 0.0
        for b in range(2, self.size + 1):  # the bounds grow with b: stop at the first miss
            wait, ms = (b - 1) / rate, self.fit(b)
            if wait > self.max_delay_ms or wait + ms > self.budget_ms or rate * ms > self.utilisation:
                break
            window = wait
        return window


@dataclass(frozen=True)
class AIMDConfig:
    """An ``AIMDBatcher``'s settings as plain values (it pickles with a plan, the simulator
    and the executor build their batchers from one)."""

    budget_ms: float
    start: int = 1
    max_batch: int = 256
    min_batch: int = 1
    step: int = 1
    decrease: float = 0.9
    utilisation: float = 0.8
    max_delay_ms: float | None = None

    def __post_init__(self):
        self.batcher()  # check the settings now, naming the bad one

    def batcher(self, clock: Callable[[], float] = time.monotonic) -> AIMDBatcher:
        return AIMDBatcher(
            self.budget_ms,
            start=self.start,
            max_batch=self.max_batch,
            min_batch=self.min_batch,
            step=self.step,
            decrease=self.decrease,
            utilisation=self.utilisation,
            max_delay_ms=self.max_delay_ms,
            clock=clock,
        )


def _planned_batch_ms(serving, stage: str, batch_size: int) -> float:
    """What the planned batch takes at the SLO's percentile in the plan's profile (0 if not
    known). The planner checked the whole configuration in the simulator, queueing
    included, and a stage's budget is its share of the SLO at the batch it *usually* ran
    there (smaller than the cap), so half of it may be less than the planned batch, or
    even a batch of one, takes: AIMD would then hold the stage at batch 1 and undo the plan.
    A planned stage's batch may always take what its planned batch takes."""
    config = serving.configs.get(stage)
    profile = serving.profile()
    if config is None or profile is None or stage not in profile.stages:
        return 0.0
    try:
        return profile.latency(stage, config.executor_class, batch_size, serving.slo.percentile)
    except FlowValueError:  # not profiled on that class or size
        return 0.0


def aimd_config(serving, stage: str, batch_size: int) -> AIMDConfig | None:
    """What AIMD a stage gets in a plan served under ``serving`` (a ``ServingSLO``, or None)
    whose batch size is ``batch_size`` (planned, or the fixed cap): None without an SLO,
    a budget for the stage, or with ``adapt=False``; a batch gets ``BATCH_SHARE`` of the
    stage's budget; a planned stage starts at its planned size and may grow to
    ``HEADROOM`` times it, an unplanned one climbs from 1 to its cap."""
    if serving is None or not serving.adapt:
        return None
    budget = serving.budgets.get(stage)
    if not budget:
        return None
    if serving.planned:
        return AIMDConfig(
            max(budget * BATCH_SHARE, _planned_batch_ms(serving, stage, batch_size)),
            start=batch_size,
            max_batch=batch_size * HEADROOM,
        )
    return AIMDConfig(budget * BATCH_SHARE, max_batch=batch_size)
