"""The stages an executor hosts: built from their plans on a ``Load`` (or when a message needs
one not built here, e.g. after a restart), dropped on an ``Unload``, and their memory given
back to the OS when they go. A version the gateway retired is remembered, so that a late
message does not build it again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
import time
import weakref
from collections import OrderedDict

from executors.plans import load_plan
from executors.wire.messages import Load, Loaded, StageInput, Unload
from executors.worker.races import raced
from executors.worker.stage_runner import BoundStage
from flow.errors import FlowError, UnavailableError
from kvs.errors import SerializationError
from optimizer.plan import Plan

log = logging.getLogger("flowserve.executor")

CHEAP_MS = 2.0  # stages faster than this on average run on the IO thread...
COSTLY_MS = 2 * CHEAP_MS  # ...until they average more than this (a hysteresis, see HostedStage.observe)
BATCHER_EXIT_S = 2.0  # a batcher notices it was unloaded within its 0.2 s poll
RELEASE_WAIT_S = 30.0  # how long an unload keeps collecting until its stages are gone
RETIRED_MEMORY = 10_000  # (flow, version) pairs remembered as unloaded, not to be rebuilt


class HostedStage:
    """A stage built once on this executor (the replica), with its consumers' info."""

    # Clipper's pieces (executors/worker/hedging.py ``equip``), None on a stage that asks for none
    hedger = None
    early = None
    report = None

    def __init__(self, plan: Plan, name: str, version: int):
        self.plan = plan
        self.version = version
        self.stage = plan.stages[name]
        self.bound = BoundStage(self.stage)
        self.consumers = plan.consumers()[name]
        self.is_sink = plan.sink == name
        self.batcher = None  # batcher.Batcher, for a stage that batches (given by Stages' equip)
        self.ewma_ms = COSTLY_MS * 2  # unknown cost: start on the pool until measured
        self.cheap = False  # run on the IO thread (no thread hop) rather than on the pool
        # never on the IO thread, however quick: a racing copy there would run after the
        # other copies sent here (not beside them), and its flow.wait could not be stopped,
        # since the Cancel that stops it is read by that same thread
        self.pooled = raced(self.stage)
        s = self.stage
        # the producer one output of which makes it ready: whole, or (a continuation) one key group
        sole = len(s.inputs) == 1 and s.competitive <= 1 and s.wait != "first_valid"
        self.sole_input = s.inputs[0] if sole else None
        # one whole input makes it ready (Inputs._gather's short path)
        self.single_input = self.sole_input if s.continuation is None else None
        # its one consumer, which may run next in the same run when it is plain and here
        # (running.Runner._chained): not for a stage whose copies race or that has several
        consumers = self.consumers
        self.chains_to = (
            consumers[0]
            if len(consumers) == 1 and not self.is_sink and not self.pooled and s.competitive <= 1 and s.hedge is None
            else None
        )

    def observe(self, ms: float) -> None:
        """Record a run's cost. A stage whose average sits near one threshold would flip
        between the IO thread and the pool (a thread hop every other request, seen on a
        slow machine): it becomes cheap below CHEAP_MS and stops being so above COSTLY_MS."""
        self.ewma_ms = 0.8 * self.ewma_ms + 0.2 * ms
        self.cheap = not self.pooled and self.ewma_ms < (COSTLY_MS if self.cheap else CHEAP_MS)


