"""Rows a sink stage sends to the gateway before its run is done (``Partial``): a
first_then's fast rows before its slow rows (flow/progressive.py), and a streamed
request's generator outputs as the generator yields them.

When the sink stage's last operator is a first_then and a request of the run is streamed
(``StageInput.stream``), the run has an emitter that splits the fast rows by request and
sends each streamed request's rows to its gateway at once. When the sink stage's chain can run output by output (fused.FusedChain.yields)
and a request of the run is streamed (``StageInput.stream``), the run hands each
generator output, once through the operators after it, to ``yielding``'s emitter, which
sends it to that request's gateway; a run serving no streamed request sends none. The
stage's output (the final rows) then goes as every sink's does (outputs.py).
"""

from __future__ import annotations

import contextlib

import numpy as np

from executors.wire.messages import Partial
from flow.context import cancelled
from flow.progressive import KIND, emitting
from flow.table import Table

_NOTHING = contextlib.nullcontext()  # reusable: the context of every other stage's runs


def progressive(hosted) -> bool:
    """Whether runs of this hosted stage send a first_then's fast rows ahead."""
    return hosted.is_sink and getattr(hosted.stage.nodes[-1].op, "kind", None) == KIND


def sending(send, hosted, items):
    """A context for one run of ``hosted`` serving ``items`` (WorkItems): within it, the
    stage's first_then sends its fast rows ahead, by request; a no-op for other stages."""
    if not progressive(hosted) or not any(it.message.stream for it in items):
        return _NOTHING  # no first_then here, or no streamed request in the run to read fast rows

    def emit(first: Table, final: np.ndarray) -> None:
        if len(items) == 1:
            parts = [(items[0], np.arange(len(first)))]
        else:
            owner = {q: k for k, it in enumerate(items) for t in it.inputs for q in t.qid.tolist()}
            rows: list[list[int]] = [[] for _ in items]
            for i, q in enumerate(first.qid.tolist()):
                if q in owner:
                    rows[owner[q]].append(i)
            parts = [(it, np.asarray(r, dtype=np.int64)) for it, r in zip(items, rows) if r]
        for item, idx in parts:
            if not item.message.stream:
                continue  # a whole answer: only its final rows matter
            h = item.message
            send(h.gateway, Partial(h.req, h.attempt, final[idx].tolist(), 0, first.take(idx)).encode())

    return emitting(emit)


def yielding(send, hosted, items):
    """The emitter for one run of ``hosted`` serving ``items`` (WorkItems) whose generator
    outputs go to the gateway as they are yielded: ``emit(rows)`` with rows of one qid;
    None where the stage's outputs leave together (not the sink, a stage that cannot run
    output by output, one ending in a first_then, or no streamed request among ``items``)."""
    if not hosted.is_sink or hosted.bound.chain.yields is None or progressive(hosted):
        return None
    streamed = [it for it in items if it.message.stream]
    if not streamed:
        return None
    owner = {q: it for it in streamed for t in it.inputs for q in t.qid.tolist()} if len(items) > 1 else None
    sent: dict[int, int] = {}  # qid -> its rows sent so far (where the next ones begin)

    def emit(rows: Table) -> None:
        q = int(rows.qid[0])
        item = items[0] if owner is None else owner.get(q)
        if item is None or cancelled():
            return  # a request of the batch that is not streamed; or every request was given up on
        start = sent.get(q, 0)
        sent[q] = start + len(rows)
        h = item.message
        send(h.gateway, Partial(h.req, h.attempt, [True] * len(rows), start, rows).encode())

    return emit
