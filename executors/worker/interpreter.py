"""The local plan interpreter: run a Plan in-process, stage by stage, like ``flow.run``.

This is the executable meaning of a physical plan; the distributed runtime must give the
same rows. It follows the plan's marks the way a deployment does, minus the network:

- stages run in topological order, each as one call of its fused operators;
- a ``competitive`` stage runs once (its replicas would compute the same pure result);
- a ``first_valid`` stage gets every alternative's output (or the error it raised) and
  picks, per row, the first valid one in argument order, exactly like ``AnyOfOp``;
- a batching stage (``stage.batch``) runs the requests of ``run_many`` as merged Tables
  (``Table.concat``, up to ``max_batch_size`` requests per call) and splits the result back
  by the requests' qids; every other stage runs once per request;
- with ``route_by_key=True`` a continuation stage runs once per distinct key value of its
  key column and merges the outputs back into row order, as a deployment that routes rows
  by key does.

    interp = Interpreter(optimize(flow))
    interp.run(rows, kvs=store)                              # == flow.run(rows, kvs=store)
    res = interp.run_many([req1, req2, req3], kvs=store)     # disjoint qids
    res.tables()                                             # one result per request
    res.stats.batches                                        # {"SmallNet": 1, ...}

Semantics that differ from running each request alone, by design: a merged batch gives
columns the type shared by all requests (``Table.concat`` widens int to float, a column
that is missing in one request takes the other's type), so compare values, not types; when
a merged call fails, each request is re-run alone through that stage so only the requests
that fail on their own fail (``stats.fallbacks`` counts this). When several operators of a
request fail, which error is reported may differ from ``flow.run`` (stages run in another
order). If every alternative of an anyof raised on an empty input, the plan raises
NoValidResultError where ``flow.run`` returns an empty Table (the choose stage cannot see
that the input was empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from executors.worker.stage_runner import BoundStage
from flow.errors import (
    DataError,
    FlowError,
    FlowTypeError,
    OperatorFailedError,
    OperatorOutputError,
    RowRejectedError,
    SchemaError,
)
from flow.table import Table
from optimizer import positions
from optimizer.plan import INPUT, Plan, Stage

# The errors an anyof alternative may raise without failing the query (see AnyOfOp).
ALTERNATIVE_ERRORS = (OperatorFailedError, OperatorOutputError, RowRejectedError)


@dataclass
class RunStats:
    """What the interpreter did: per stage, how many requests each call carried."""

    calls: dict[str, list[int]] = field(default_factory=dict)
    fallbacks: dict[str, int] = field(default_factory=dict)  # merged calls re-run per request

    @property
    def batches(self) -> dict[str, int]:
        """Per stage, the number of calls that merged two or more requests."""
        return {s: sum(1 for n in sizes if n > 1) for s, sizes in self.calls.items()}

    def record(self, stage: str, requests: int) -> None:
        self.calls.setdefault(stage, []).append(requests)


@dataclass
class ManyResult:
    """``run_many``'s answer: per request its result Table or the FlowError it failed with."""

    results: list
    stats: RunStats

    def tables(self) -> list[Table]:
        """The result Tables; raises the first request's error if any request failed."""
        for r in self.results:
            if isinstance(r, BaseException):
                raise r
        return list(self.results)


@dataclass
class _Request:
    table: Table
    values: dict = field(default_factory=dict)  # stage name -> Table, or a soft error
    error: FlowError | None = None


