"""Per-stage batching on an executor: up to ``max_batch_size`` requests, waiting at most
``max_wait_ms`` after the first one for more (Clipper's delayed batching). The default
window is 0: a batch is what is queued when the stage is free.

The wait is adaptive: a batcher only waits when requests have lately been arriving less
than ``max_wait_ms`` apart (an exponentially weighted mean of the gaps), so a lone request
at low load runs at once instead of paying the whole window for a batch that will not come,
and only while waiting has lately paid off (brought at least one more request). The second
rule matters for closed-loop clients: one client that sends its next request when the
answer comes arrives often, yet nothing ever comes during a wait. A batcher that stopped
waiting tries again every ``PROBE_EVERY`` batches. Whatever is already queued is always taken."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from executors.messages import StageInput

PROBE_EVERY = 50  # batches run without waiting before a batcher that stopped tries again


@dataclass
class WorkItem:
    """One request's ready inputs for one stage."""

    message: StageInput  # the input that made it ready (request, attempt, routes, deadline)
    inputs: list
    path: tuple = ()
    trace: list = field(default_factory=list)
    after_head: bool = False  # first_valid stages: the head (choice) is already applied


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
        self.thread = threading.Thread(target=self._loop, name=f"batcher-{hosted.stage.name}", daemon=True)
        self.thread.start()

    def replace_thread(self) -> None:
        """The batcher's thread is held by abandoned work (watchdog.py): a new thread drains
        the queue from now on; the old one exits when (if ever) its call returns."""
        self.thread = threading.Thread(target=self._loop, name=f"batcher-{self.hosted.stage.name}", daemon=True)
        self.thread.start()

    def note_arrival(self) -> None:
        now = time.perf_counter()
        if self._last_put:
            gap = now - self._last_put
            self.gap_ewma = gap if self.gap_ewma == float("inf") else 0.7 * self.gap_ewma + 0.3 * gap
        self._last_put = now

    def worth_waiting(self) -> bool:
        """True if requests arrive often enough, and waits lately paid off (or it is time
        to try again), so that waiting is likely to grow a batch."""
        if self.gap_ewma >= self.config.max_wait_ms / 1000:
            return False
        return self.payoff >= 0.5 or self._since_wait >= PROBE_EVERY

    def should_wait(self) -> bool:
        """True if a request should go through the queue (to wait, or behind others)."""
        return not self.queue.empty() or self.worth_waiting()

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
        me = threading.current_thread()
        while not (self._stopping.is_set() and self.queue.empty()) and self.thread is me:
            try:
                first = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            batch = [first]
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
            self.run(self.hosted, batch)
