"""An executor process: hosts any stage of any deployed flow and runs it on worker threads.

One IO thread owns the receiving sockets (transport.py): it decodes messages, gathers each
request's inputs per stage (all inputs, all parts of a key-split input, the first of
competing copies, the first valid of competing alternatives) and hands ready work to a
thread pool, or to the stage's batcher. Workers run the stage and send its output straight
to the consumers' executors (or the sink's result to the gateway). Redis is only read for
the plans (once per deploy) and for lookup data, through this executor's local cache.

    python -m executors.executor --id e0 --address ipc:///tmp/fs/e0 --kvs redis://...
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import logging
import os
import selectors
import signal
import sys
import threading
import time
import weakref
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from executors import clipper
from executors.batcher import Batcher, WorkItem, aimd_for
from executors.busypoll import DEFAULT_MS as DEFAULT_BUSY_POLL_MS
from executors.busypoll import MAX_MS as BUSY_POLL_MAX_MS
from executors.busypoll import BusyPoll
from executors.errors import FlowUnavailableError, OperatorTimeoutError, status_for
from executors.gpu import gpu_stats, set_executor_class
from executors.httpcodec import OFF_LOOP_ROWS, BadRequestError, input_table, json_rows, one_row_table, parse_body
from executors.membership import HEARTBEAT_S, Heartbeat, Member
from executors.messages import (
    Cancel,
    Failure,
    Load,
    Loaded,
    Message,
    Ping,
    Pong,
    RawInput,
    Recycling,
    Rendered,
    Result,
    StageInput,
    Stuck,
    Unload,
    Unstuck,
    decode,
)
from executors.placement import load_plan
from executors.routing import complete, deliveries, keeps_rows, merge
from executors.stage_runner import BoundStage
from executors.transport import Outbox, Reader, TransportError, accept, listen
from executors.watchdog import DEFAULT_GRACE_S, EXIT_RECYCLED, Blackbox, Run, Watchdog, monotonic_deadline
from executors.wire import WireError
from flow.context import cancelled, set_cancel, set_store
from flow.exceptions import DataError, FlowError, NoValidResultError, OperatorError, OperatorOutputError
from flow.table import Table, built_column
from kvs.exceptions import SerializationError
from kvs.options import KVSOptions
from optimizer.plan import Plan

log = logging.getLogger("flowserve.executor")

CHEAP_MS = 2.0  # stages faster than this on average run on the IO thread...
COSTLY_MS = 2 * CHEAP_MS  # ...until they average more than this (a hysteresis, see HostedStage.observe)
DEFAULT_CACHE_BYTES = KVSOptions.cache_max_bytes
EVICTION_QUIET_S = 10.0  # a cache that evicted within this long serves only the keys it owns
DONE_MEMORY = 100_000  # (request, stage) pairs remembered to drop late competing copies
CANCEL_MEMORY = 100_000  # races won (request attempt, stage) remembered to drop their losing copies
CANCEL_TTL_S = 60.0  # ...each until the request's deadline, or this long if it has none
BATCHER_EXIT_S = 2.0  # a batcher notices it was unloaded within its 0.2 s poll
RELEASE_WAIT_S = 30.0  # how long an unload keeps collecting until its stages are gone
RETIRED_MEMORY = 10_000  # (flow, version) pairs remembered as unloaded, not to be rebuilt


@dataclass
class Pending:
    """Inputs of one stage for one request attempt, as they arrive."""

    parts: dict = field(default_factory=dict)  # from-stage -> {path: Table}
    order: list = field(default_factory=list)  # first_valid: alternatives in arrival order
    trace: list = field(default_factory=list)
    deadline: float = 0.0
    flow: tuple = ()  # (flow, version): an unload drops the pending inputs of its version


class HostedStage:
    """A stage built once on this executor (the replica), with its consumers' info."""

    # Clipper's pieces (executors/clipper.py ``equip``), None on a stage that asks for none
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
        self.batcher: Batcher | None = None
        self.ewma_ms = COSTLY_MS * 2  # unknown cost: start on the pool until measured
        self.cheap = False  # run on the IO thread (no thread hop) rather than on the pool
        # never on the IO thread, however quick: a racing copy there would run after the
        # other copies sent here (not beside them), and its flow.wait could not be stopped,
        # since the Cancel that stops it is read by that same thread
        self.pooled = _races(self.stage)
        s = self.stage  # one whole input makes it ready (Executor._gather's short path)
        one = len(s.inputs) == 1 and s.continuation is None and s.competitive <= 1 and s.wait != "first_valid"
        self.single_input = s.inputs[0] if one else None

    def observe(self, ms: float) -> None:
        """Record a run's cost. A stage whose average sits near one threshold would flip
        between the IO thread and the pool (a thread hop every other request, seen on a
        slow machine): it becomes cheap below CHEAP_MS and stops being so above COSTLY_MS."""
        self.ewma_ms = 0.8 * self.ewma_ms + 0.2 * ms
        self.cheap = not self.pooled and self.ewma_ms < (COSTLY_MS if self.cheap else CHEAP_MS)


