"""Per-stage batching on an executor: up to ``max_batch_size`` requests, waiting at most
``max_wait_ms`` after the first one for more (Clipper's delayed batching). The default
window is 0: a batch is what is queued when the stage is free.

The wait is adaptive: a batcher only waits when requests have lately been arriving less
than ``max_wait_ms`` apart (an exponentially weighted mean of the gaps), so a lone request
at low load runs at once instead of paying the whole window for a batch that will not come,
and only while waiting has lately paid off (brought at least one more request). The second
rule matters for closed-loop clients: one client that sends its next request when the
answer comes arrives often, yet nothing ever comes during a wait. A batcher that stopped
waiting tries again every ``PROBE_EVERY`` batches. Whatever is already queued is always taken.

Under a latency SLO (``plan.slo``, optimizer/slo/sizing.py) the cap and the window are
Clipper's AIMD instead (optimizer/slo/aimd.py ``aimd_config``, which the simulator models
too): each batch gets half the stage's budget (a request may wait for the batch in
progress, then run in its own); the cap grows by one after a batch within it (full, or
one the fitted latency curve says could have been bigger) and drops 10% after one over
it, never below what keeps up with the arrival rate; it starts at the planned size and
grows to at most ``HEADROOM`` times it (unplanned: from 1 to the fixed cap). The window,
up to 10% of the budget, opens only on a stage cheap for its arrival rate, for the
batch whose run still leaves the replica idle between batches: a busy stage's queue grows
its batches by itself. Without an SLO the fixed cap stays."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from executors.wire.messages import StageInput
from optimizer.slo import AIMDBatcher
from optimizer.slo.aimd import aimd_config

PROBE_EVERY = 50  # batches run without waiting before a batcher that stopped tries again


@dataclass
class WorkItem:
    """One request's ready inputs for one stage."""

    message: StageInput  # the input that made it ready (request, attempt, routes, deadline)
    inputs: list
    path: tuple = ()
    trace: list = field(default_factory=list)
    after_head: bool = False  # first_valid stages: the head (choice) is already applied
    ready: float = 0.0  # perf_counter when it became ready, for a traced run's queue wait (0: untraced)


class Batcher:
    """A thread that drains a stage's queue into batches and hands them to ``run``."""

    def __init__(self, hosted, run, stopping: threading.Event):
        self.hosted = hosted
        self.config = hosted.stage.batch
        self.run = run
        self.queue: queue.Queue[WorkItem] = queue.Queue()
        self._stopping = stopping
        self._last_put = 0.0
        self.gap_ewma = float("inf")  # seconds between arrivals; no waiting until measured
        self.payoff = 1.0  # weighted share of recent waits that brought another request
        self._since_wait = 0
        self.aimd = aimd_for(hosted)  # None: the fixed cap and window of ``config``
        self._aimd_lock = threading.Lock()  # arrivals come from the IO thread, batches from this one
        self.thread = threading.Thread(target=self._loop, name=f"batcher-{hosted.stage.name}", daemon=True)
        self.thread.start()

    @property
    def max_size(self) -> int:
        """The most requests the next batch may take."""
        return self.aimd.batch_size if self.aimd is not None else self.config.max_batch_size

    def wait_s(self) -> float:
        """How long a free replica waits for its batch to fill."""
        if self.aimd is None:
            return self.config.max_wait_ms / 1000
        with self._aimd_lock:
            return self.aimd.delay_ms() / 1000

    def replace_thread(self) -> None:
        """The batcher's thread is held by abandoned work (watchdog.py): a new thread drains
        the queue from now on; the old one exits when (if ever) its call returns."""
        self.thread = threading.Thread(target=self._loop, name=f"batcher-{self.hosted.stage.name}", daemon=True)
        self.thread.start()

    def note_arrival(self) -> None:
        if self.aimd is not None:
            with self._aimd_lock:
                self.aimd.arrived()
        now = time.perf_counter()
        if self._last_put:
            gap = now - self._last_put
            self.gap_ewma = gap if self.gap_ewma == float("inf") else 0.7 * self.gap_ewma + 0.3 * gap
        self._last_put = now

    def worth_waiting(self) -> bool:
        """True if requests arrive often enough, and waits lately paid off (or it is time
        to try again), so that waiting is likely to grow a batch."""
        if self.aimd is not None:
            return self.wait_s() > 0
        if self.gap_ewma >= self.config.max_wait_ms / 1000:
            return False
        return self.payoff >= 0.5 or self._since_wait >= PROBE_EVERY

    def should_wait(self) -> bool:
        """True if a request should go through the queue (to wait, or behind others)."""
        return not self.queue.empty() or self.worth_waiting()

    def alone(self) -> bool:
        """True if a request arriving now runs as a batch of its own, not through the queue
        (nothing queued, no wait worth it); it is then counted as an arrival and a batch
        that did not wait."""
        if self.should_wait():
            return False
        self.note_arrival()
        self.learn(False, 1)
        return True

    def learn(self, waited: bool, batch_size: int) -> None:
        """Record how a batch formed (inline runs count as batches that did not wait)."""
        if waited:
            self.payoff = 0.7 * self.payoff + 0.3 * (batch_size > 1)
            self._since_wait = 0
        else:
            self._since_wait += 1

    def put(self, item: WorkItem) -> None:
        self.note_arrival()
        self.queue.put(item)

    def __len__(self) -> int:
        return self.queue.qsize()

    def _loop(self) -> None:
        max_size, wait = self.config.max_batch_size, self.config.max_wait_ms / 1000
        aimd = self.aimd
        me = threading.current_thread()
        while not (self._stopping.is_set() and self.queue.empty()) and self.thread is me:
            try:
                first = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            batch = [first]
            if aimd is not None:
                max_size, wait = self.max_size, self.wait_s()
            # wait for more only if another request is likely to come within the window
            waiting = self.queue.empty() and self.worth_waiting()
            deadline = time.perf_counter() + (wait if waiting else 0.0)
            while len(batch) < max_size:
                try:  # take what is already queued without waiting
                    batch.append(self.queue.get_nowait())
                    continue
                except queue.Empty:
                    pass
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                try:
                    batch.append(self.queue.get(timeout=left))
                except queue.Empty:
                    break
            self.learn(waiting, len(batch))
            if aimd is None:
                self.run(self.hosted, batch)
                continue
            t0 = time.perf_counter()
            self.run(self.hosted, batch)
            with self._aimd_lock:
                aimd.observe(len(batch), (time.perf_counter() - t0) * 1000)


def aimd_for(hosted) -> AIMDBatcher | None:
    """The stage's AIMD batcher when its plan is served under an SLO, else None
    (optimizer/slo/aimd.py ``aimd_config``: the simulator models the same one)."""
    config = aimd_config(getattr(hosted.plan, "slo", None), hosted.stage.name, hosted.stage.batch.max_batch_size)
    return None if config is None else config.batcher()