class Interpreter:
    """Runs one plan; operators are built once (like one replica of each stage)."""

    def __init__(self, plan: Plan, *, route_by_key: bool = False):
        if not isinstance(plan, Plan):
            raise FlowTypeError(f"Interpreter expects a Plan, got {type(plan).__name__}")
        self.plan = plan
        self.route_by_key = route_by_key
        self._bound = {name: BoundStage(s) for name, s in plan.stages.items()}
        consumers = plan.consumers()
        # An anyof alternative's own failure is a value its choose stage weighs, not an error.
        self._soft = {
            name
            for name in plan.stages
            if consumers[name] and all(plan.stages[c].wait == "first_valid" for c in consumers[name])
        }
        self._schema = SimpleNamespace(name=plan.flow_name, schema=plan.input_schema)

    # -- entry points --------------------------------------------------------------------

    def run(self, data, kvs=None, qid=None) -> Table:
        """Run one request; the same rows as ``flow.run(data, kvs)``, errors raised."""
        return self.run_many([self._input(data, qid)], kvs).tables()[0]

    def run_many(self, requests: Sequence, kvs=None) -> ManyResult:
        """Run several requests (Tables or row data with disjoint qids) together; batching
        stages see them merged. Returns every request's result or error, and stats."""
        if isinstance(requests, (Table, str, bytes)) or not isinstance(requests, Sequence):
            raise FlowTypeError(f"run_many expects a list of requests, got {type(requests).__name__}")
        reqs = [_Request(self._input(d)) for d in requests]
        owner: dict[int, int] = {}
        for r, req in enumerate(reqs):
            for q in req.table.qid.tolist():
                if q in owner:
                    raise SchemaError(
                        f"requests {owner[q]} and {r} both have qid {q}; "
                        f"the qids of requests run together must be disjoint"
                    )
                owner[q] = r
        stats = RunStats()
        for stage in self.plan.stages.values():
            self._run_stage(stage, reqs, owner, kvs, stats)
        results = [req.error if req.error is not None else req.values[self.plan.sink] for req in reqs]
        return ManyResult(results, stats)

    # -- internals -------------------------------------------------------------------------

    def _input(self, data, qid=None) -> Table:
        from flow.validation import check_input

        return check_input(self._schema, data, qid=qid)

    def _args(self, stage: Stage, req: _Request) -> list:
        return [req.table if i == INPUT else req.values[i] for i in stage.inputs]

    def _run_stage(self, stage: Stage, reqs, owner, kvs, stats: RunStats) -> None:
        ready: list[tuple[int, list]] = []
        for r, req in enumerate(reqs):
            if req.error is not None:
                continue
            args = self._args(stage, req)
            bad = next((a for a in args if isinstance(a, BaseException)), None)
            if bad is not None and stage.wait != "first_valid":
                req.error = bad
                continue
            ready.append((r, args))
        mergeable = [(r, a) for r, a in ready if not any(isinstance(x, BaseException) for x in a)]
        alone = [(r, a) for r, a in ready if any(isinstance(x, BaseException) for x in a)]
        if stage.batch is None or len(mergeable) < 2:
            alone = ready
            groups = []
        else:
            groups = self._groups(mergeable, stage.batch.max_batch_size)
        for r, args in alone:
            self._run_one(stage, reqs[r], args, kvs, stats)
        for group in groups:
            self._run_merged(stage, group, reqs, owner, kvs, stats)

    @staticmethod
    def _groups(ready, size: int):
        """Requests whose inputs have the same columns (in order) can merge; chunk by size."""
        by_columns: dict[tuple, list] = {}
        for r, args in ready:
            by_columns.setdefault(tuple(a.columns for a in args), []).append((r, args))
        out = []
        for members in by_columns.values():
            out.extend(members[i : i + size] for i in range(0, len(members), size))
        return out

    def _call(self, stage: Stage, args: list, kvs) -> Table:
        bound: BoundStage = self._bound[stage.name]
        if not (self.route_by_key and stage.continuation is not None):
            return bound(args, kvs)
        (table,) = args
        if stage.continuation not in table.columns or len(table) == 0:
            return bound(args, kvs)
        keys = table.column(stage.continuation).to_list()
        groups: dict = {}
        try:
            for i, k in enumerate(keys):
                groups.setdefault(k, []).append(i)
        except TypeError:  # unhashable keys: the lookup itself will reject them
            return bound(args, kvs)
        # each group runs as a part of a key split and the parts merge back by row position,
        # as in a deployment (optimizer.positions): the rows come back in the input's order
        parts = [bound([positions.split(table, np.asarray(idx))], kvs) for idx in groups.values()]
        return positions.merge(parts)

    def _run_one(self, stage: Stage, req: _Request, args: list, kvs, stats: RunStats) -> None:
        stats.record(stage.name, 1)
        try:
            req.values[stage.name] = self._call(stage, args, kvs)
        except FlowError as e:
            if stage.name in self._soft and isinstance(e, ALTERNATIVE_ERRORS):
                req.values[stage.name] = e
            else:
                req.error = e

    def _run_merged(self, stage: Stage, group, reqs, owner, kvs, stats: RunStats) -> None:
        if len(group) == 1:
            r, args = group[0]
            self._run_one(stage, reqs[r], args, kvs, stats)
            return
        try:
            merged = [Table.concat([args[p] for _, args in group]) for p in range(len(stage.inputs))]
        except DataError:  # column types that cannot be merged: run them one by one
            for r, args in group:
                self._run_one(stage, reqs[r], args, kvs, stats)
            return
        stats.record(stage.name, len(group))
        try:
            out = self._call(stage, merged, kvs)
        except FlowError:
            stats.fallbacks[stage.name] = stats.fallbacks.get(stage.name, 0) + 1
            for r, args in group:
                self._run_one(stage, reqs[r], args, kvs, stats)
            return
        who = np.fromiter((owner[q] for q in out.qid.tolist()), dtype=np.int64, count=len(out))
        for r, _ in group:
            reqs[r].values[stage.name] = out.take(np.flatnonzero(who == r))


def run_plan(plan: Plan, data, kvs=None) -> Table:
    """Run one request through ``plan`` in-process (see Interpreter.run)."""
    return Interpreter(plan).run(data, kvs)


def run_many(plan: Plan, requests: Sequence, kvs=None) -> ManyResult:
    """Run several requests through ``plan`` together, batching where it says (see
    Interpreter.run_many)."""
    return Interpreter(plan).run_many(requests, kvs)
