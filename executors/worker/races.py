"""Races on an executor: which races were won (here, or by a copy elsewhere that said so with
a ``Cancel``), so that their losing copies are dropped while queued, on arrival, or as they
finish; and the copies running here, whose ``flow.wait`` returns when their race is won.

The same for whole requests the gateway gave up on (its client disconnected, or the
deadline passed: a ``Revoke``): their inputs are dropped while queued or on arrival, their
outputs are not sent on, and a run that serves only such requests is told (``flow.wait``
returns); a run that also serves live requests (a batch) goes on, and only the given-up
requests' rows of its output are dropped.

A stage races when its copies compete (``competitive > 1``) or when it is hedged (a backup
copy); not a continuation, whose key groups each race on their own.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from executors import tracing
from executors.wire.messages import Cancel, RawInput, StageInput

CANCEL_MEMORY = 100_000  # races won (request attempt, stage) remembered to drop their losing copies
CANCEL_TTL_S = 60.0  # ...each until the request's deadline, or this long if it has none
REVOKED_MEMORY = 100_000  # requests given up on, remembered to drop their late inputs...
REVOKED_TTL_S = 60.0  # ...each this long: an upstream stage's output still on its way is dropped on arrival


def raced(stage) -> bool:
    """True for a stage whose copies race (competitive, or hedged: a backup copy) and whose
    losing copies are cancelled (not a continuation: each key group races on its own)."""
    return stage.continuation is None and (stage.competitive > 1 or stage.hedge is not None)


class RunCancel:
    """Tells one run that the runtime gave up on it (its race was won elsewhere, or its
    requests were given up on): ``set`` here, read by the operator through ``flow.wait``
    and ``flow.cancelled`` (flow/context.py). The same answers as a ``threading.Event``, whose
    Condition and lock cost more to make than a no-op stage's run: every run gets a flag,
    and only a run whose operator waits makes an Event, at its first wait."""

    __slots__ = ("_set", "_event")

    def __init__(self):
        self._set = False
        self._event: threading.Event | None = None

    def set(self) -> None:
        self._set = True
        ev = self._event
        if ev is not None:
            ev.set()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        ev = self._event
        if ev is None:
            with _EVENTS_LOCK:
                ev = self._event
                if ev is None:
                    ev = self._event = threading.Event()
            if self._set:  # set between the check above and the Event's making: it saw no Event
                ev.set()
        return ev.wait(timeout)


_EVENTS_LOCK = threading.Lock()


class Races:
    """The races won that this executor knows of, and its copies running now.

    ``cancelled`` is read without the lock on the data path (``if cancelled and key in
    cancelled``: a dict's membership test is atomic, and empty is the common case); it is
    changed only under ``lock``, the lock the executor's inputs share (executor.py)."""

    def __init__(self, lock: threading.Lock, send, address: str):
        self.lock = lock
        self.send = send
        self.address = address
        # (gateway, request, attempt, stage) -> expiry (wall clock): races won, whose other
        # copies are dropped if still queued here or yet to arrive
        self.cancelled: OrderedDict = OrderedDict()
        self._running: dict = {}  # the same key -> RunCancels of its copies running here (flow.wait returns on set)
        self.executor = ""  # this executor's id, named by the spans of copies dropped here
        # (gateway, request) -> expiry (wall clock): requests the gateway gave up on (Revoke).
        # Read without the lock on the data path, as ``cancelled``
        self.revoked: OrderedDict = OrderedDict()
        self._serving: dict = {}  # (gateway, request) -> [_Serving] of the runs here that serve it

    def cancel(self, key: tuple, deadline: float | None) -> bool:
        """Remember that the race of ``key`` (gateway, request, attempt, stage) was won: its
        copies still queued here are dropped when their turn comes (``lost``), and copies
        arriving later are not gathered. False if it was known already."""
        with self.lock:
            if key in self.cancelled:
                return False
            self.cancelled[key] = (deadline if deadline is not None else time.time()) + (
                1.0 if deadline is not None else CANCEL_TTL_S
            )
            if len(self.cancelled) > CANCEL_MEMORY:
                self.cancelled.popitem(last=False)
            for ev in self._running.get(key, ()):
                ev.set()  # a copy running here that waits in flow.wait stops now
            return True

    def lost(self, hosted, h: StageInput) -> bool:
        """True if ``h`` is a copy of a race already won (queued here, or just run)."""
        return raced(hosted.stage) and bool(self.cancelled) and (h.gateway, h.req, h.attempt, h.stage) in self.cancelled

    def cancel_rivals(self, h: StageInput) -> None:
        """This copy of a racing stage finished first here and its output has gone (in the
        same corked write, after it): tell the executors of the other copies to drop theirs
        if still queued, or their output if still running. A crash of this executor after
        the cancel still answers: the gateway re-runs what was in flight on a dead executor
        as a new attempt, which no cancel names. Not for continuation stages (each key group
        races on its own: a cancel would name them all)."""
        if not self.cancel((h.gateway, h.req, h.attempt, h.stage), h.deadline):
            return  # another copy won (it told us) or a copy here already told the rivals
        rivals = {a for a in h.routes.get(h.stage, ()) if a != self.address}
        if rivals:
            frames = Cancel(h.gateway, h.req, h.attempt, h.stage).encode()
            for address in rivals:
                self.send(address, frames)

    def dropped(self, h: StageInput | RawInput) -> None:
        """A copy of a race already won was dropped here before it ran (queued, or on
        arrival): when its request is traced, a span of no duration says so."""
        if tracing.tracer is not None and tracing.sampled(h.tp):
            tracing.event(
                f"stage {h.stage}",
                h.tp,
                {
                    "flowserve.flow": h.flow,
                    "flowserve.stage": h.stage,
                    "flowserve.executor": self.executor,
                    "flowserve.race.copy": h.copy,
                    "flowserve.race.outcome": "cancelled",
                },
            )

    def start(self, key: tuple, ev: RunCancel) -> bool:
        """A copy of ``key``'s race starts running here, stopped early by ``ev`` (set when the
        race is won elsewhere); False if it was won already: do not run it."""
        with self.lock:
            if self.cancelled and key in self.cancelled:
                return False
            self._running.setdefault(key, []).append(ev)
            return True

    def finish(self, key: tuple, ev: RunCancel) -> None:
        """The copy that ``start`` registered is done."""
        with self.lock:
            evs = self._running.pop(key, [])
            if len(evs) > 1:
                evs.remove(ev)
                self._running[key] = evs

    def expire(self, now: float) -> None:
        """Forget races whose requests are over, and requests given up on long ago."""
        with self.lock:
            while self.cancelled:  # oldest first (deadlines come roughly in order): stop at a live one
                key, until = next(iter(self.cancelled.items()))
                if until >= now:
                    break
                del self.cancelled[key]
            while self.revoked:  # in the order revoked, each for the same time
                key, until = next(iter(self.revoked.items()))
                if until >= now:
                    break
                del self.revoked[key]

    # -- requests given up on (Revoke) -----------------------------------------------------

    def revoke(self, gateway: str, reqs: list, now: float) -> list:
        """Remember that ``gateway`` gave up on requests ``reqs``; tell each run here that
        serves only such requests (its event is set: ``flow.wait`` returns). The caller
        holds ``lock``. Returns the (gateway, request) keys newly revoked."""
        until = now + REVOKED_TTL_S
        fresh = []
        for req in reqs:
            key = (gateway, req)
            if key in self.revoked:
                continue
            self.revoked[key] = until
            fresh.append(key)
            for serving in self._serving.get(key, ()):
                serving.live -= 1
                if serving.live <= 0:
                    serving.event.set()
        while len(self.revoked) > REVOKED_MEMORY:
            self.revoked.popitem(last=False)
        return fresh

    def given_up(self, h: StageInput) -> bool:
        """True if the gateway gave up on ``h``'s request (checked on the data path)."""
        return bool(self.revoked) and (h.gateway, h.req) in self.revoked

    def begin_run(self, messages: list, event: RunCancel) -> _Serving | None:
        """A run of ``messages``' requests starts here, told by ``event`` when every one of
        them is given up on; None if that is so already (do not run it). ``end_run`` ends it."""
        with self.lock:
            if len(messages) == 1:
                m = messages[0]
                keys = {(m.gateway, m.req)}
            else:
                keys = {(m.gateway, m.req) for m in messages}
            if self.revoked:
                keys = {k for k in keys if k not in self.revoked}
                if not keys:
                    return None
            serving = _Serving(keys, len(keys), event)
            for key in keys:
                self._serving.setdefault(key, []).append(serving)
            return serving

    def end_run(self, serving: _Serving) -> None:
        """The run ``begin_run`` registered is over."""
        with self.lock:
            for key in serving.keys:
                runs = self._serving.pop(key, None)
                if runs is not None and len(runs) > 1:
                    runs.remove(serving)
                    self._serving[key] = runs


class _Serving:
    """One run in progress and the requests it serves still live (``live`` of ``keys``)."""

    __slots__ = ("keys", "live", "event")

    def __init__(self, keys: set, live: int, event: RunCancel):
        self.keys, self.live, self.event = keys, live, event
