"""The executor's side of Clipper's layer (flow/prediction.py): reactive hedging, deadline
answers, and what a stage reports to the gateway's /metrics about them and its cache.

Only stages that ask for one of these get the pieces (``equip``); every other stage keeps
``hosted.hedger``, ``hosted.early`` and ``hosted.report`` at None, which the executor's
hot path tests and passes by.

Hedging (``map(..., hedge="p95")``): the dispatcher names two replicas of a hedged stage
in the routing table and sends the input to the first only (routing.deliveries). The
replica that holds the input arms a timer at the stage's observed percentile of its own
arrival-to-answer latency (no hedge until ``MIN_SAMPLES`` are seen) or at the fixed
delay; when it fires and the run has not answered, the same input goes to the second
replica as copy ``BACKUP``. Both answers go on to the consumers, which keep the first
(an input part that came already, or a request done, is dropped) -- as racing copies
are. A backup copy is never hedged again.

Deadline answers (``ensemble``): when the first member's input of a request arrives and
others are still missing, a timer is set at the request's deadline (less a margin, a tenth of the time left within 50-500 ms, so
the answer beats the gateway's 504) or ``deadline_ms`` later, whichever is sooner. If
the inputs are still incomplete then, the ensemble runs on what has arrived (a missing
member's input is None) and late inputs are dropped. A member whose run the watchdog
abandons at the request's deadline sends no 504 (outputs.Outputs.fail): it is just missing.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import threading
import time
from collections import deque

import numpy as np

from executors import tracing
from executors.wire.routing import complete, merge
from executors.worker.batcher import WorkItem
from executors.worker.prediction_cache import CachedOperator
from flow.prediction import cache_prefix

log = logging.getLogger("flowserve.executor")

BACKUP = 1  # StageInput.copy of a hedge's backup (hedged stages never race: copy is 0 otherwise)
MIN_SAMPLES = 20  # a percentile hedge waits for this many observed runs
MARGIN_S = 0.05  # a deadline answer runs at least this long before the request's deadline,
MARGIN_SHARE = 0.1  # or this share of the time left when it is armed (up to MAX_MARGIN_S), so a
MAX_MARGIN_S = 0.5  # loaded machine's late timer still beats the gateway's 504


class Timers:
    """One thread running callbacks at monotonic times (a heap under a condition)."""

    def __init__(self):
        self._heap: list = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="clipper-timers", daemon=True)
        self._thread.start()

    def at(self, when: float, fn, *args) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), fn, args))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else max(0.0, self._heap[0][0] - time.monotonic()))
                _, _, fn, args = heapq.heappop(self._heap)
            try:
                fn(*args)
            except Exception:  # a timer's work is one request's: never the thread's end
                log.exception("a clipper timer failed")


_timers: Timers | None = None
_timers_lock = threading.Lock()


def timers() -> Timers:
    global _timers
    with _timers_lock:
        if _timers is None:
            _timers = Timers()
        return _timers


class Hedger:
    """One hedged stage on one executor: arms backups, learns the latency percentile."""

    def __init__(self, hedge, address: str, send):
        self.hedge = hedge
        self.address = address
        self.send = send
        self.recent: deque = deque(maxlen=500)
        self.open: dict = {}  # (gateway, req, attempt) -> [arrived (monotonic), hedged]
        self.lock = threading.Lock()
        self._delay: float | None = None
        self._since = 0

    def delay_s(self) -> float | None:
        if not isinstance(self.hedge, str):
            return self.hedge
        if self._since >= 10 or self._delay is None:  # recomputed every 10 observations
            if len(self.recent) < MIN_SAMPLES:
                return None
            self._delay = float(np.percentile(np.asarray(self.recent), float(self.hedge[1:]))) / 1000
            self._since = 0
        return self._delay

    def arm(self, item: WorkItem) -> None:
        h = item.message
        if h.copy == BACKUP:
            return
        key = (h.gateway, h.req, h.attempt)
        now = time.monotonic()
        with self.lock:
            self.open[key] = [now, False]
            delay = self.delay_s()
        backups = [a for a in h.routes.get(h.stage, ())[1:] if a != self.address]
        if delay is None or not backups:
            return
        timers().at(now + delay, self._fire, key, item, backups[0])

    def _fire(self, key, item: WorkItem, address: str) -> None:
        with self.lock:
            state = self.open.get(key)
            if state is None:
                return  # answered in time
            state[1] = True
        h = item.message
        if h.deadline is not None and time.time() > h.deadline:
            return
        self.send(address, h.to(h.stage, h.source, (), BACKUP, item.inputs[0], item.trace).encode())
        if tracing.tracer is not None and tracing.sampled(h.tp):
            tracing.event(
                f"hedge {h.stage}",
                h.tp,
                {"flowserve.flow": h.flow, "flowserve.stage": h.stage, "flowserve.hedge.to": address},
            )

    def finish(self, item: WorkItem) -> dict | None:
        h = item.message
        if h.copy == BACKUP:
            return {"hedge": "backup"}
        with self.lock:
            state = self.open.pop((h.gateway, h.req, h.attempt), None)
            if state is None:
                return None
            self.recent.append((time.monotonic() - state[0]) * 1000)
            self._since += 1
        return {"hedge": "sent"} if state[1] else None

    def forget(self, item: WorkItem) -> None:
        with self.lock:
            self.open.pop((item.message.gateway, item.message.req, item.message.attempt), None)


class EarlyAnswers:
    """One ensemble stage on one executor: answers at the deadline with what arrived, taking
    the request's inputs from ``inputs`` (inputs.Inputs) and running it with ``run_one``."""

    def __init__(self, inputs, run_one, hosted):
        self.inputs = inputs
        self.run_one = run_one
        self.hosted = hosted
        op = hosted.stage.nodes[0].op
        self.after_s = None if op.deadline_ms is None else op.deadline_ms / 1000
        self.armed: set = set()

    def arm(self, h, rid) -> None:
        """Called under the inputs' lock when an input arrived and others are missing."""
        if rid in self.armed:
            return
        self.armed.add(rid)
        now_wall, now = time.time(), time.monotonic()
        left = float("inf") if h.deadline is None else h.deadline - now_wall
        wait = left - min(max(MARGIN_S, MARGIN_SHARE * left), MAX_MARGIN_S)
        if self.after_s is not None:
            wait = min(wait, self.after_s)
        if wait == float("inf"):
            return
        timers().at(now + max(0.0, wait), self._fire, h, rid)

    def _fire(self, h, rid) -> None:
        pend = self.inputs.claim(rid)  # members that answer later are dropped
        self.armed.discard(rid)  # after the claim: rid is done, so no input arms it again
        if pend is None:
            return  # every member answered in time
        stage = self.hosted.stage
        inputs = [merge(pend.parts[s]) if s in pend.parts and complete(pend.parts[s]) else None for s in stage.inputs]
        if h.deadline is not None:  # the gateway waits a little past the deadline: this answer may use it
            h = dataclasses.replace(h, deadline=h.deadline + MARGIN_S)
        # run here, not queued behind the pool's work (a combine is cheap; the deadline is near)
        self.run_one(self.hosted, WorkItem(h, inputs, (), pend.trace))


