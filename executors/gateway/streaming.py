"""Streamed answers: ``POST /flows/{name}`` with ``Accept: application/x-ndjson`` (or
``text/event-stream``) answered row by row as the rows complete.

Events, one JSON document each (an NDJSON line, or an SSE ``data:`` line):

- ``{"qid": Q, "row": {...}}``: an answer row of input query Q (a generator map may give
  several rows of one qid, a filter none);
- ``{"error": ..., "message": ..., "operator": ..., "qid": ..., "status": N}``: the request
  failed (the non-streamed error body, with the status it would have had); the stream ends;
- ``{"end": true, "rows": N, "trace": [...]}``: every row was sent (N of them); ``trace`` is
  the ``X-Flowserve-Trace`` of the stage runs.

A plan whose stages are all row-wise (``Stage.rowwise``: each output row depends on one
input row; batching stages included) runs each input row as its own request through the
dispatcher (the batchers merge them again with each other and with other requests), so a
row's events leave as soon as its last stage is done, in completion order. A plan with an
operator that mixes rows (groupby/agg, a join on a data key) runs the rows as one request
and sends its rows when the whole answer is back: still a stream, one event per row.

A plan whose last operator is a first_then (flow/progressive.py) also gets the fast rows
its sink's executor sends ahead (``Partial``, executors/worker/progress.py): every row
event then carries ``"final"``, false on a fast row whose slow row follows, and a row whose
final event was sent ahead is not sent again with the answer.

A plan whose sink stage holds a generator map followed only by row-wise operators (one
chain: executors/worker/fused.py) gets each of the generator's outputs as it is yielded,
through those operators (``Partial``, all final, sent only for a streamed request: its run
messages say so): each is a row event of its own, as any row's (no ``"final"``), and the
answer's rows sent so are not sent again. Where other stages follow the generator's, its
outputs leave its stage together and reach the stream with the answer.

An error before the first event (the first row to complete failed) is answered as the
non-streamed request would be (its status and error body): a stream's status is only
200 when it has something to send. A float tensor holding NaN or infinity is the whole
JSON answer's error too (``OperatorOutputError``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import numpy as np
import orjson

from executors.codec.bodies import ARROW, _json_default
from executors.errors import JSON_CONTENT_TYPE, encode_error
from executors.gateway.records import RequestFailed
from flow.errors import OperatorOutputError
from flow.progressive import KIND as PROGRESSIVE
from flow.table import Table
from optimizer.plan import Plan

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def media_type(accept: str) -> str | None:
    """The stream format an ``Accept`` header asks for, or None for a whole answer."""
    if NDJSON in accept:
        return NDJSON
    if SSE in accept:
        return SSE
    return None


def row_by_row(plan: Plan) -> bool:
    """Whether a plan's rows may run as separate requests (every stage row-wise), so each
    row is streamed as soon as it is done."""
    return all(stage.rowwise for stage in plan.stages.values())


def progressive(plan: Plan) -> bool:
    """Whether a plan ends in a first_then, whose fast rows a stream sends ahead
    (flow/progressive.py): its events then say which rows are final."""
    return getattr(plan.stages[plan.sink].nodes[-1].op, "kind", None) == PROGRESSIVE


# submit(table, trace, on_partial) -> the answer Table (raises RequestFailed); on_partial
# takes the rows a sink sends ahead of the answer (a first_then's fast rows, a generator's
# outputs) as they arrive, and marks the request streamed
Submit = Callable[[Table, list, Callable], Awaitable[Table]]


async def answer(
    submit: Submit,
    plan: Plan,
    table: Table,
    media: str,
    trace_entries: Callable[[list], list],
    finished: Callable[[float], None],
) -> tuple[int, bytes | EventStream, list]:
    """(status, body, headers) of a streamed answer to ``table``'s rows. ``trace_entries``
    turns the stage runs' trace into the end event's list; ``finished(ms)`` is called once
    the end event is written (``inf`` when the request failed)."""
    t0 = time.perf_counter()
    events = _events(submit, plan, table, trace_entries)
    try:
        first = await events.__anext__()
    except RequestFailed as e:
        await events.aclose()
        finished(float("inf"))
        return e.status, encode_error(e.body), [JSON_CONTENT_TYPE]
    return 200, EventStream(media, first, events, t0, finished), [(b"content-type", media.encode())]


async def _events(submit: Submit, plan: Plan, table: Table, trace_entries) -> AsyncIterator[bytes]:
    """Each event's JSON document, as the rows complete; RequestFailed for a failure."""
    marked = progressive(plan)
    # ("partial", (rows, start), final) | ("rows", rows, trace) | ("error", e, None)
    done: asyncio.Queue = asyncio.Queue()

    def on_partial(rows: Table, final: list, start: int) -> None:
        try:
            _check_encodable(rows, plan)
        except RequestFailed:
            return  # the final rows say so (the same values reach them, or the slow branch's)
        done.put_nowait(("partial", (rows, start), final))

    async def run(rows: Table) -> None:
        trace: list = []
        try:
            out = await submit(rows, trace, on_partial)
            _check_encodable(out, plan)
        except RequestFailed as e:
            done.put_nowait(("error", e, None))
            return
        done.put_nowait(("rows", out, trace))

    parts = [table.take([i]) for i in range(len(table))] if row_by_row(plan) and len(table) > 1 else [table]
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(run(part)) for part in parts]
    trace: list = []
    answered = 0  # answer rows (final ones)
    # the rows sent ahead, and those of them that were final, as (qid, n): the n-th row of
    # that qid in the answer (a first_then keeps rows 1:1, so a request's fast rows and its
    # answer list the same rows in the same order; a generator's outputs come in the
    # answer's order, each Partial saying where its rows begin; racing copies and a retry's
    # attempt send alike, so a row already sent is not sent again)
    ahead: set[tuple[int, int]] = set()
    final: set[tuple[int, int]] = set()
    try:
        pending = len(tasks)
        while pending:
            kind, rows, extra = await done.get()
            if kind == "error":
                raise rows  # the RequestFailed run() put there
            if kind == "partial":
                rows, start = rows
                for key, row, last in zip(_keys(rows, start), rows.to_pylist(qid=False), extra):
                    if key not in ahead:
                        ahead.add(key)
                        if last:
                            final.add(key)
                        yield _row_event(key[0], row, bool(last) if marked else None)
                continue
            pending -= 1
            trace.extend(extra)
            answered += len(rows)
            for key, row in zip(_keys(rows), rows.to_pylist(qid=False)):
                if key not in final:
                    yield _row_event(key[0], row, True if marked else None)
    finally:  # a failed row, or a stream closed early: the other rows' answers are not wanted
        for task in tasks:
            task.cancel()
    yield orjson.dumps({"end": True, "rows": answered, "trace": trace_entries(trace)})


