"""Gathering a stage's inputs on an executor, per request attempt: all inputs of a join, all
parts of a key-split input, the first of competing copies (later ones dropped), the first
valid of competing alternatives; a relayed body parsed into the stage's input (once per
executor for a race's copies); and the requests done here, so late copies are dropped.

What a message makes ready is returned as (stage, work) pairs, for the running part to start.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from executors.codec.bodies import ARROW, BadRequestError, input_table, one_row_table, parse_body
from executors.wire.messages import RawInput, StageInput
from executors.wire.routing import complete, merge
from executors.worker.batcher import WorkItem
from executors.worker.hosting import HostedStage, Stages
from executors.worker.races import Races, raced
from flow.errors import DataError, NoValidResultError, OperatorError
from flow.table import Table, built_column

DONE_MEMORY = 100_000  # (request, stage) pairs remembered to drop late competing copies
#: parsed relayed rows held for racing copies still to come to this executor (each entry is
#: dropped when its last copy comes; a copy that never comes leaves it to this bound)
RAW_COPIES_MAX = 256


@dataclass
class Pending:
    """Inputs of one stage for one request attempt, as they arrive."""

    parts: dict = field(default_factory=dict)  # from-stage -> {path: Table}
    order: list = field(default_factory=list)  # first_valid: alternatives in arrival order
    trace: list = field(default_factory=list)
    deadline: float = 0.0
    flow: tuple = ()  # (flow, version): an unload drops the pending inputs of its version


class Inputs:
    """The inputs arrived for each request attempt's stages, and the attempts done.

    Called by the IO thread for messages and by workers for local deliveries, so ``pending``
    and ``done`` are kept under ``lock``, the lock Races and Stages share (executor.py); the
    work a message makes ready runs after, outside it."""

    def __init__(self, lock: threading.Lock, stages: Stages, races: Races, fail, address: str):
        self.lock = lock
        self.hosted = stages.hosted  # Stages' own table, read here on every message
        self.rehost = stages.rehost
        self.cancelled = races.cancelled  # Races' own table, read here on every message
        self.revoked = races.revoked  # requests the gateway gave up on (Races' own table)
        self.dropped = races.dropped  # a race's copy dropped on arrival: its span, when traced
        self.fail = fail  # outputs.Outputs.fail: a bad body, no valid alternative
        self.address = address
        self.pending: dict[tuple, Pending] = {}
        self.done: OrderedDict = OrderedDict()
        # (gateway, request, attempt, stage) -> [a parsed relayed row, copies here still to
        # come]: a race's copies sent to this executor parse the body once
        self._raw_rows: OrderedDict = OrderedDict()
        # relayed bodies read here, by format (for /metrics); only the IO thread reads messages
        self.relayed = {"json": 0, "arrow": 0}

    def gather(self, h: StageInput) -> list:
        """Record one arriving input; returns the (stage, work) pairs it made ready."""
        with self.lock:
            return self._gather(h)

    def gather_raw(self, r: RawInput) -> list:
        """A request's body as the client sent it (the gateway relayed it unparsed): parsed
        and checked here as the gateway would (the same functions: the same 400s), then
        the stage's input, whose answer the sink renders as the client's JSON."""
        if self.revoked and (r.gateway, r.req) in self.revoked:
            return []  # given up on (the client left): not worth parsing
        key = (r.flow, r.version, r.stage)
        hosted = self.hosted.get(key)
        if hosted is None:
            with self.lock:
                hosted = self.hosted.get(key) or self.rehost(r.as_input(None), key)
            if hosted is None:
                return []
        races = raced(hosted.stage)
        if races:
            ready = self._raced_raw(r)
            if ready is not None:
                return ready
        schema = hosted.plan.input_schema
        self.relayed["arrow" if r.ctype.startswith(ARROW) else "json"] += 1
        try:
            table = one_row_table(r.body, r.ctype, r.qid, schema)
            if table is None:  # not the short way's shape: the general path, which names what is wrong
                rows = parse_body(r.body, r.ctype, schema)
                if len(rows) != 1:  # the gateway relays one row only
                    raise BadRequestError(f"a relayed body must be one row, got {len(rows)}")
                table = input_table(r.flow, rows, np.array([r.qid], dtype=np.int64), schema)
        except (BadRequestError, DataError) as e:
            self.fail(r.as_input(None), e)
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
            self.dropped(r)  # its span, when traced (races.py)
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
        if self.revoked and (h.gateway, h.req) in self.revoked:
            return []  # the gateway gave up on its request: a late input (an upstream output on its way)
        key = (h.flow, h.version, h.stage)
        hosted = self.hosted.get(key)
        if hosted is None:
            hosted = self.rehost(h, key)
            if hosted is None:
                return []
        stage, table = hosted.stage, h.table
        src = h.source
        path = tuple(tuple(p) for p in h.path)
        rid = (h.gateway, h.req, h.attempt, h.stage)  # request ids are per gateway
        if stage.continuation is not None:
            rid += (path,)  # each key group of a request runs on its own
        if self.cancelled and rid in self.cancelled and raced(stage):
            self.dropped(h)  # its span, when traced (races.py)
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
            self.fail(h, e)
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
            self.fail(
                h, NoValidResultError(f"operator {name!r}: no alternative gave a valid result", operator=name, qid=qid)
            )
            del self.pending[rid]
            self._mark_done(rid)
        return []

    def _mark_done(self, rid) -> None:
        self.done[rid] = True
        if len(self.done) > DONE_MEMORY:
            self.done.popitem(last=False)

    def claim(self, rid) -> Pending | None:
        """The inputs arrived so far for ``rid``, gathered no further: inputs that come later
        are dropped (an ensemble's deadline answer, hedging.py). None if it was ready already."""
        with self.lock:
            pend = self.pending.pop(rid, None)
            if pend is not None:
                self._mark_done(rid)
            return pend

    def forget(self, flow: str, version: int) -> None:
        """Drop the pending inputs of an unloaded flow version; the caller holds ``lock``."""
        for rid in [r for r, p in self.pending.items() if p.flow == (flow, version)]:
            del self.pending[rid]

    def revoke(self, gateway: str, reqs: list, races: Races) -> None:
        """The gateway gave up on requests ``reqs`` (messages.Revoke): remember them (Races)
        and drop the inputs gathered for them so far."""
        with self.lock:
            keys = set(races.revoke(gateway, reqs, time.time()))
            if keys and self.pending:
                for rid in [r for r in self.pending if (r[0], r[1]) in keys]:
                    del self.pending[rid]

    def expire(self, now: float) -> None:
        """Drop the inputs of requests past their deadline (the gateway answered them 504)."""
        with self.lock:
            for rid in [r for r, p in self.pending.items() if p.deadline < now]:
                del self.pending[rid]


def _own_rows(table: Table) -> Table:
    """A copy of a (small) Table whose arrays are its own."""
    cols = {
        name: built_column(c.type, c.values.copy(), None if c.valid is None else c.valid.copy())
        for name, c in table._cols.items()
    }
    return Table.built(cols, table._qid.copy())
