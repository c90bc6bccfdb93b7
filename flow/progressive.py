"""Progressive answers: ``node.first_then(fast, slow, names=[...], when=pred)``.

What it means (``flow.run``, and every answer that is not streamed): per row, ``fast``'s
output, unless ``when`` (a predicate on that output's row) says the slow branch is needed,
then ``slow``'s output for the row (``slow`` runs on the input row). One output row per
input row, qids and order kept, as a map. Without ``when`` every row takes ``slow``'s.

What a stream adds (executors/gateway/streaming.py): where this operator is the last of
its flow, its fast rows leave as soon as they are computed, each event marked
``"final": false`` when the slow branch is still to come for it and ``"final": true``
when it is not; the slow branch's row follows as the row's final event. So a row sends
two events when ``when`` holds and one when it does not; the last event of a row is its
``flow.run`` row.

The runtime learns of the fast rows through ``emitting``: the executor running the sink
stage sets an emitter for the run, which this operator calls with the fast output and
which rows are final; anywhere else (``flow.run``, a stage that is not the sink) there is
no emitter and the fast rows are only the way to the final answer.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flow.errors import OperatorOutputError
from flow.operators import BoundOperator, MapOp, Operator, callable_name
from flow.operators import _invoke as invoke
from flow.table import Table

KIND = "first_then"

_local = threading.local()


@contextlib.contextmanager
def emitting(emit: Callable[[Table, np.ndarray], None] | None):
    """Within it, a first_then run on this thread calls ``emit(fast_rows, final)`` (one
    bool per row: no slow row will follow) before it runs its slow branch."""
    before = getattr(_local, "emit", None)
    _local.emit = emit
    try:
        yield
    finally:
        _local.emit = before


@dataclass(frozen=True)
class FirstThenOp(Operator):
    kind = KIND
    fast: Callable | None = None
    slow: Callable | None = None
    names: tuple[str, ...] = ()
    when: Callable | None = None
    batching_: bool = False
    gpu_: bool = False

    @property
    def label(self) -> str:
        return f"first_then({callable_name(self.fast)},{callable_name(self.slow)})"

    def describe(self) -> str:
        when = "" if self.when is None else f" when {callable_name(self.when)}"
        flags = " [batching]" if self.batching else ""
        return (
            f"first_then {callable_name(self.fast)} then {callable_name(self.slow)}{when} "
            f"-> {', '.join(self.names)}{flags}"
        )

    def branch(self, fn) -> MapOp:
        return MapOp(fn=fn, names=self.names, batching_=self.batching_, gpu_=self.gpu_)

    def instantiate(self):
        return _BoundFirstThen(
            self, self.label, self.branch(self.fast).instantiate(), self.branch(self.slow).instantiate()
        )


class _BoundFirstThen(BoundOperator):
    op: FirstThenOp

    def __init__(self, op: FirstThenOp, name: str, fast: BoundOperator, slow: BoundOperator):
        super().__init__(op, name)
        self.fast, self.slow = fast, slow

    def __call__(self, inputs, store=None):
        (table,) = inputs
        first = self.fast([table], store)
        need = self._needs_slow(first)
        emit = getattr(_local, "emit", None)
        if emit is not None and len(first):
            emit(first, ~need)
        if not need.any():
            return first
        idx = np.flatnonzero(need)
        second = self.slow([table.take(idx)], store)
        # every row keeps its place: its fast row where no slow row was needed, else its slow one
        return Table.concat([first, second]).take(_placed(idx, len(first)))

    def _needs_slow(self, first: Table) -> np.ndarray:
        if self.op.when is None:
            return np.ones(len(first), dtype=bool)
        out = np.zeros(len(first), dtype=bool)
        for i, (row, q) in enumerate(zip(first.rows(), first.qid.tolist())):
            verdict = invoke(self.name, self.op.when, row, q)
            if not isinstance(verdict, (bool, np.bool_)):
                raise OperatorOutputError(
                    f"operator {self.name!r}: when= must return True or False, got {type(verdict).__name__}",
                    operator=self.name,
                    qid=q,
                )
            out[i] = bool(verdict)
        return out


def _placed(idx: np.ndarray, n: int) -> np.ndarray:
    """Positions in ``concat([first, second])`` of each row's answer: its fast row where it
    needed no slow one, its slow row (after the ``n`` fast ones) where it did."""
    out = np.arange(n, dtype=np.int64)
    out[idx] = n + np.arange(len(idx), dtype=np.int64)
    return out