class Executor:
    def __init__(
        self,
        executor_id: str,
        address: str,
        kvs_url: str,
        device: str = "cpu",
        threads: int = 4,
        busy_poll_ms: float = DEFAULT_BUSY_POLL_MS,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        stuck_grace_s: float = DEFAULT_GRACE_S,
        blackbox: str | None = None,
    ):
        self.id = executor_id
        self.address = address
        self.device = device
        self.kvs_url = kvs_url
        self.store = _open_store(kvs_url, cache_bytes)
        set_store(self.store)  # operator code may read it (model weights in init)
        set_executor_class(device)  # warns once if a gpu executor has no GPU
        self.listener = listen(address)
        self.outbox = Outbox(f"executor {executor_id}")
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{executor_id}-worker")
        self.hosted: dict[tuple[str, int, str], HostedStage] = {}
        self.latest: dict[str, int] = {}
        # (flow, version) unloaded on the gateway's word: a late message for one must not
        # rebuild it from the store (it would hold its memory again, for nothing)
        self.retired: OrderedDict = OrderedDict()
        self.pending: dict[tuple, Pending] = {}
        self.done: OrderedDict = OrderedDict()
        # (gateway, request, attempt, stage) -> expiry (wall clock): races won, whose other
        # copies are dropped if still queued here or yet to arrive (Cancel; _cancel_rivals)
        self.cancelled: OrderedDict = OrderedDict()
        self._racing: dict = {}  # the same key -> Events of its copies running here (flow.wait returns on set)
        # the same key -> [a parsed relayed row, copies here still to come]: a race's copies
        # sent to this executor parse the body once (RAW_COPIES_MAX held at most)
        self._raw_rows: OrderedDict = OrderedDict()
        self._stopping = threading.Event()
        self._inline: dict = {}  # id(hosted) -> (hosted, ready items) to run after a drain
        self._inline_runs: deque = deque()  # (hosted, items): batches cut from _inline, next to run
        self._lock = threading.Lock()  # guards pending/done: the IO thread and workers gather
        self._io_thread = None
        self._io_gen = 0  # the IO thread of generation _io_gen reads; older ones were handed off
        self._selector = None
        self._io: threading.Thread | None = None
        self.busy_poll = BusyPoll(busy_poll_ms)  # busypoll.py: why the IO thread polls after a message
        # watchdog.py: run deadlines, IO hand-over, recycling a stuck executor; the blackbox
        # tells the supervisor what was running if this process dies
        self.watchdog = Watchdog(self._on_overdue, self._on_long_io, self._on_stuck, grace_s=stuck_grace_s)
        self.blackbox = Blackbox(blackbox) if blackbox else None
        self._gateways: set[str] = set()  # told first when this executor recycles itself
        self.on_exit: list = []  # called before a recycle exits the process (deregistration)

    # -- sockets ---------------------------------------------------------------------------

    def send(self, address: str, frames: list) -> None:
        if not self.outbox.send(address, frames):
            log.warning("executor %s: %s cannot be reached; a message to it was dropped", self.id, address)

    # -- main loop --------------------------------------------------------------------------

    def serve(self) -> None:
        """Run until stopped. The main thread only waits (and takes signals): reading is done
        by an IO thread, which the watchdog replaces if a cheap stage holds it too long."""
        log.info("executor %s listening on %s (%s)", self.id, self.address, self.device)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ, None)
        self.watchdog.start()
        self._start_io_thread()
        while not self._stopping.wait(1.0):
            self._expire(time.time())
        io = self._io
        if io is not None:
            io.join(5.0)
        self.watchdog.stop()
        self.pool.shutdown(wait=True)  # graceful: in-flight work finishes
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self.outbox.close()

    def _start_io_thread(self) -> None:
        self._io_gen += 1
        self._io = threading.Thread(
            target=self._io_loop, args=(self._io_gen,), name=f"{self.id}-io{self._io_gen}", daemon=True
        )
        self._io.start()

    def _io_loop(self, gen: int) -> None:
        self._io_thread = threading.get_ident()
        selector = self._selector
        while not self._stopping.is_set() and gen == self._io_gen:
            hot = self.busy_poll.hot()
            events = selector.select(0 if hot else 0.2)
            if gen != self._io_gen:
                break  # handed off while selecting: the new IO thread reads these
            if events:
                with self.outbox.corked():  # what reading sends (pongs, errors): one write per peer
                    for key, _ in events:
                        self._read(selector, key)
            elif hot:
                self.busy_poll.pause()
            # cheap ready work gathered while reading runs here, as batches
            self._run_inline(gen)
            if events:
                self.busy_poll.touch()  # from the end of the work: the next message is often the reply to what it sent

    def _read(self, selector, key) -> None:
        if key.data is None:  # a new connection
            while (conn := accept(self.listener)) is not None:
                selector.register(conn, selectors.EVENT_READ, Reader(conn))
            return
        try:
            messages, still_open = key.data.read()
        except TransportError as e:
            log.warning("executor %s: closing a connection that broke the framing: %s", self.id, e)
            messages, still_open = [], False
        for frames in messages:
            self._handle_safely(frames)
        if not still_open:
            selector.unregister(key.fileobj)
            key.fileobj.close()

    def stop(self, *_):
        self._stopping.set()

    def _handle_safely(self, frames) -> None:
        try:
            self.handle(frames)
        except WireError as e:
            log.warning("dropped a malformed message: %s", e)
        except Exception as e:  # never let one message take the executor down
            log.exception("error handling a message")
            self._fail_message(frames, e)

    def _fail_message(self, frames, error: Exception) -> None:
        """Answer the request of a message that could not be handled (a bug, not a bad
        input: those fail where they are found), so it is not left to wait for its deadline."""
        try:
            msg = decode(frames)
            if type(msg) is RawInput:
                self._fail(msg.as_input(None), error)
            elif type(msg) is StageInput:
                self._fail(msg, error)
        except Exception:  # the message itself is unreadable: nothing names its request
            log.exception("could not answer the request of a message that failed")

    def _run_inline(self, gen: int) -> None:
        """Run the cheap work gathered while draining: one batch per batching stage, one
        run per request otherwise. Batches are taken one at a time from shared queues, so
        if this thread is handed off inside one, the new IO thread runs the rest."""
        while gen == self._io_gen:  # running a batch may make the next stage's batch ready here
            try:
                hosted, items = self._inline_runs.popleft()
            except IndexError:
                if not self._inline:
                    return
                try:
                    hosted, items = self._inline.pop(next(iter(self._inline)))
                except (KeyError, StopIteration, RuntimeError):  # the other IO thread took it
                    continue
                size = hosted.batcher.max_size if hosted.batcher is not None else 1
                self._inline_runs.extend((hosted, items[i : i + size]) for i in range(0, len(items), size))
                continue
            self.run_batch(hosted, items)

    def handle(self, frames) -> None:
        msg = decode(frames)
        kind = type(msg)
        if kind is StageInput:
            for hosted, item in self.gather(msg):
                self.dispatch(hosted, item)
        elif kind is RawInput:
            for hosted, item in self.gather_raw(msg):
                self.dispatch(hosted, item)
        elif kind is Cancel:
            self._cancel((msg.gateway, msg.req, msg.attempt, msg.stage), None)
        elif kind is Load:
            self.pool.submit(self.on_load, msg)
        elif kind is Unload:
            self.pool.submit(self.on_unload, msg)  # on a worker: gc must not stall the IO thread
        elif kind is Ping:
            gpus = gpu_stats() if self.device == "gpu" else []
            self.send(msg.reply, Pong(self.id, msg.token, self.device, gpus, relays=True).encode())
        else:
            log.warning("executor %s: dropped a %r message: executors do not take those", self.id, msg.TYPE)

    # -- deploy ---------------------------------------------------------------------------------

    def on_load(self, msg: Load) -> None:
        flow, version = msg.flow, msg.version
        error = None
        try:
            plan = load_plan(self.store, flow, version)  # signed for this flow and version, or refused
            with self._lock:
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
            hosted.retired = threading.Event()  # set by on_unload: its batcher thread ends
            if hosted.stage.batch is not None:
                run = self.run_batch
                if _races(hosted.stage) and aimd_for(hosted) is None:  # AIMD times each batch's run
                    run = self._run_batch_on_pool
                hosted.batcher = Batcher(hosted, run, _Either(self._stopping, hosted.retired))
            clipper.equip(self, hosted)
            self.hosted[key] = hosted
        return hosted

    def on_unload(self, msg: Unload) -> None:
        """Release a flow version the gateway no longer serves (redeployed, undeployed, or
        a deploy that lost a race): its replicas, batcher threads and pending inputs; then
        give the freed heap back to the OS so the process really shrinks."""
        flow, version = msg.flow, msg.version
        with self._lock:
            gone = [k for k in self.hosted if k[0] == flow and k[1] == version]
            stages = [self.hosted.pop(k) for k in gone]
            for rid in [r for r, p in self.pending.items() if p.flow == (flow, version)]:
                del self.pending[rid]
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
        _release_memory(refs, f"flow {flow} v{version}", self._stopping)
        log.info("executor %s: unloaded flow %s v%s (%d stages)", self.id, flow, version, len(gone))

    # -- gathering inputs --------------------------------------------------------------------

    def gather(self, h: StageInput) -> list:
        """Record one arriving input; returns the (stage, work) pairs it made ready.

        Called by the IO thread for messages and by workers for local deliveries, so the
        bookkeeping is under a lock; the work itself runs after, outside it.
        """
        with self._lock:
            return self._gather(h)

    def gather_raw(self, r: RawInput) -> list:
        """A request's body as the client sent it (the gateway relayed it unparsed): parsed
        and checked here as the gateway would (the same functions: the same 400s), then
        the stage's input, whose answer the sink renders as the client's JSON."""
        key = (r.flow, r.version, r.stage)
        hosted = self.hosted.get(key)
        if hosted is None:
            with self._lock:
                hosted = self.hosted.get(key) or self._rehost(r.as_input(None), key)
            if hosted is None:
                return []
        races = _races(hosted.stage)
        if races:
            ready = self._raced_raw(r)
            if ready is not None:
                return ready
        schema = hosted.plan.input_schema
        try:
            table = one_row_table(r.body, r.ctype, r.qid, schema)
            if table is None:  # not the short way's shape: the general path, which names what is wrong
                rows = parse_body(r.body, r.ctype, schema)
                if len(rows) != 1:  # the gateway relays one JSON object only
                    raise BadRequestError(f"a relayed body must be one row, got {len(rows)}")
                table = input_table(r.flow, rows, np.array([r.qid], dtype=np.int64), schema)
        except (BadRequestError, DataError) as e:
            self._fail(r.as_input(None), e)
            return []
        if races:
            self._keep_for_copies(r, table)
        return self.gather(r.as_input(table))

    def _raced_raw(self, r: RawInput) -> list | None:
        """A racing copy's relayed body, before it is parsed: nothing to run if its race was
        won already; the rows another copy here parsed, if one did; None: parse it."""
        rid = (r.gateway, r.req, r.attempt, r.stage)
        if self.cancelled and rid in self.cancelled:
            self._raw_rows.pop(rid, None)
            return []  # it arrives after its race was won: not worth parsing
        held = self._raw_rows.get(rid)
        if held is None:
            return None
        held[1] -= 1
        if held[1] <= 0:
            self._raw_rows.pop(rid, None)
        return self.gather(r.as_input(_own_rows(held[0])))

    def _keep_for_copies(self, r: RawInput, table: Table) -> None:
        """Keep a racing copy's parsed rows for the other copies routed to this executor.
        Each copy gets rows of its own (a copy may change its input in place): the ones kept
        are never handed out; copying a relayed row (64 KiB at most) costs a few us, parsing
        it again tens."""
        here = r.routes.get(r.stage, ()).count(self.address)
        if here > 1:
            self._raw_rows[(r.gateway, r.req, r.attempt, r.stage)] = [_own_rows(table), here - 1]
            while len(self._raw_rows) > RAW_COPIES_MAX:
                self._raw_rows.popitem(last=False)

    def _gather(self, h: StageInput) -> list:
        key = (h.flow, h.version, h.stage)
        hosted = self.hosted.get(key)
        if hosted is None:
            hosted = self._rehost(h, key)
            if hosted is None:
                return []
        stage, table = hosted.stage, h.table
        src = h.source
        path = tuple(tuple(p) for p in h.path)
        rid = (h.gateway, h.req, h.attempt, h.stage)  # request ids are per gateway
        if stage.continuation is not None:
            rid += (path,)  # each key group of a request runs on its own
        if self.cancelled and rid in self.cancelled and _races(stage):
            return []  # a losing copy (racing or a hedge's backup) that arrives after its race was won
        if stage.competitive > 1:
            rid += (h.copy,)  # racing copies placed on one executor all run
        if rid in self.done:
            return []  # a late competing copy, or a retry's leftover
        if not path and src == hosted.single_input and table is not None and rid not in self.pending:
            # the stage's one input, whole: ready as it is (what the general path below does)
            self._mark_done(rid)
            return [(hosted, WorkItem(h, [table], (), list(h.trace)))]
        if stage.continuation is not None:
            # a continuation runs on its own key group; its consumer merges the groups
            self._mark_done(rid)
            return [(hosted, WorkItem(h, [table], path, list(h.trace)))]
        pend = self.pending.get(rid)
        if pend is None:
            deadline = h.deadline if h.deadline is not None else time.time() + 60
            pend = self.pending[rid] = Pending(deadline=deadline, flow=key[:2])
        parts = pend.parts.setdefault(src, {})
        if path in parts:
            return []  # this part came already (competing copies send the same parts)
        parts[path] = table
        pend.trace.extend(h.trace)
        if not complete(parts):
            return []
        if stage.wait == "first_valid":
            pend.order.append(src)
            return self._first_valid(hosted, h, rid, pend)
        if all(s in pend.parts and complete(pend.parts[s]) for s in set(stage.inputs)):
            inputs = [merge(pend.parts[s]) for s in stage.inputs]
            del self.pending[rid]
            self._mark_done(rid)
            return [(hosted, WorkItem(h, inputs, (), pend.trace))]
        if hosted.early is not None:
            hosted.early.arm(h, rid)  # an ensemble answers at the deadline with what arrived
        return []

    def _rehost(self, h: StageInput, key: tuple) -> HostedStage | None:
        """Build a stage a message needs that is not hosted here: after a restart this
        executor has lost every replica, and the plan in the store rebuilds it. A version
        the gateway retired is not rebuilt (a late message must not bring its memory back);
        the request gets a retryable error instead, and so does one whose plan is gone."""
        flow, version, stage = key
        if (flow, version) in self.retired:
            self._fail(
                h,
                FlowUnavailableError(
                    f"flow {flow!r} v{version} was retired on executor {self.id} (redeployed or undeployed)"
                ),
            )
            return None
        try:
            return self.host(load_plan(self.store, flow, version), stage, version)
        except FlowError as e:
            log.warning("executor %s: cannot build flow %s v%s stage %s: %s", self.id, flow, version, stage, e)
            self._fail(
                h,
                FlowUnavailableError(f"flow {flow!r} v{version}: executor {self.id} cannot build stage {stage!r}: {e}"),
            )
            return None

    def _first_valid(self, hosted: HostedStage, h: StageInput, rid, pend: Pending) -> list:
        """Alternatives race: per row, the first arrived result that is valid wins."""
        stage, head = hosted.stage, hosted.bound.head
        tables = [merge(pend.parts[s]) for s in pend.order]
        valid = [t for t in tables if t is not None]
        if not valid:
            base = None
            chosen = np.full(0, -1, dtype=np.int64)
        else:
            base = valid[0]
            chosen = np.full(len(base), -1, dtype=np.int64)
        try:
            for a, t in enumerate(tables):
                free = chosen < 0
                if t is None or not free.any():
                    continue
                ok = head.accepts(t) & free
                chosen[ok] = a
        except OperatorError as e:
            self._fail(h, e)
            del self.pending[rid]
            self._mark_done(rid)
            return []
        if base is not None and (chosen >= 0).all():
            parts = (
                [tables[a].take([i]) for i, a in enumerate(chosen)]
                if len(set(chosen.tolist())) > 1
                else [tables[int(chosen[0])]]
                if len(chosen)
                else [base]
            )
            table = Table.concat(parts) if len(parts) > 1 else parts[0]
            del self.pending[rid]
            self._mark_done(rid)
            return [(hosted, WorkItem(h, [table], (), pend.trace, after_head=True))]
        elif len(pend.order) == len(set(stage.inputs)):
            name = stage.nodes[0].name
            bad = np.flatnonzero(chosen < 0)
            qid = int(base.qid[bad[0]]) if base is not None and len(bad) else None
            self._fail(
                h, NoValidResultError(f"operator {name!r}: no alternative gave a valid result", operator=name, qid=qid)
            )
            del self.pending[rid]
            self._mark_done(rid)
        return []

    def _mark_done(self, rid) -> None:
        self.done[rid] = True
        if len(self.done) > DONE_MEMORY:
            self.done.popitem(last=False)

    def _expire(self, now: float) -> None:
        with self._lock:
            for rid in [r for r, p in self.pending.items() if p.deadline < now]:
                del self.pending[rid]
            while self.cancelled:  # oldest first (deadlines come roughly in order): stop at a live one
                key, until = next(iter(self.cancelled.items()))
                if until >= now:
                    break
                del self.cancelled[key]

    # -- cancelling the losing copies of a race -------------------------------------------------

    def _cancel(self, key: tuple, deadline: float | None) -> bool:
        """Remember that the race of ``key`` (gateway, request, attempt, stage) was won: its
        copies still queued here are dropped when their turn comes (``_lost``), and copies
        arriving later are not gathered. False if it was known already."""
        with self._lock:
            if key in self.cancelled:
                return False
            self.cancelled[key] = (deadline if deadline is not None else time.time()) + (
                1.0 if deadline is not None else CANCEL_TTL_S
            )
            if len(self.cancelled) > CANCEL_MEMORY:
                self.cancelled.popitem(last=False)
            for ev in self._racing.get(key, ()):
                ev.set()  # a copy running here that waits in flow.wait stops now
            return True

    def _lost(self, hosted: HostedStage, h: StageInput) -> bool:
        """True if ``h`` is a copy of a race already won (queued here, or just run)."""
        return (
            _races(hosted.stage) and bool(self.cancelled) and (h.gateway, h.req, h.attempt, h.stage) in self.cancelled
        )

    def _cancel_rivals(self, hosted: HostedStage, h: StageInput) -> None:
        """This copy of a racing stage finished first here and its output has gone (in the
        same corked write, after it): tell the executors of the other copies to drop theirs
        if still queued, or their output if still running. A crash of this executor after
        the cancel still answers: the gateway re-runs what was in flight on a dead executor
        as a new attempt, which no cancel names. Not for continuation stages (each key group
        races on its own: a cancel would name them all)."""
        if not self._cancel((h.gateway, h.req, h.attempt, h.stage), h.deadline):
            return  # another copy won (it told us) or a copy here already told the rivals
        rivals = {a for a in h.routes.get(h.stage, ()) if a != self.address}
        if rivals:
            frames = Cancel(h.gateway, h.req, h.attempt, h.stage).encode()
            for address in rivals:
                self.send(address, frames)

    # -- running ------------------------------------------------------------------------------

    def dispatch(self, hosted: HostedStage, item: WorkItem) -> None:
        if hosted.hedger is not None:
            hosted.hedger.arm(item)  # a backup copy if no answer by the percentile (clipper.py)
        if item.message.solo:
            # a retry of a request that was running when an executor crashed: it runs alone
            # (never merged into a batch), so a second crash is its own (Dispatcher.executor_died)
            self.pool.submit(self.run_one, hosted, item)
            return
        on_io = threading.get_ident() == self._io_thread
        if hosted.batcher is not None:
            if hosted.cheap and not hosted.batcher.should_wait():
                # light load and a quick stage: no thread hop, no waiting; requests that
                # arrived together (drained in one go) still run as one batch
                hosted.batcher.note_arrival()
                hosted.batcher.learn(False, 1)
                if on_io:
                    self._inline.setdefault(id(hosted), (hosted, []))[1].append(item)
                else:
                    self.run_batch(hosted, [item])
            else:
                hosted.batcher.put(item)
        elif hosted.cheap:
            # a waking worker thread costs more than a stage this quick: run it on this
            # thread (the IO thread runs it after reading, outside the read's corked sends)
            if on_io:
                self._inline_runs.append((hosted, [item]))
            else:
                self.run_one(hosted, item)
        else:
            self.pool.submit(self.run_one, hosted, item)

    # -- watching runs (watchdog.py) ----------------------------------------------------------

    def _begin(self, hosted: HostedStage, items: list[WorkItem]) -> tuple[int, Run]:
        ident = threading.get_ident()
        if ident == self._io_thread:
            lane = "io"
        elif hosted.batcher is not None and hosted.batcher.thread.ident == ident:
            lane = "batcher"
        else:
            lane = "pool"
        first = items[0].inputs[0] if items[0].inputs else None
        qid = int(first.qid[0]) if first is not None and len(first) else None
        messages = [it.message for it in items]
        run = Run(
            hosted.plan.flow_name,
            hosted.stage.name,
            messages,
            lane,
            [monotonic_deadline(m.deadline) for m in messages],
            qid,
            owner=hosted,
        )
        run.node = hosted.stage.nodes[0].name
        self._gateways.add(messages[0].gateway)
        key = self.watchdog.begin(run)
        if self.blackbox is not None:
            self.blackbox.record(run)
        return key, run

    def _end(self, key: int, run: Run) -> bool:
        """The run is back; True if it was abandoned (its requests were answered 504)."""
        self.watchdog.end(key)
        if self.blackbox is not None:
            self.blackbox.clear(run)
        if run.abandoned:
            self._lane_back(run)
        return bool(run.answered)

    def _on_node(self, run: Run, multi: bool):
        def enter(node) -> None:
            run.enter(node.name, node.op.timeout_s)
            if multi and self.blackbox is not None:
                self.blackbox.note_node(run)

        return enter

    def _on_overdue(self, run: Run, due: list[int], why: str) -> None:
        """Watchdog: answer the requests whose time is up 504 naming the operator; once the
        whole run is abandoned, give its thread's work to a new thread."""
        hosted = run.owner
        for i in due:
            h = run.messages[i]
            if why == "timeout":
                msg = (
                    f"operator {run.node!r} did not finish within its timeout_s={run.node_timeout:g}; "
                    f"its run was abandoned"
                )
            else:
                msg = (
                    f"operator {run.node!r} (stage {run.stage!r}) was still running at the request's "
                    f"deadline; its run was abandoned"
                )
            log.warning("flow %s stage %s request %s (qid %s): %s", run.flow, run.stage, h.req, run.qid, msg)
            self._fail(h, OperatorTimeoutError(msg, operator=run.node, qid=run.qid), hosted)
        if run.abandoned and not run.lost:
            run.lost = True
            self._lane_lost(run)

    def _lane_lost(self, run: Run) -> None:
        """A thread is held by abandoned work: keep the executor's capacity by replacing it."""
        hosted = run.owner
        if run.lane == "io":
            if not run.handed_off:
                self._on_long_io(run)
        elif run.lane == "batcher" and hosted.batcher is not None:
            hosted.batcher.replace_thread()
        else:
            # ThreadPoolExecutor starts a new thread on submit while fewer than _max_workers
            # exist; raising it by one (and submitting) gives back the thread the run holds
            self.pool._max_workers += 1
            self.pool.submit(_nothing)
        self._report(Stuck(self.id, run.flow, run.stage, run.node, time.time()))

    def _lane_back(self, run: Run) -> None:
        if run.lost:
            if run.lane == "pool":
                self.pool._max_workers -= 1
            self._report(Unstuck(self.id, run.flow, run.stage, run.node))
            log.warning(
                "flow %s stage %s: an abandoned run of operator %r came back after %.1f s",
                run.flow,
                run.stage,
                run.node,
                time.monotonic() - run.started,
            )

    def _on_long_io(self, run: Run) -> None:
        """Watchdog: a run has held the IO thread too long. A new IO thread takes over reading;
        this one finishes its call as a plain thread. The stage runs on the pool from now on."""
        run.handed_off = True
        hosted = run.owner
        hosted.cheap = False
        hosted.ewma_ms = max(hosted.ewma_ms, COSTLY_MS * 10)
        log.warning(
            "executor %s: operator %r (flow %s) has held the IO thread for %.2f s; a new IO thread takes over",
            self.id,
            run.node,
            run.flow,
            time.monotonic() - run.started,
        )
        self._start_io_thread()

    def _on_stuck(self, run: Run) -> None:
        """Watchdog: abandoned work has not come back within the grace period. A thread is
        lost for good (Python cannot interrupt it): recycle this executor. The gateways
        re-run what was in flight here elsewhere; the supervisor starts a new process."""
        log.error(
            "executor %s: operator %r (flow %s, stage %s, qid %s) has been stuck for %.1f s; recycling this executor",
            self.id,
            run.node,
            run.flow,
            run.stage,
            run.qid,
            time.monotonic() - run.started,
        )
        self._report(Recycling(self.id, run.flow, run.node, f"operator {run.node!r} stuck"))
        for hook in self.on_exit:
            try:
                hook()
            except Exception:
                log.exception("executor %s: exit hook failed", self.id)
        os._exit(EXIT_RECYCLED)

    def _report(self, msg: Message) -> None:
        frames = msg.encode()
        for gw in list(self._gateways):
            if gw:
                self.send(gw, frames)

    def run_one(self, hosted: HostedStage, item: WorkItem) -> None:
        if not _races(hosted.stage):
            return self._run_one(hosted, item)
        h = item.message
        key, ev = (h.gateway, h.req, h.attempt, h.stage), threading.Event()
        with self._lock:
            lost = bool(self.cancelled) and key in self.cancelled
            if not lost:
                self._racing.setdefault(key, []).append(ev)
        if lost:
            if hosted.hedger is not None:
                hosted.hedger.forget(item)  # no backup for it: the race is over
            return  # its race was won while it waited: another copy answered
        set_cancel(ev)  # flow.wait in the operator returns when the race is won elsewhere
        try:
            self._run_one(hosted, item)
        finally:
            set_cancel(None)
            with self._lock:
                evs = self._racing.pop(key, [])
                if len(evs) > 1:
                    evs.remove(ev)
                    self._racing[key] = evs
            if ev.is_set() and hosted.hedger is not None:
                hosted.hedger.forget(item)  # a hedge whose other copy won: no answer from this one

    def _run_one(self, hosted: HostedStage, item: WorkItem) -> None:
        if _expired(item.message):
            return self._too_late(hosted, item)
        key, run = self._begin(hosted, [item])
        t0 = time.perf_counter()
        try:
            out = self._execute(hosted, item.inputs, item.after_head, run)
        except FlowError as e:
            if self._end(key, run):
                return
            log.info(
                "flow %s stage %s request %s: %s (qid %s)",
                item.message.flow,
                hosted.stage.name,
                item.message.req,
                e,
                getattr(e, "qid", None),
            )
            self._fail(item.message, e, hosted)
            return
        except BaseException as e:  # a bug in user code, or SystemExit: one request, never the executor
            if self._end(key, run):
                return
            log.exception("flow %s stage %s request %s failed", item.message.flow, hosted.stage.name, item.message.req)
            self._fail(item.message, e, hosted)
            return
        if self._end(key, run):
            return  # abandoned (answered 504): its output is dropped
        ms = (time.perf_counter() - t0) * 1000
        if _races(hosted.stage):
            if cancelled():
                return  # a racing copy stopped early (flow.wait): the winner answered; its time is no sample
            set_cancel(None)  # the run is over: consumers run next on this thread are no copy of this race
        hosted.observe(ms)
        self.forward(hosted, [(item, out)], ms, 1)

    def run_batch(self, hosted: HostedStage, items: list[WorkItem]) -> None:
        """Run several requests as one merged Table, then split the output back by qid."""
        if self.cancelled and _races(hosted.stage):
            lost = [it for it in items if self._lost(hosted, it.message)]  # races won meanwhile
            if lost:
                items = [it for it in items if not self._lost(hosted, it.message)]
                for it in lost if hosted.hedger is not None else ():
                    hosted.hedger.forget(it)
        late = [it for it in items if _expired(it.message)]
        if late:
            for it in late:
                self._too_late(hosted, it)
            items = [it for it in items if not _expired(it.message)]
        if len(items) <= 1:
            return self.run_one(hosted, items[0]) if items else None
        owner, clashing = _owners(items)
        if clashing:
            # racing copies (or a retry) of one request share its qids, so their rows could
            # not be told apart after the merge: run them in separate batches; a race's
            # copies side by side (the later ones on the pool), as on a stage without a
            # batcher, or the first would hold the others back for its whole run
            first, rest = items[: clashing[0]], items[clashing[0] :]
            if _races(hosted.stage):
                self.pool.submit(self.run_batch, hosted, rest)
                return self.run_batch(hosted, first)
            for group in (first, rest):
                self.run_batch(hosted, group)
            return
        self._run_merged(hosted, items, owner)

    def _run_batch_on_pool(self, hosted: HostedStage, items: list[WorkItem]) -> None:
        """A racing stage's batch, run on the pool: a race's copies reach the batcher one by
        one, and on its own thread the first would hold the others back for its whole run."""
        self.pool.submit(self.run_batch, hosted, items)

    def _run_merged(self, hosted: HostedStage, items: list[WorkItem], owner: dict) -> None:
        key, run = self._begin(hosted, items)
        t0 = time.perf_counter()
        try:
            merged = [Table.concat([it.inputs[k] for it in items]) for k in range(len(items[0].inputs))]
            out = self._execute(hosted, merged, items[0].after_head, run)
        except BaseException:
            self._end(key, run)
            # one bad request must not fail the others: run each alone to isolate it
            for k, it in enumerate(items):
                if k not in run.answered:
                    self.run_one(hosted, it)
            return
        self._end(key, run)
        ms = (time.perf_counter() - t0) * 1000
        hosted.observe(ms)
        rows = [[] for _ in items]
        for i, q in enumerate(out.qid.tolist()):
            rows[owner[q]].append(i)
        self.forward(
            hosted,
            [
                (it, out.take(np.asarray(rows[k], dtype=np.int64)))
                for k, it in enumerate(items)
                if k not in run.answered
            ],
            ms,
            len(items),
        )

    def _too_late(self, hosted: HostedStage, item: WorkItem) -> None:
        """The request's deadline passed while it waited for this stage: do not spend a run
        on it; say where it was stuck (the gateway's own 504 cannot tell)."""
        op = hosted.stage.nodes[0].name
        self._fail(
            item.message,
            OperatorTimeoutError(
                f"the request's deadline passed while it waited to run operator {op!r} (stage {hosted.stage.name!r})",
                operator=op,
            ),
            hosted,
        )

    def _execute(self, hosted: HostedStage, inputs: list[Table], after_head: bool, run: Run) -> Table:
        bound = hosted.bound
        enter = self._on_node(run, len(hosted.stage.nodes) > 1)
        if not after_head:
            return bound(inputs, self.store, on_node=enter)
        out = inputs[0]
        for node, b in zip(hosted.stage.nodes[1:], bound.bound[1:]):
            enter(node)
            out = b([out], self.store)
        return out

    def forward(self, hosted: HostedStage, outputs: list[tuple[WorkItem, Table]], ms: float, batch: int) -> None:
        """Send each request's output on to the gateway (sink) and to remote consumers, one
        write per peer for them all; consumers hosted here start once the messages have
        left (a remote branch must not wait for a local one)."""
        local = []
        with self.outbox.corked():
            for item, out in outputs:
                try:
                    local.extend(self._deliver(hosted, item, out, ms, batch))
                except Exception as e:  # e.g. a string that is not Unicode: this request's error, at once
                    op = hosted.stage.nodes[-1].name
                    log.warning(
                        "flow %s stage %s request %s: output cannot be sent: %s",
                        item.message.flow,
                        hosted.stage.name,
                        item.message.req,
                        e,
                    )
                    self._fail(
                        item.message,
                        OperatorOutputError(
                            f"operator {op!r} returned a value that cannot be sent on ({type(e).__name__}: {e})",
                            operator=op,
                        ),
                        hosted,
                    )
        for ready in local:
            self.dispatch(*ready)

    def _deliver(self, hosted: HostedStage, item: WorkItem, out: Table, ms: float, batch: int) -> list:
        """Send one request's output; the ready work of consumers hosted here, to start."""
        h = item.message
        trace = item.trace + [[hosted.stage.name, self.id, round(ms, 3), batch]]
        extra = None
        if hosted.report is not None:
            extra = hosted.report(item)  # cache hits, hedges: the gateway's /metrics (clipper.py)
        aimd = hosted.batcher.aimd if hosted.batcher is not None else None
        if aimd is not None:  # AIMD's cap on this replica now: GET /flows/{name} shows it
            extra = {**(extra or {}), "cap": aimd.batch_size}
        if extra is not None:
            trace[-1].append(extra)
        racing = _races(hosted.stage)
        if racing and self._lost(hosted, h):
            return []  # another copy won (and sent its output) while this one ran: drop this one's
        local = []
        if hosted.is_sink:
            answer = _rendered(h, trace, out) if h.render else None
            self.send(h.gateway, answer or Result(h.req, h.attempt, item.path, trace, out).encode())
        for consumer in hosted.consumers:
            stage = hosted.plan.stages[consumer]
            kept = self._kept_keys() if keeps_rows(hosted.stage, stage) else None  # routing.keeps_rows: why
            for d in deliveries(out, stage, h.routes[consumer], item.path, here=self.address, holds=kept):
                msg = h.to(consumer, hosted.stage.name, d.path, d.copy, d.table, trace)
                if d.address == self.address:
                    # the consumer runs here too: hand the message over, no socket, no encoding
                    local.extend(self.gather(msg))
                else:
                    self.send(d.address, msg.encode())
        if racing and (hosted.stage.competitive > 1 or (extra is not None and "hedge" in extra)):
            self._cancel_rivals(hosted, h)  # a hedge: only once its backup went (clipper.Hedger)
        return local

    def _kept_keys(self):
        """Which continuation rows may stay here instead of going to their key's owner:
        those whose key this cache holds, unless it has had to evict lately (None: none).
        A cache that evicts holds less than its share of the keys: serving other owners'
        keys from it would push out its own (and leave their owners cold), so then rows
        go strictly to their owners, which partitions the working set across the caches."""
        return None if self.store.evicted_within(EVICTION_QUIET_S) else self.store.holds

    def _fail(self, h: StageInput, error: BaseException, hosted: HostedStage | None = None) -> None:
        if hosted is not None and self.cancelled and self._lost(hosted, h):
            return  # a losing copy's failure (e.g. stopped early): the winner answered
        if (
            hosted is not None
            and hosted.consumers
            and all(hosted.plan.stages[c].wait == "first_valid" for c in hosted.consumers)
        ):
            # an alternative that fails is just not valid: the choice may still succeed. Its
            # input without a table says so; why it failed was logged here (run_one)
            for c in hosted.consumers:
                invalid = h.to(c, hosted.stage.name, (), 0, None, trace=())
                for addr in h.routes[c]:
                    self.send(addr, invalid.encode())
            return
        if (
            isinstance(error, OperatorTimeoutError)
            and hosted is not None
            and hosted.consumers
            and all(hosted.plan.stages[c].deadline_answers for c in hosted.consumers)
        ):
            return  # a straggling ensemble member: the ensemble answers without it (clipper.py)
        message = (
            str(error) if isinstance(error, FlowError) else f"stage {h.stage!r} raised {type(error).__name__}: {error}"
        )
        operator, qid = getattr(error, "operator", None), getattr(error, "qid", None)
        self.send(
            h.gateway,
            Failure(
                h.req,
                h.attempt,
                status_for(error),
                type(error).__name__,
                message,
                None if operator is None else str(operator),
                int(qid) if isinstance(qid, (int, np.integer)) else None,
            ).encode(),
        )