def _keys(rows: Table, start: int = 0) -> list[tuple[int, int]]:
    """(qid, n) per row: its qid, and its place among that qid's rows: ``start`` plus how
    many rows of that qid come before it in ``rows``."""
    seen: dict[int, int] = {}
    out = []
    for q in rows.qid.tolist():
        n = seen.get(q, start)
        seen[q] = n + 1
        out.append((q, n))
    return out


def _check_encodable(out: Table, plan: Plan) -> None:
    """RequestFailed, as the whole JSON answer's (invoke.py), when a float tensor of ``out``
    holds NaN or infinity: JSON has no form for them (orjson would write null)."""
    for name, ctype in out.schema.items():
        if ctype.kind == "tensor" and ctype.dtype.kind in "fc":
            values = out[name]
            if values.dtype == object:  # missing rows are None
                values = [v for v in values if v is not None]
                values = np.stack(values) if values else np.zeros(0)
            if values.size and not np.isfinite(values).all():
                op = plan.stages[plan.sink].nodes[-1].name
                why = (
                    f"tensor column {name!r} holds NaN or infinity, which JSON cannot carry; "
                    f"ask for Arrow (Accept: {ARROW})"
                )
                raise RequestFailed.of(
                    OperatorOutputError(f"operator {op!r} returned an answer JSON cannot carry: {why}", operator=op)
                )


def _row_event(qid: int, row: dict, final: bool | None) -> bytes:
    event = {"qid": qid, "row": row} if final is None else {"qid": qid, "row": row, "final": final}
    return orjson.dumps(event, default=_json_default, option=_NUMPY)


def _error_event(e: RequestFailed) -> bytes:
    return encode_error({**e.body, "status": e.status})


class EventStream:
    """A streamed answer: its first event (awaited before the status is sent) and the async
    iterator of the rest, each written as it comes; sent without a length (chunked)."""

    def __init__(self, media: str, first: bytes, rest: AsyncIterator[bytes], t0: float, finished) -> None:
        self.sse = media == SSE
        self.first, self.rest, self.t0, self.finished = first, rest, t0, finished

    def _frame(self, event: bytes) -> bytes:
        return b"data: " + event + b"\n\n" if self.sse else event + b"\n"

    async def send(self, send, status: int, extra: list) -> None:
        await send({"type": "http.response.start", "status": status, "headers": extra})
        ms = float("inf")
        try:
            event: bytes | None = self.first
            while event is not None:
                # the server applies flow control: each send waits until the client takes it
                await send({"type": "http.response.body", "body": self._frame(event), "more_body": True})
                try:
                    event = await self.rest.__anext__()
                except StopAsyncIteration:
                    event = None
                    ms = (time.perf_counter() - self.t0) * 1000
                except RequestFailed as e:
                    await send({"type": "http.response.body", "body": self._frame(_error_event(e)), "more_body": True})
                    event = None
            await send({"type": "http.response.body", "body": b""})
        finally:
            await self.rest.aclose()
            self.finished(ms)
