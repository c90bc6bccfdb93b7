"""Running a stage's ready work on an executor: where it runs (the IO thread for a quick
stage, the pool, the stage's batcher), one request or several merged into one Table, the
losing copies of a race skipped, late requests answered without a run; each run watched
(watchdog.py: overdue runs answered 504, lost threads replaced, a stuck executor recycled)
and recorded in the blackbox; rows a sink sends ahead of its output (progress.py); its
output handed to Outputs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from executors import tracing
from executors.errors import OperatorTimeoutError
from executors.wire.messages import Message, Recycling, StageInput, Stuck, Unstuck
from executors.wire.routing import whole
from executors.worker import progress
from executors.worker.batcher import Batcher, WorkItem, aimd_for
from executors.worker.hosting import HostedStage
from executors.worker.outputs import Outputs, race_outcome
from executors.worker.races import Races, RunCancel, raced
from executors.worker.watchdog import EXIT_RECYCLED, Blackbox, Run, Watchdog, monotonic_deadline
from flow.context import cancelled, set_cancel, set_deadline
from flow.errors import FlowError, OperatorError
from flow.table import Table
from flow.tracebacks import operator_traceback

log = logging.getLogger("flowserve.executor")


class Runner:
    """Runs ready work and watches it.

    ``inline`` and ``inline_runs`` are the IO thread's queue of quick work: ``dispatch``
    fills them on that thread while it reads, and the IO loop (executor.py) runs them after;
    ``io_thread`` is the IO thread's ident, set by the IO loop."""

    def __init__(
        self,
        executor_id: str,
        pool: ThreadPoolExecutor,
        store,
        send,
        races: Races,
        outputs: Outputs,
        inline: dict,
        inline_runs: deque,
        hand_off_io,
        on_exit: list,
        stuck_grace_s: float,
        blackbox: str | None,
    ):
        self.id = executor_id
        self.pool = pool
        self.store = store
        self.send = send
        self.races = races
        self.cancelled = races.cancelled  # Races' own table, read here before each batch
        self.forward, self.fail, self.count_batch = outputs.forward, outputs.fail, outputs.count_batch
        self.io_thread = None
        self.inline = inline  # id(hosted) -> (hosted, ready items) to run after a drain
        self.inline_runs = inline_runs  # (hosted, items): batches cut from inline, next to run
        self.hand_off_io = hand_off_io  # executor.py: a new IO thread takes over reading (given the run)
        self.on_exit = on_exit  # called before a recycle exits the process (deregistration)
        # watchdog.py: run deadlines, IO hand-over, recycling a stuck executor; the blackbox
        # tells the supervisor what was running if this process dies
        self.watchdog = Watchdog(self._on_overdue, hand_off_io, self._on_stuck, grace_s=stuck_grace_s)
        self.blackbox = Blackbox(blackbox) if blackbox else None
        self.gateways: set[str] = set()  # told first when this executor recycles itself
        self.hosted: dict = {}  # Stages' table of hosted stages (chain_with), for chained runs
        self.address = ""
        self.chained = 0  # stage runs chained to the one before them (a total, for /metrics)
        self._chained_lock = threading.Lock()

    def chain_with(self, hosted: dict, address: str) -> None:
        """Where chained runs (``_chained``) find the next stage: the executor's hosted stages, its address."""
        self.hosted, self.address = hosted, address

    def batcher(self, hosted: HostedStage, ends) -> Batcher:
        """The batcher of a stage that batches, running its batches here until ``ends``."""
        run = self.run_batch
        if raced(hosted.stage) and aimd_for(hosted) is None:  # AIMD times each batch's run
            run = self._run_batch_on_pool
        return Batcher(hosted, run, ends)

    def dispatch(self, hosted: HostedStage, item: WorkItem) -> None:
        if item.message.tp:
            item.ready = time.perf_counter()  # a traced run's queue wait starts here
        if hosted.hedger is not None:
            hosted.hedger.arm(item)  # a backup copy if no answer by the percentile (hedging.py)
        if item.message.solo:
            # a retry of a request that was running when an executor crashed: it runs alone
            # (never merged into a batch), so a second crash is its own (Dispatcher.executor_died)
            self.pool.submit(self.run_one, hosted, item)
            return
        on_io = threading.get_ident() == self.io_thread
        if hosted.batcher is not None:
            if hosted.cheap and hosted.batcher.alone():
                # light load and a quick stage: no thread hop, no waiting; requests that
                # arrived together (drained in one go) still run as one batch
                if on_io:
                    self.inline.setdefault(id(hosted), (hosted, []))[1].append(item)
                else:
                    self.run_batch(hosted, [item])
            else:
                hosted.batcher.put(item)
        elif hosted.cheap:
            # a waking worker thread costs more than a stage this quick: run it on this
            # thread (the IO thread runs it after reading, outside the read's corked sends)
            if on_io:
                self.inline_runs.append((hosted, [item]))
            else:
                self.run_one(hosted, item)
        else:
            self.pool.submit(self.run_one, hosted, item)

    # -- running ------------------------------------------------------------------------------

    def run_one(self, hosted: HostedStage, item: WorkItem) -> None:
        h, ev = item.message, RunCancel()
        # flow.wait in the operator returns when the gateway gives the request up (set_cancel)
        serving = self.races.begin_run([h], ev)
        if serving is None:
            if hosted.hedger is not None:
                hosted.hedger.forget(item)  # given up on while it waited: no backup for it
            return
        set_deadline(h.deadline)  # flow.deadline(): the time left
        set_cancel(ev)
        try:
            if not raced(hosted.stage):
                return self._run_one(hosted, item)
            key = (h.gateway, h.req, h.attempt, h.stage)
            if not self.races.start(key, ev):
                if hosted.hedger is not None:
                    hosted.hedger.forget(item)  # no backup for it: the race is over
                self.races.dropped(item.message)
                return  # its race was won while it waited: another copy answered
            try:  # flow.wait in the operator also returns when the race is won elsewhere
                self._run_one(hosted, item)
            finally:
                self.races.finish(key, ev)
                if ev.is_set() and hosted.hedger is not None:
                    hosted.hedger.forget(item)  # a hedge whose other copy won: no answer from this one
        finally:
            set_cancel(None)
            set_deadline(None)
            self.races.end_run(serving)

    def _run_one(self, hosted: HostedStage, item: WorkItem) -> None:
        if _expired(item.message):
            return self._too_late(hosted, item)
        key, run = self._begin(hosted, [item])
        span = self._span(hosted, [item], run) if tracing.tracer is not None and item.message.tp else None
        if span is None:
            return self._run_watched(hosted, item, key, run)
        with span:  # the run's span is the thread's current one: cache and store lookups nest in it
            self._run_watched(hosted, item, key, run)

    def _run_watched(self, hosted: HostedStage, item: WorkItem, key: int, run: Run) -> None:
        t0 = time.perf_counter()
        while True:
            try:
                if not item.message.stream:
                    out = self._execute(hosted, item.inputs, item.after_head, run)
                else:
                    emit = progress.yielding(self.send, hosted, [item])  # a streamed generator's outputs go ahead
                    with progress.sending(self.send, hosted, [item]):  # a first_then's fast rows go ahead
                        out = self._execute(hosted, item.inputs, item.after_head, run, emit)
            except FlowError as e:
                if self._end(key, run):
                    return
                _log_failure(item.message, hosted.stage.name, e)
                self.fail(item.message, e, hosted)
                return
            except BaseException as e:  # a bug in user code, or SystemExit: one request, never the executor
                if self._end(key, run):
                    return
                log.exception("%s failed", about(item.message, hosted.stage.name, None))
                self.fail(item.message, e, hosted)
                return
            ms = (time.perf_counter() - t0) * 1000
            nxt = self._chained(hosted, item, run)
            if nxt is None:
                break
            # the next stage runs now, on this thread, in this run (chained, below)
            with self._chained_lock:
                self.chained += 1
            hosted.observe(ms)
            if hosted.batcher is not None:
                self.count_batch(hosted, 1)  # a batch of one: forward counts the run it ends with
            h = item.message
            trace = item.trace + [[hosted.stage.name, self.id, round(ms, 3), 1]]
            # the path its input would have come with (routing.deliveries): a continuation's
            # one key group, all the rows; a plain stage's input merged whole
            path = item.path + ((0, 1),) if nxt.stage.continuation is not None else ()
            item = WorkItem(h.to(nxt.stage.name, hosted.stage.name, path, 0, out, trace), [out], path, trace)
            hosted = nxt
            run.stage, run.owner, run.messages, run.node = nxt.stage.name, nxt, [item.message], nxt.stage.nodes[0].name
            if self.blackbox is not None:
                self.blackbox.restage(run)  # the record names the stage running now
            t0 = time.perf_counter()
        if self._end(key, run):
            return  # abandoned (answered 504): its output is dropped
        if cancelled():
            if raced(hosted.stage):
                race_outcome(item.message, "cancelled")
            # a racing copy stopped early (flow.wait): the winner answered; or the request was
            # given up on (its output is dropped, Outputs). Its time is no sample either way
            return
        set_cancel(None)  # the run is over: consumers run next on this thread are no part of it
        hosted.observe(ms)
        self.forward(hosted, [(item, out)], ms, 1)

    def _chained(self, hosted: HostedStage, item: WorkItem, run: Run) -> HostedStage | None:
        """The stage to run next in this run, on this thread: the one consumer of a stage
        that does not race, when it is hosted here for this request (a continuation: here
        alone, so all the rows are its one key group), takes this output alone and whole
        (not one part of a split output, which it merges with the others), is quick and
        unwatched by Clipper, would run this request as a batch of its own (a batching stage
        whose queue is empty and whose batcher would not wait: what ``dispatch`` runs
        inline), and nothing else waits on the request (not traced, streamed, given up on or
        abandoned). None: the output goes on as any output does (Outputs.forward).

        Why: what a request's hop from one stage to the next on one executor costs (its
        input gathered, queued and picked up again, the run registered, watched and recorded
        anew: ~20 us a stage here) is most of what an unfused no-op stage costs, and none of
        it is needed where the next stage is plain and runs next on this thread anyway.
        Each stage still has its own trace entry, timing and record (watchdog, blackbox)."""
        name = hosted.chains_to
        if name is None or run.answered or run.overdue_at is not None:
            return None
        if not whole(item.path):
            return None  # one part of a split output: the consumer merges it with the others (Inputs)
        h = item.message
        if h.tp or h.stream or (self.races.revoked and self.races.given_up(h)) or cancelled():
            return None
        nxt = self.hosted.get((h.flow, h.version, name))
        if (
            nxt is None
            or not nxt.cheap
            or nxt.sole_input != hosted.stage.name
            or nxt.hedger is not None
            or nxt.report is not None
            or nxt.early is not None
        ):
            return None
        routes = h.routes.get(name)
        if routes is None or len(routes) != 1 or routes[0] != self.address or _expired(h):
            return None
        if nxt.batcher is not None and not nxt.batcher.alone():
            return None  # others queued, or a batch worth waiting for: it goes through the queue
        return nxt

    def run_batch(self, hosted: HostedStage, items: list[WorkItem]) -> None:
        """Run several requests as one merged Table, then split the output back by qid."""
        if len(items) == 1:  # run_one drops it if given up on, its race lost, or too late
            return self.run_one(hosted, items[0])
        if self.races.revoked:  # requests given up on while queued: the batch drops their rows
            gone = [it for it in items if self.races.given_up(it.message)]
            if gone:
                items = [it for it in items if not self.races.given_up(it.message)]
                for it in gone if hosted.hedger is not None else ():
                    hosted.hedger.forget(it)
        if self.cancelled and raced(hosted.stage):
            lost = [it for it in items if self.races.lost(hosted, it.message)]  # races won meanwhile
            if lost:
                items = [it for it in items if not self.races.lost(hosted, it.message)]
                for it in lost if hosted.hedger is not None else ():
                    hosted.hedger.forget(it)
                for it in lost:
                    self.races.dropped(it.message)
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
            if raced(hosted.stage):
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
        ev = RunCancel()  # set only when every request of the batch is given up on
        serving = self.races.begin_run([it.message for it in items], ev)
        if serving is None:
            return
        deadlines = [it.message.deadline for it in items if it.message.deadline is not None]
        set_deadline(min(deadlines) if deadlines else None)
        set_cancel(ev)
        try:
            key, run = self._begin(hosted, items)
            span = self._span(hosted, items, run) if tracing.tracer is not None else None
            if span is None:
                return self._run_merged_watched(hosted, items, owner, key, run)
            with span:
                self._run_merged_watched(hosted, items, owner, key, run)
        finally:
            set_cancel(None)
            set_deadline(None)
            self.races.end_run(serving)

    def _run_merged_watched(self, hosted: HostedStage, items: list[WorkItem], owner: dict, key: int, run: Run) -> None:
        t0 = time.perf_counter()
        try:
            merged = [Table.concat([it.inputs[k] for it in items]) for k in range(len(items[0].inputs))]
            emit = progress.yielding(self.send, hosted, items)
            with progress.sending(self.send, hosted, items):
                out = self._execute(hosted, merged, items[0].after_head, run, emit)
        except BaseException:
            self._end(key, run)
            # one bad request must not fail the others: run each alone to isolate it
            for k, it in enumerate(items):
                if k not in run.answered:
                    self.run_one(hosted, it)
            return
        self._end(key, run)
        if cancelled():
            return  # every request of the batch was given up on while it ran: nothing to send
        set_cancel(None)  # the run is over: consumers run next on this thread are no part of it
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

    # -- traces (executors/tracing.py) -----------------------------------------------------------

    def _span(self, hosted: HostedStage, items: list[WorkItem], run: Run) -> tracing.Run | None:
        """The span of a run, if a request it serves is traced: a child of the first one's
        request span, linking each of them when it serves several (a batch)."""
        traced = [it for it in items if tracing.sampled(it.message.tp)]
        if not traced:
            return None
        h, now = traced[0].message, time.perf_counter()
        attributes = {
            "flowserve.flow": h.flow,
            "flowserve.flow.version": h.version,
            "flowserve.stage": hosted.stage.name,
            "flowserve.executor": self.id,
            "flowserve.batch.size": len(items),
            "flowserve.lane": run.lane,
            "flowserve.attempt": h.attempt,
            "flowserve.queue.wait_ms": _waited_ms(traced[0], now),
        }
        if raced(hosted.stage):
            attributes["flowserve.race.copy"] = h.copy
        if hosted.stage.hedge is not None:
            attributes["flowserve.hedge.backup"] = h.copy != 0
        links = [{"flowserve.queue.wait_ms": _waited_ms(it, now)} for it in traced] if len(traced) > 1 else None
        return tracing.start_run(f"stage {hosted.stage.name}", [it.message.tp for it in traced], attributes, links)

    def _too_late(self, hosted: HostedStage, item: WorkItem) -> None:
        """The request's deadline passed while it waited for this stage: do not spend a run
        on it; say where it was stuck (the gateway's own 504 cannot tell)."""
        op = hosted.stage.nodes[0].name
        self.fail(
            item.message,
            OperatorTimeoutError(
                f"the request's deadline passed while it waited to run operator {op!r} (stage {hosted.stage.name!r})",
                operator=op,
            ),
            hosted,
        )

    def _execute(self, hosted: HostedStage, inputs: list[Table], after_head: bool, run: Run, emit=None) -> Table:
        """The stage's output for ``inputs``; with ``emit`` (progress.yielding), its
        generator's outputs handed to ``emit`` one by one as they are yielded."""
        bound = hosted.bound
        if emit is not None and not after_head:
            return bound.chain.each_output(inputs, self.store, self._on_node_resuming(hosted, run), emit)
        enter = self._on_node(run, len(hosted.stage.nodes) > 1)
        if not after_head:
            return bound(inputs, self.store, on_node=enter)
        out = inputs[0]
        for node, b in zip(hosted.stage.nodes[1:], bound.bound[1:]):
            enter(node)
            out = b([out], self.store)
        return out

    # -- watching runs (watchdog.py) ----------------------------------------------------------

    def _begin(self, hosted: HostedStage, items: list[WorkItem]) -> tuple[int, Run]:
        ident = threading.get_ident()
        if ident == self.io_thread:
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
            [monotonic_deadline(messages[0].deadline)]
            if len(messages) == 1
            else [monotonic_deadline(m.deadline) for m in messages],
            qid,
            owner=hosted,
        )
        run.node = hosted.stage.nodes[0].name
        self.gateways.add(messages[0].gateway)
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

    def _on_node_resuming(self, hosted: HostedStage, run: Run):
        """``_on_node`` for a run whose generator resumes after each output went through the
        operators after it: its timeout_s counts from its first start, not from each resume."""
        enter = self._on_node(run, True)
        gen = hosted.stage.nodes[hosted.bound.chain.yields]
        started = None

        def resume(node) -> None:
            nonlocal started
            enter(node)
            if node is gen:
                if started is None:
                    started = run.node_started
                else:
                    run.node_started = started

        return resume

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
            log.warning("%s: %s", about(h, run.stage, run.qid), msg)
            self.fail(h, OperatorTimeoutError(msg, operator=run.node, qid=run.qid), hosted)
        if run.abandoned and not run.lost:
            run.lost = True
            self._lane_lost(run)

    def _lane_lost(self, run: Run) -> None:
        """A thread is held by abandoned work: keep the executor's capacity by replacing it."""
        hosted = run.owner
        if run.lane == "io":
            if not run.handed_off:
                self.hand_off_io(run)
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
            except Exception:  # the process exits next whatever a hook does: log it and go on
                log.exception("executor %s: exit hook failed", self.id)
        os._exit(EXIT_RECYCLED)

    def _report(self, msg: Message) -> None:
        frames = msg.encode()
        for gw in list(self.gateways):
            if gw:
                self.send(gw, frames)