def _rendered(h: StageInput, trace: list, out: Table) -> list | None:
    """A relayed body's answer as the client's JSON (Rendered); None for an answer rendered
    off the loop by the gateway (over OFF_LOOP_ROWS rows) or that JSON cannot carry: the
    gateway then encodes the Table itself, and names the operator, as for any answer."""
    if len(out) > OFF_LOOP_ROWS:
        return None
    try:
        body = json_rows(out)
    except (TypeError, ValueError):  # orjson's errors are TypeErrors; UnencodableError
        return None
    schema = {c: t.to_json() for c, t in out.schema.items()}
    return Rendered(h.req, h.attempt, trace, len(out), schema, body).encode()


def _nothing() -> None:
    pass


#: parsed relayed rows held for racing copies still to come to this executor (each entry is
#: dropped when its last copy comes; a copy that never comes leaves it to this bound)
RAW_COPIES_MAX = 256


def _own_rows(table: Table) -> Table:
    """A copy of a (small) Table whose arrays are its own."""
    cols = {
        name: built_column(c.type, c.values.copy(), None if c.valid is None else c.valid.copy())
        for name, c in table._cols.items()
    }
    return Table.built(cols, table._qid.copy())


def _races(stage) -> bool:
    """True for a stage whose copies race (competitive, or hedged: a backup copy) and whose
    losing copies are cancelled (not a continuation: each key group races on its own)."""
    return stage.continuation is None and (stage.competitive > 1 or stage.hedge is not None)