def equip(hosted, address: str, send, inputs, run_one) -> None:
    """Give a newly built stage the pieces it asks for (none for a plain stage): a hedger
    sends backups from ``address`` with ``send``; deadline answers take a request's inputs
    from ``inputs`` and run it with ``run_one`` (the executor's Inputs and Runner)."""
    stage = hosted.stage
    caches = [b for b in hosted.bound.bound if isinstance(b, CachedOperator)]
    if stage.hedge is not None:
        hosted.hedger = Hedger(stage.hedge, address, send)
    if stage.deadline_answers:
        hosted.early = EarlyAnswers(inputs, run_one, hosted)
    for c in caches:
        if c.spec.shared:
            c.share(cache_prefix(hosted.plan.flow_name, hosted.version, c.name))
    if caches:
        # hits are quick and misses are the model's cost: an average would mark the stage
        # cheap and run misses on the IO thread, stalling every other message. Keep it on the pool.
        hosted.pooled = True
    if caches or hosted.hedger is not None:
        hosted.report = lambda item: _report(hosted, caches, item)


def _report(hosted, caches, item: WorkItem) -> dict | None:
    """What this stage's trace entry adds for the gateway's /metrics (metrics.py)."""
    extra = {}
    if caches:
        hits = misses = shared = 0
        for c in caches:
            h, m, sh = c.take_counts()
            hits, misses, shared = hits + h, misses + m, shared + sh
        if hits or misses or shared:
            extra["cache"] = [hits, misses, shared] if shared else [hits, misses]
    if hosted.hedger is not None:
        mark = hosted.hedger.finish(item)
        if mark:
            extra.update(mark)
    return extra or None
