"""A first_then's fast rows sent to the gateway before its slow rows are done
(flow/progressive.py): when the sink stage's last operator is a first_then, each run of
that stage has an emitter that splits the fast rows by request and sends each request's
rows (``Partial``) to its gateway at once. The stage's output (the final rows) then
goes as every sink's does (outputs.py)."""

from __future__ import annotations

import contextlib

import numpy as np

from executors.wire.messages import Partial
from flow.progressive import KIND, emitting
from flow.table import Table

_NOTHING = contextlib.nullcontext()  # reusable: the context of every other stage's runs


def progressive(hosted) -> bool:
    """Whether runs of this hosted stage send a first_then's fast rows ahead."""
    return hosted.is_sink and getattr(hosted.stage.nodes[-1].op, "kind", None) == KIND


def sending(send, hosted, items):
    """A context for one run of ``hosted`` serving ``items`` (WorkItems): within it, the
    stage's first_then sends its fast rows ahead, by request; a no-op for other stages."""
    if not progressive(hosted):
        return _NOTHING

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
            h = item.message
            send(h.gateway, Partial(h.req, h.attempt, final[idx].tolist(), first.take(idx)).encode())

    return emitting(emit)
