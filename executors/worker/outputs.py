"""Where a stage's output goes from an executor: on to the executors of the next stages, as
the request's routing table says (consumers hosted here are handed the message, no socket),
and the sink's to the gateway (a relayed body's answer rendered as the client's JSON); and
a request's error, to the gateway, unless the flow can still answer without it.
"""

from __future__ import annotations

import bisect
import logging
import threading

import numpy as np

from executors import tracing
from executors.codec.bodies import OFF_LOOP_ROWS, json_rows
from executors.errors import OperatorTimeoutError, status_for
from executors.wire.messages import Failure, Rendered, Result, StageInput
from executors.wire.routing import deliveries, keeps_rows, merge, whole
from executors.worker.batcher import WorkItem
from executors.worker.hosting import HostedStage
from executors.worker.races import Races, raced
from flow.errors import FlowError, OperatorOutputError
from flow.table import Table

log = logging.getLogger("flowserve.executor")

EVICTION_QUIET_S = 10.0  # a cache that evicted within this long serves only the keys it owns
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # upper bounds of the batch-size histogram's buckets (/metrics)


class Outputs:
    """Sends runs' outputs and requests' errors on. Consumers hosted here are gathered and
    started by the parts given to ``hand_local`` (Inputs.gather, Runner.dispatch), which
    are built after this one: they fail requests through it."""

    def __init__(self, executor_id: str, address: str, store, send, outbox, races: Races):
        self.id = executor_id
        self.address = address
        self.store = store
        self.send = send
        self.outbox = outbox
        self.races = races
        self.cancelled = races.cancelled  # Races' own table, read here before each failure
        self.revoked = races.revoked  # requests the gateway gave up on: nothing of them is sent
        self.gather = self.dispatch = None
        # (flow, stage) -> [runs per BATCH_BUCKETS bucket..., requests]: batching stages' batch
        # sizes, reported in pongs for the gateway's /metrics (executor.Executor.stats)
        self.batches: dict[tuple[str, str], list[int]] = {}
        self._batches_lock = threading.Lock()

    def hand_local(self, gather, dispatch) -> None:
        """Who takes an output whose consumer is hosted here: ``gather`` records it as that
        stage's input, ``dispatch`` starts the work it made ready."""
        self.gather, self.dispatch = gather, dispatch

    def forward(self, hosted: HostedStage, outputs: list[tuple[WorkItem, Table]], ms: float, batch: int) -> None:
        """Send each request's output on to the gateway (sink) and to remote consumers, one
        write per peer for them all; consumers hosted here start once the messages have
        left (a remote branch must not wait for a local one)."""
        if hosted.batcher is not None:
            self.count_batch(hosted, batch)
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
                    self.fail(
                        item.message,
                        OperatorOutputError(
                            f"operator {op!r} returned a value that cannot be sent on ({type(e).__name__}: {e})",
                            operator=op,
                        ),
                        hosted,
                    )
            if tracing.tracer is not None and any(tracing.sampled(item.message.tp) for item, _out in outputs):
                # the run's span ends as its outputs are handed over (they leave as the cork
                # opens), before a consumer hosted here runs next on this thread: no part of it
                tracing.end_current()
        for ready in local:
            self.dispatch(*ready)

    def count_batch(self, hosted: HostedStage, batch: int) -> None:
        """One run of ``batch`` requests of a batching stage, for its batch size histogram."""
        key = (hosted.plan.flow_name, hosted.stage.name)
        with self._batches_lock:
            counts = self.batches.get(key)
            if counts is None:
                counts = self.batches[key] = [0] * (len(BATCH_BUCKETS) + 2)
            counts[bisect.bisect_left(BATCH_BUCKETS, batch)] += 1
            counts[-1] += batch

    def batch_counts(self) -> list:
        """[[flow, stage, [runs per BATCH_BUCKETS bucket, then over the last], requests], ...]"""
        with self._batches_lock:
            return [[flow, stage, counts[:-1], counts[-1]] for (flow, stage), counts in self.batches.items()]

    def _deliver(self, hosted: HostedStage, item: WorkItem, out: Table, ms: float, batch: int) -> list:
        """Send one request's output; the ready work of consumers hosted here, to start."""
        h = item.message
        trace = item.trace + [[hosted.stage.name, self.id, round(ms, 3), batch]]
        extra = None
        if hosted.report is not None:
            extra = hosted.report(item)  # cache hits, hedges: the gateway's /metrics (hedging.py)
        aimd = hosted.batcher.aimd if hosted.batcher is not None else None
        if aimd is not None:  # AIMD's cap on this replica now: GET /flows/{name} shows it
            extra = {**(extra or {}), "cap": aimd.batch_size}
        racing = raced(hosted.stage)
        if racing and h.tp and tracing.tracer is not None:
            # which copy's output this is: the consumer that takes it first (the gateway, for
            # the sink) marks the race's winner on the request's span (invoke.py)
            extra = {**(extra or {}), "copy": h.copy, "span": tracing.current_span_id()}
        if extra is not None:
            trace[-1].append(extra)
        if racing and self.races.lost(hosted, h):
            race_outcome(h, "lost")
            return []  # another copy won (and sent its output) while this one ran: drop this one's
        if self.revoked and (h.gateway, h.req) in self.revoked:
            return []  # the gateway gave up on the request (its client left) while this ran
        if racing:
            race_outcome(h, "answered")
        local = []
        if hosted.is_sink:
            answer = _rendered(h, trace, out, item.path) if h.render else None
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
            self.races.cancel_rivals(h)  # a hedge: only once its backup went (clipper.Hedger)
        return local

    def _kept_keys(self):
        """Which continuation rows may stay here instead of going to their key's owner:
        those whose key this cache holds, unless it has had to evict lately (None: none).
        A cache that evicts holds less than its share of the keys: serving other owners'
        keys from it would push out its own (and leave their owners cold), so then rows
        go strictly to their owners, which partitions the working set across the caches."""
        return None if self.store.evicted_within(EVICTION_QUIET_S) else self.store.holds

    def fail(self, h: StageInput, error: BaseException, hosted: HostedStage | None = None) -> None:
        """Answer ``h``'s request with ``error``, unless the flow still answers without this
        stage's part: a losing copy of a race, an alternative of a choice, an ensemble's
        straggling member."""
        if hosted is not None and self.cancelled and self.races.lost(hosted, h):
            race_outcome(h, "cancelled")
            return  # a losing copy's failure (e.g. stopped early): the winner answered
        if self.revoked and (h.gateway, h.req) in self.revoked:
            return  # the gateway gave up on the request: it answered it already
        if tracing.tracer is not None and h.tp:
            tracing.fail(error)  # the run's span, when this is a traced run's failure
        if (
            hosted is not None
            and hosted.consumers
            and all(hosted.plan.stages[c].wait == "first_valid" for c in hosted.consumers)
        ):
            # an alternative that fails is just not valid: the choice may still succeed. Its
            # input without a table says so; why it failed was logged here (Runner.run_one)
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
            return  # a straggling ensemble member: the ensemble answers without it (hedging.py)
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


def race_outcome(h: StageInput, outcome: str) -> None:
    """Mark a race copy's span: answered (its output went on; the first to reach the
    consumer wins, which the request's span names), lost (it finished after its race was
    won) or cancelled (stopped early, or dropped before it ran)."""
    if tracing.tracer is not None and h.tp:
        tracing.note("flowserve.race.outcome", outcome)


def _rendered(h: StageInput, trace: list, out: Table, path) -> list | None:
    """A relayed body's answer as the client's JSON (Rendered); None for an answer rendered
    off the loop by the gateway (over OFF_LOOP_ROWS rows), that JSON cannot carry, or that
    is one part of several (rows split by key upstream: the gateway merges the parts): the
    gateway then encodes the Table itself, and names the operator, as for any answer."""
    if len(out) > OFF_LOOP_ROWS:
        return None
    if path:
        if not whole(path):
            return None  # one part of several
        out = merge({tuple(map(tuple, path)): out})  # the one part of a split: without its positions column
    try:
        body = json_rows(out)
    except (TypeError, ValueError):  # orjson's errors are TypeErrors; UnencodableError
        return None
    schema = {c: t.to_json() for c, t in out.schema.items()}
    return Rendered(h.req, h.attempt, trace, len(out), schema, body).encode()