class Stages:
    """The stages hosted here, by (flow, version, stage), and the versions retired.

    The other parts read ``hosted`` on every message without a lock (a dict lookup is
    atomic); it changes under ``lock`` when an unload drops stages, together with their
    pending inputs (``forget``), so a message is gathered either before or after it. The
    lock is the one Inputs and Races hold their tables under (executor.py).
    """

    def __init__(
        self, executor_id: str, store, send, fail, lock: threading.Lock, stopping: threading.Event, equip, forget
    ):
        self.id = executor_id
        self.store = store
        self.send = send
        self.fail = fail  # outputs.Outputs.fail: a request whose stage cannot be built here
        self.lock = lock
        self.stopping = stopping
        # what the running parts add to a stage built here (its batcher, Clipper's pieces),
        # given the stage and what ends its batcher; and what an unload drops besides its
        # stages, given (flow, version), called under ``lock``: executor.py composes both
        self.equip = equip
        self.forget = forget
        self.hosted: dict[tuple[str, int, str], HostedStage] = {}
        self.latest: dict[str, int] = {}
        # (flow, version) unloaded on the gateway's word: a late message for one must not
        # rebuild it from the store (it would hold its memory again, for nothing)
        self.retired: OrderedDict = OrderedDict()

    def load(self, msg: Load) -> None:
        """Build a flow version's stages (on a worker thread) and tell the gateway how it went."""
        flow, version = msg.flow, msg.version
        error = None
        try:
            plan = load_plan(self.store, flow, version)  # signed for this flow and version, or refused
            with self.lock:
                self.retired.pop((flow, version), None)  # asked for again: it is current after all
            for name in msg.stages or list(plan.stages):
                self.host(plan, name, version)
            self.latest[flow] = version
        except SerializationError as e:  # a refused plan: the message says why; no traceback to read
            log.error("executor %s: refusing to build flow %s v%s: %s", self.id, flow, version, e)
            error = f"{type(e).__name__}: {e}"
        except Exception as e:  # report it to the deployer instead of dying
            log.exception("loading flow %s v%s failed", flow, version)
            error = f"{type(e).__name__}: {e}"
        self.send(msg.reply, Loaded(self.id, flow, version, msg.token, error).encode())

    def host(self, plan: Plan, name: str, version: int) -> HostedStage:
        key = (plan.flow_name, version, name)
        hosted = self.hosted.get(key)
        if hosted is None:
            hosted = HostedStage(plan, name, version)
            hosted.retired = threading.Event()  # set by unload: its batcher thread ends
            self.equip(hosted, _Either(self.stopping, hosted.retired))
            self.hosted[key] = hosted
        return hosted

    def rehost(self, h: StageInput, key: tuple) -> HostedStage | None:
        """Build a stage a message needs that is not hosted here: after a restart this
        executor has lost every replica, and the plan in the store rebuilds it. A version
        the gateway retired is not rebuilt (a late message must not bring its memory back);
        the request gets a retryable error instead, and so does one whose plan is gone."""
        flow, version, stage = key
        if (flow, version) in self.retired:
            self.fail(
                h,
                UnavailableError(
                    f"flow {flow!r} v{version} was retired on executor {self.id} (redeployed or undeployed)"
                ),
            )
            return None
        try:
            return self.host(load_plan(self.store, flow, version), stage, version)
        except FlowError as e:
            log.warning("executor %s: cannot build flow %s v%s stage %s: %s", self.id, flow, version, stage, e)
            self.fail(
                h,
                UnavailableError(f"flow {flow!r} v{version}: executor {self.id} cannot build stage {stage!r}: {e}"),
            )
            return None

    def unload(self, msg: Unload) -> None:
        """Release a flow version the gateway no longer serves (redeployed, undeployed, or
        a deploy that lost a race): its replicas, batcher threads and pending inputs; then
        give the freed heap back to the OS so the process really shrinks."""
        flow, version = msg.flow, msg.version
        with self.lock:
            gone = [k for k in self.hosted if k[0] == flow and k[1] == version]
            stages = [self.hosted.pop(k) for k in gone]
            self.forget(flow, version)
            self.retired[(flow, version)] = True
            if len(self.retired) > RETIRED_MEMORY:
                self.retired.popitem(last=False)
            if self.latest.get(flow) == version:
                del self.latest[flow]
        for hosted in stages:
            hosted.retired.set()  # a batcher finishes what it queued, then its thread ends
        for hosted in stages:
            if hosted.batcher is not None:
                # its thread holds the stage (a cycle: stage <-> batcher) until it ends
                hosted.batcher.thread.join(BATCHER_EXIT_S)
        refs = [weakref.ref(h) for h in stages]
        stages = hosted = None  # drop the last references here before collecting
        _release_memory(refs, f"flow {flow} v{version}", self.stopping)
        log.info("executor %s: unloaded flow %s v%s (%d stages)", self.id, flow, version, len(gone))


class _Either:
    """Set when either event is: a batcher ends when its executor stops or its stage is
    unloaded (Batcher only asks ``is_set()``)."""

    def __init__(self, a: threading.Event, b: threading.Event):
        self.a, self.b = a, b

    def is_set(self) -> bool:
        return self.a.is_set() or self.b.is_set()


def _release_memory(refs: list, what: str, stopping: threading.Event) -> None:
    """Collect the unloaded stages and give their memory back to the OS. Work still
    running when they were dropped (another unload's stages, a batch finishing) may hold
    them a moment longer, and memory freed after the trim would stay with the process:
    so until every one is gone, collect and trim again (bounded, on a helper thread)."""
    gc.collect()
    _trim_heap()
    if all(r() is None for r in refs):
        return

    def later():
        deadline = time.monotonic() + RELEASE_WAIT_S
        while any(r() is not None for r in refs) and time.monotonic() < deadline and not stopping.is_set():
            stopping.wait(0.2)
            gc.collect()
        _trim_heap()
        if any(r() is not None for r in refs):
            log.warning("%s: unloaded, but something still holds its stages; their memory is not freed", what)

    threading.Thread(target=later, name="release", daemon=True).start()


def _trim_heap() -> None:
    """Return freed heap pages to the OS (glibc keeps them otherwise, and RSS would not
    fall after a model is dropped); a no-op where there is no ``malloc_trim``."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