def _expired(msg: StageInput) -> bool:
    """True if the request's deadline has passed (the gateway answered it 504)."""
    return msg.deadline is not None and time.time() > msg.deadline


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


def _owners(items: list[WorkItem]) -> tuple[dict, list]:
    """Map each input qid to the index of the batched item it came from; ``clashing`` is
    ``[k]`` when item ``k`` is the first to repeat a qid of an earlier item, else empty."""
    owner: dict = {}
    for k, it in enumerate(items):
        qids = {q for t in it.inputs for q in t.qid.tolist()}
        if any(q in owner for q in qids):
            return owner, [k]
        owner.update(dict.fromkeys(qids, k))
    return owner, []


class LossyStream:
    """A text stream whose writes never raise: what cannot be written (the disk is full or
    read-only) is dropped and counted, and the process goes on serving."""

    def __init__(self, stream):
        self._stream = stream
        self.dropped = 0

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            self.dropped += len(text)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            pass

    def __getattr__(self, name):  # fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def _open_store(url: str, cache_bytes: int):
    from executors.config import cluster_key
    from kvs import CachedKVS

    # plans are checked against the cluster key before they are unpickled (kvs.serialization)
    return CachedKVS.from_url(url, cache_max_bytes=cache_bytes, signing_key=cluster_key())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m executors.executor", description="Run one FlowServe executor.")
    p.add_argument("--id", required=True, help="executor id, unique in the cluster")
    p.add_argument("--address", required=True, help="address to listen on for messages: ipc:///path or tcp://host:port")
    p.add_argument(
        "--kvs",
        default=os.environ.get("FLOWSERVE_KVS_URL"),
        help="Redis URL of the cluster's KVS (default: $FLOWSERVE_KVS_URL)",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--threads", type=int, default=4)
    p.add_argument(
        "--busy-poll-ms",
        type=float,
        default=DEFAULT_BUSY_POLL_MS,
        help="after a message, poll for this long before sleeping (lower latency for CPU "
        f"that is otherwise idle; 0: off; default {DEFAULT_BUSY_POLL_MS:g})",
    )
    p.add_argument(
        "--cache-bytes",
        type=int,
        default=DEFAULT_CACHE_BYTES,
        help=f"byte budget of the local KVS cache (default {DEFAULT_CACHE_BYTES >> 20} MiB; 0: none)",
    )
    p.add_argument(
        "--stuck-grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        help="recycle this executor when abandoned work (past its deadline) has not come back "
        f"within this long (default {DEFAULT_GRACE_S:g})",
    )
    p.add_argument(
        "--blackbox",
        default=None,
        help="file recording what each thread runs, for the supervisor to read after a crash",
    )
    p.add_argument(
        "--heartbeat-s",
        type=float,
        default=HEARTBEAT_S,
        help="registration refresh period; the registration expires after 3 of them",
    )
    args = p.parse_args(argv)
    if not args.kvs:
        p.error("--kvs is required (or set FLOWSERVE_KVS_URL)")
    # output goes to a log file; on a full or read-only disk an operator's print() must not fail its request
    sys.stdout, sys.stderr = LossyStream(sys.stdout), LossyStream(sys.stderr)
    logging.basicConfig(
        level=os.environ.get("FLOWSERVE_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s executor {args.id} %(levelname)s %(message)s",
    )
    if not 0 <= args.busy_poll_ms <= BUSY_POLL_MAX_MS:
        p.error(f"--busy-poll-ms must be in 0..{BUSY_POLL_MAX_MS:g}, got {args.busy_poll_ms:g}")
    if args.cache_bytes < 0:
        p.error(f"--cache-bytes must be >= 0, got {args.cache_bytes}")
    if not args.stuck_grace_s > 0:
        p.error(f"--stuck-grace-s must be > 0, got {args.stuck_grace_s:g}")
    ex = Executor(
        args.id,
        args.address,
        args.kvs,
        device=args.device,
        threads=args.threads,
        busy_poll_ms=args.busy_poll_ms,
        cache_bytes=args.cache_bytes,
        stuck_grace_s=args.stuck_grace_s,
        blackbox=args.blackbox,
    )
    # announce it only once it listens: gateways that find it can send at once
    heartbeat = Heartbeat(
        ex.store.redis, Member(args.id, args.address, args.device, args.threads), args.heartbeat_s
    ).start()
    ex.on_exit.append(heartbeat.stop)  # a recycling executor leaves the membership at once

    def stop(*_):
        # leave the membership at once so gateways stop routing here, then finish in-flight work
        threading.Thread(target=heartbeat.stop, daemon=True).start()
        ex.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        ex.serve()
    finally:
        heartbeat.stop()


if __name__ == "__main__":
    main()