def _nothing() -> None:
    pass


def about(h: StageInput, stage: str, qid) -> str:
    """What a log line about a request names: ``flow F stage S qid Q request R``, the
    request by the id its answer carries (X-Request-Id), the qid where one row is meant."""
    where = f"flow {h.flow} stage {stage}" if qid is None else f"flow {h.flow} stage {stage} qid {qid}"
    return f"{where} request {h.rid or h.req}{tracing.log_tag(h.tp)}"


def _log_failure(h: StageInput, stage: str, error: FlowError) -> None:
    """A failed run's one log line. An operator's failure (the user's code to fix) at
    WARNING, with what the user's code raised and where (its traceback, the user's frames:
    flow/tracebacks.py); the client's answer says only what and which operator. What the
    request itself caused (a rejected row, a missing key) at INFO: its answer says it all."""
    if isinstance(error, OperatorError):
        tb = operator_traceback(error)
        log.warning("%s: %s%s", about(h, stage, error.qid), error, "" if tb is None else "\n" + tb)
    else:
        log.info("%s: %s", about(h, stage, error.qid), error)


def _waited_ms(item: WorkItem, now: float) -> float:
    """How long a traced item waited between being ready and its run (0: not known)."""
    return round((now - item.ready) * 1000, 3) if item.ready else 0.0


def _expired(msg: StageInput) -> bool:
    """True if the request's deadline has passed (the gateway answered it 504)."""
    return msg.deadline is not None and time.time() > msg.deadline


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
