"""The data plane: ``POST /flows/{name}``, from the body to the answer.

The body is read (under the size limit; a big Arrow body straight into shared memory),
parsed and checked against the flow's input schema (executors/codec), given query ids and a
deadline, and submitted to the dispatcher; the answer is encoded as JSON or Arrow (a big one
is written as it is encoded, on a worker thread). A one-row body (JSON, or Arrow) for a flow
whose rows go to one stage is relayed to that stage's executor unparsed
(docs/architecture.md, "Relayed bodies"). A client may shorten its deadline with
``X-Request-Timeout: <seconds>``. Answers carry ``X-Qid-Start`` (row i of the request was
given qid ``X-Qid-Start + i``), ``X-Flowserve-Trace`` (JSON: ``[stage, executor, ms, batch
size]`` per stage run) and ``Server-Timing``. Every answer, of every route, carries
``X-Request-Id``: the client's (``request_id`` says which it keeps) or a new one; it travels
with the request to the executors, whose log lines about it name it, as the gateway's do.

``InvokeFastPath`` answers invocations as a bare ASGI app in front of Starlette (every
other route goes through Starlette); the server's lean path (leanhttp.py) calls its
``answer`` directly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import secrets
import time

import orjson

from executors import tracing
from executors.codec import jsontensors
from executors.codec.bodies import (
    ARROW,
    ARROW_MAX_INFLATED,
    OFF_LOOP_BYTES,
    OFF_LOOP_ROWS,
    TABLE_BYTES_PER_BODY_BYTE,
    WRITE_SLICE,
    BadRequestError,
    arrow_answer,
    arrow_pieces,
    input_table,
    is_json,
    json_pieces,
    json_rows,
    one_row_bytes,
    parse_body,
)
from executors.errors import JSON_CONTENT_TYPE, encode_error, http_error, http_error_for
from executors.gateway import streaming
from executors.gateway.dispatcher import CLIENT_CLOSED
from executors.gateway.records import DeployedFlow, RawBody, RequestFailed
from executors.wire import shm
from executors.wire.messages import Rendered
from flow.errors import DataError, OperatorOutputError
from flow.table import Table
from flow.types import ColumnType
from flow.validation import check_schema

log = logging.getLogger("flowserve.gateway")
access = logging.getLogger("flowserve.access")  # a line per answer, with FLOWSERVE_ACCESS_LOG=1

ACCESS_LOG_ENV = "FLOWSERVE_ACCESS_LOG"
REQUEST_ID_MAX = 128  # characters: a longer X-Request-Id from a client is replaced by a new one


def request_id(given: str | None) -> str:
    """The request id an answer carries: the client's ``X-Request-Id`` when it is 1 to
    REQUEST_ID_MAX visible ASCII characters (no spaces or control characters: it is one
    word in log lines, and a header value), else a new random one (16 hex digits: from a
    generator seeded by the system once, not a ``getrandom`` call a request; an id names a
    request, it guards nothing)."""
    if given and len(given) <= REQUEST_ID_MAX and given.isascii() and given.isprintable() and " " not in given:
        return given
    return f"{_IDS.getrandbits(64):016x}"


_IDS = random.Random(secrets.randbits(128))


class Invocations:
    """``POST /flows/{name}`` for a gateway: its settings are read once here, its state
    (``accepting``, the token) on the gateway at each request."""

    def __init__(self, gateway):
        self.g = gateway
        self.dispatcher = gateway.dispatcher
        self.metrics = gateway.metrics
        self.slo = gateway.slo
        self.output_schemas = gateway.output_schemas  # shared with the status routes (OpenAPI)
        self.max_body_bytes = gateway.max_body_bytes
        # a relayed row is parsed by an executor under the default limits (parse_body): relay
        # only rows whose columns fit both those and this gateway's, so both paths accept them
        self.relay_row_limit = TABLE_BYTES_PER_BODY_BYTE * min(self.max_body_bytes, ARROW_MAX_INFLATED)
        self.max_rows = gateway.max_rows
        self.request_timeout_s = gateway.request_timeout_s
        self.max_request_timeout_s = gateway.max_request_timeout_s
        self.access_log = os.environ.get(ACCESS_LOG_ENV) == "1"

    async def invoke(
        self, name: str, headers: dict[str, str], receive, rid: str | None = None, hangup: Hangup | None = None
    ) -> tuple[int, bytes, list]:
        """POST /flows/{name}: (status, body, extra headers). ``headers`` has lower-case
        names; ``receive`` is the ASGI receive callable the body comes from; ``rid`` the
        request id (default: ``request_id`` of the client's X-Request-Id); ``hangup`` says
        when the client disconnects (the request is then given up: ``Hangup``).

        Every answer is counted once, here: ``requests_total`` by status, and errors (status
        >= 400) in ``errors_total`` too; names that are not deployed flows count as "-" (a
        client must not be able to grow the metrics with made-up names).

        With tracing on (executors/tracing.py), a request to a deployed flow has a span here,
        continuing the client's ``traceparent``; its answer names the trace (``traceparent``,
        ``X-Trace-Id``), and so does its log line."""
        t0 = time.perf_counter()
        rid = rid or request_id(headers.get("x-request-id"))
        span = None
        if tracing.tracer is not None and name in self.dispatcher.flows:
            span = tracing.request_span(name, headers, rid)
        try:
            status, body, extra = await self._invoke(name, headers, receive, rid, span, hangup)
        except BaseException:  # InvokeFastPath answers it 500
            if span is not None:
                tracing.end_request(span, 500)
            raise
        if span is not None:
            extra = [*extra, *tracing.end_request(span, status)]
        # counted once the answer is written (the caller writes it in this same step of the
        # event loop, before any callback runs): counting is no part of the client's latency
        label = name if name in self.dispatcher.flows else "-"
        error = body if status >= 400 else None  # an answer's body is not kept past its write
        tp = "" if span is None else tracing.traceparent(span)
        self.dispatcher.loop().call_soon(self._count, label, status, rid, t0, error, tp)
        return status, body, [*extra, (b"x-request-id", rid.encode("ascii"))]

    def _count(self, label: str, status: int, rid: str, t0: float, error, tp: str = "") -> None:
        code = str(status)
        self.metrics.child(self.metrics.requests, label, code).inc()
        if status >= 400:
            self.metrics.child(self.metrics.errors, label, code).inc()
        # the gateway's line about a request: every answer with the access log on, else the
        # flow's failures (5xx); an operator's traceback is in the log of the executor it ran on
        if self.access_log or status >= 500:
            (access if self.access_log else log).info(
                "flow %s request %s%s: %d%s in %.1f ms",
                label,
                rid,
                tracing.log_tag(tp),
                status,
                "" if error is None else _error_name(error),
                (time.perf_counter() - t0) * 1000,
            )

    async def _invoke(
        self, name: str, headers: dict[str, str], receive, rid: str, span=None, hangup: Hangup | None = None
    ) -> tuple[int, bytes, list]:
        tp = "" if span is None else tracing.traceparent(span)  # its runs' spans continue the request's
        if self.g.token:
            refused = self.g.refusal("/flows/", headers.get("authorization", ""))
            if refused is not None:
                return _error_body(refused)
        flow = self.dispatcher.flows.get(name)
        if flow is None:
            return _error_body(http_error("UnknownFlow", f"no deployed flow named {name!r}; GET /flows lists them"))
        if not self.g.accepting:
            status, body, extra = _error_body(
                http_error(
                    "ShuttingDown", "the gateway is shutting down; retry (another gateway, or this one once restarted)"
                )
            )
            return status, body, [*extra, (b"retry-after", b"1")]
        flow, shadow = self.g.rollouts.route(name, flow)  # a canary's share, a shadow's mirror (rollouts.py)
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return _error_body(
                http_error("PayloadTooLarge", f"body of {declared} bytes is over the limit of {self.max_body_bytes}")
            )
        body = await _read_body(receive, self.max_body_bytes, _shared_size(headers, declared))
        if body is None:
            return _error_body(http_error("PayloadTooLarge", f"body is over the limit of {self.max_body_bytes} bytes"))
        t0 = time.perf_counter()
        raw = table = None
        stream = streaming.media_type(headers.get("accept", ""))
        if (
            stream is None
            and _relayable(body, headers, lambda: self.dispatcher.relay_idle(flow), bool(flow.plan.input_schema))
            and flow.row_bytes <= self.relay_row_limit
            and self.dispatcher.relays_to(flow) is not None
            and (shadow is None or self.dispatcher.relays_to(shadow) is not None)
        ):
            # one row (JSON or Arrow) for a flow whose rows go to one stage: its executor parses
            # and checks it (the same code, the same errors), the sink's answers in JSON; this
            # process only relays
            qid_start = self.dispatcher.new_qid()
            raw = RawBody(body, headers.get("content-type", ""), qid_start)
        else:
            qid_start, table, error = await self._parse(name, flow, body, headers)
            if error is not None:
                return _error_body(error)
        body = None  # the rows hold what is needed; the body's memory can go now
        timeout = flow.plan.timeout_s or self.request_timeout_s  # the flow's deadline, else the cluster's
        asked = headers.get("x-request-timeout")
        if asked is not None:
            seconds = _seconds(asked)
            if seconds is None:
                return _error_body(
                    http_error_for(
                        BadRequestError(f"header X-Request-Timeout must be a number of seconds > 0, got {asked!r}")
                    )
                )
            # a client may ask for less or more time than the flow's deadline, up to the cluster's maximum
            timeout = min(seconds, self.max_request_timeout_s)
        self.slo.arrived(name, flow.plan)
        if stream is not None:  # rows as they complete (streaming.py)
            return await self._stream(name, flow, shadow, table, timeout, rid, tp, qid_start, stream, hangup)
        try:
            trace: list = []
            result = await self.g.rollouts.submit(
                flow, shadow, name, table, timeout, trace, raw, rid, tp, hangup=hangup
            )
            table = raw = None  # answered: the request's rows can go before the answer is encoded
            if span is not None:
                _races_won(span, trace)
        except RequestFailed as e:
            # an error never meets the SLO; but a relayed body that did not parse was not
            # served, and a client that left before its answer (499) had no answer to time
            if not (raw is not None and e.status == 400) and e.status != CLIENT_CLOSED:
                self.slo.answered(name, flow.plan, float("inf"))
            return e.status, encode_error(e.body), [JSON_CONTENT_TYPE]
        ms = (time.perf_counter() - t0) * 1000
        self.dispatcher.loop().call_soon(self._timed, name, flow.plan, ms)  # after the write, as _count
        if isinstance(result, Rendered):  # a relayed body's answer: the client's JSON already
            if self.output_schemas.get(name, (None,))[0] != flow.version and result.rows:
                schema = {c: ColumnType.from_json(t) for c, t in result.schema.items()}
                self.output_schemas[name] = (flow.version, schema)
            return 200, result.body, [JSON_CONTENT_TYPE, *self._answer_headers(ms, qid_start, trace)]
        if self.output_schemas.get(name, (None,))[0] != flow.version and len(result):
            self.output_schemas[name] = (flow.version, dict(result.schema))
        extra = self._answer_headers(ms, qid_start, trace)
        arrow = ARROW in headers.get("accept", "")
        ctype = (b"content-type", ARROW.encode()) if arrow else JSON_CONTENT_TYPE
        try:
            if len(result) <= OFF_LOOP_ROWS:
                body = arrow_answer(result) if arrow else json_rows(result)
            else:  # a big answer is written on a worker thread and sent as it is written
                pieces = arrow_pieces(result) if arrow else json_pieces(result)
                body = Streamed(await asyncio.to_thread(next, pieces), pieces)
        except (TypeError, ValueError) as e:  # orjson's errors are TypeErrors; UnencodableError
            op = flow.plan.stages[flow.plan.sink].nodes[-1].name
            return _error_body(
                http_error_for(
                    OperatorOutputError(f"operator {op!r} returned an answer JSON cannot carry: {e}", operator=op)
                )
            )
        return 200, body, [ctype, *extra]

    async def _stream(self, name, flow, shadow, table, timeout, rid, tp, qid_start, media, hangup=None):
        """A streamed answer (streaming.py): its rows run through the same submit as a whole
        answer's (a client that disconnects gives up each: ``hangup``); its latency is
        counted once the end event is written."""

        def submit(rows, trace, on_partial):
            return self.g.rollouts.submit(
                flow, shadow, name, rows, timeout, trace, None, rid, tp, on_partial=on_partial, hangup=hangup
            )

        def finished(ms):
            if ms == float("inf"):
                self.slo.answered(name, flow.plan, ms)
            else:
                self._timed(name, flow.plan, ms)

        status, body, extra = await streaming.answer(submit, flow.plan, table, media, _trace_entries, finished)
        if status == 200:
            extra = [*extra, (b"x-qid-start", str(qid_start).encode())]
        return status, body, extra

    def _timed(self, name: str, plan, ms: float) -> None:
        self.metrics.latency.observe((name,), ms)
        self.slo.answered(name, plan, ms)

    async def _parse(self, name: str, flow: DeployedFlow, body, headers: dict):
        """(qid_start, the input Table, None) for a request body; (None, None, (status, error
        body)) if it is bad."""
        schema = flow.plan.input_schema
        # a big body is parsed and converted on a worker thread: the event loop keeps
        # serving other requests meanwhile (the interpreter switches threads every 5 ms)
        big = len(body) > OFF_LOOP_BYTES
        # an Arrow body in a shared segment (_read_body) parses without a copy, in tens of us: on a thread
        # only if it has many rows to convert (two thread hops cost more than a 10 MB row's parse)
        inline = big and isinstance(body, memoryview)
        try:
            ctype = headers.get("content-type", "")
            if len(body) > jsontensors.MIN_BYTES and not inline and is_json(ctype) and jsontensors.eligible(schema):
                # JSON rows of numbers (images as nested lists, tabular batches): read outside the GIL
                got = await asyncio.to_thread(jsontensors.read_rows, body, schema)
                if got is not None and got[0] <= self.max_rows:  # else the general path says what is wrong
                    n, cols = got
                    qid_start = self.dispatcher.next_qid
                    table = Table.built(cols, self.dispatcher.new_qids(n))
                    return qid_start, check_schema(name, schema, table), None
            # a compressed Arrow body may not inflate past the body limit (bodies.arrow_table)
            rows = (
                await asyncio.to_thread(parse_body, body, ctype, schema, self.max_body_bytes)
                if big and not inline
                else parse_body(body, ctype, schema, self.max_body_bytes)
            )
            big = big and not (inline and len(rows) <= OFF_LOOP_ROWS)
            body = None  # the rows hold what is needed; the body's memory can go now
            if len(rows) > self.max_rows:
                why = f"the request has {len(rows)} rows, over the limit of {self.max_rows} (max_rows)"
                return None, None, http_error("TooManyRows", why)
            qid_start = self.dispatcher.next_qid
            qids = self.dispatcher.new_qids(len(rows))
            table = (
                await asyncio.to_thread(input_table, name, rows, qids, schema)
                if big
                else input_table(name, rows, qids, schema)
            )
        except (BadRequestError, DataError) as e:
            return None, None, http_error_for(e)
        return qid_start, table, None

    @staticmethod
    def _answer_headers(ms: float, qid_start: int, trace: list) -> list:
        return [
            (b"server-timing", f"flow;dur={ms:.3f}".encode()),
            # row i of the request was query qid_start + i: clients can match answers to rows
            (b"x-qid-start", str(qid_start).encode()),
            # where each stage ran, for how long, in a batch of how many requests
            (b"x-flowserve-trace", _trace_header(trace)),
        ]


def _shared_size(headers: dict, declared: str | None) -> int | None:
    """The size to read an Arrow body of into shared memory (shm.py), or None: its tensor
    columns then go to the executors as references to the body's own bytes, no copy."""
    if declared is None or not declared.isdigit() or int(declared) < shm.SHM_MIN_BYTES:
        return None
    return int(declared) if headers.get("content-type", "").startswith(ARROW) else None


async def _read_body(receive, limit: int, shared: int | None = None) -> bytes | bytearray | memoryview | None:
    """The request body, or None once it grows over ``limit`` bytes. A body in one piece
    (most) is returned as it came; pieces are gathered into one growing buffer, so a big
    body never exists twice (a list of pieces joined at the end would need twice its size).
    ``shared``: the declared size of a body to gather into a shared-memory segment."""
    first: bytes | None = None
    buf: bytearray | None = None
    size = 0
    segment = shm.SegmentWriter(shared) if shared and shared <= limit else None
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        if segment is not None and size + len(chunk) <= shared:
            segment.write(chunk)
            size += len(chunk)
            if not message.get("more_body", False):
                return segment.mapped()
            continue
        if segment is not None:  # more than declared (uvicorn refuses that): as any body
            first, segment = segment.mapped().tobytes(), None
        size += len(chunk)
        if size > limit:
            return None
        if first is None:
            first = chunk
        else:
            if buf is None:
                buf = bytearray(first)
            buf += chunk
        if not message.get("more_body", False):
            break
    return buf if buf is not None else (first if first is not None else b"")


# Relayed bodies are parsed on the executor's IO thread, between its reads of other
# messages: only small ones (a 28x28 image as JSON is about 3 KiB; 64 KiB parses in about a
# millisecond: a 112x112 tensor, 62 KB, took 1.3 ms here)
RELAY_MAX_BYTES = 64 * 1024


#: the data of a one-row Arrow body always relayed: scalars and short strings. A heavier row
#: (an image as lists of lists: its values become a tensor, tens of us) is relayed only while
#: the executor it goes to has nothing in flight (``Dispatcher.relay_idle``)
LIGHT_ROW_BYTES = 512
#: the same for a one-row JSON body of an untyped flow, by its length: a few scalars always;
#: an image (~3 KiB for 28x28) only to an idle executor. A typed flow's row is always
#: relayed: its executor reads it the short way (bodies.one_row_table, the tensor reader)
LIGHT_JSON_BYTES = 1024


def _relayable(body, headers: dict, executor_idle, typed: bool = False) -> bool:
    """A body the flow's first stage may parse itself (RawInput): one row, as one JSON
    object or as an Arrow stream of one uncompressed row (``one_row_bytes``: its row count
    and size read from the stream's metadata), small (RELAY_MAX_BYTES), for a client that
    takes a JSON answer. Anything else is parsed here (lists of rows, Arrow streams of
    other row counts or with compressed buffers, big bodies, answers in Arrow).

    A heavy row (an Arrow row over LIGHT_ROW_BYTES of data; a JSON body over
    LIGHT_JSON_BYTES for a flow that is not ``typed``) is relayed only when
    ``executor_idle()``: an idle executor parses it at no cost to anyone, and the request
    skips the gateway's Table and its round trip (p50 at c=1 x0.89 on the matrix's Arrow
    image cells); a busy one is the bottleneck, so the gateway spares it the parse.
    Measured at c=8 against the floor (benchmarks/README.md, "The benchmark family against
    its floor"): relaying every Arrow image row cost 5-12% throughput; reading an untyped
    JSON image here for a busy executor took the 1-stage Ensemble and Cascade from
    0.59-0.91x to 0.98-1.20x, while the typed ones did better relayed (1.39-1.58x, against
    1.18-1.41x read here)."""
    if not isinstance(body, (bytes, bytearray)) or not 0 < len(body) <= RELAY_MAX_BYTES:
        return False
    if ARROW in headers.get("accept", ""):
        return False
    ctype = headers.get("content-type", "")
    if is_json(ctype):
        if not (body[:1] == b"{" or body.lstrip()[:1] == b"{"):
            return False
        return typed or len(body) <= LIGHT_JSON_BYTES or executor_idle()
    if not ctype.startswith(ARROW):
        return False
    data = one_row_bytes(body)
    return data is not None and (data <= LIGHT_ROW_BYTES or executor_idle())


def _seconds(text: str) -> float | None:
    """A positive, finite number of seconds, or None ("nan", "-1", "0", "abc")."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


def _trace_header(trace: list) -> bytes:
    """The X-Flowserve-Trace value: JSON, ASCII only (a header is Latin-1; a stage named in
    other letters is escaped, as the json module does)."""
    entries = _trace_entries(trace)
    value = orjson.dumps(entries)
    return value if value.isascii() else json.dumps(entries, separators=(",", ":")).encode()


def _trace_entries(trace: list) -> list:
    """The trace as the X-Flowserve-Trace header and a stream's end event list it."""
    return _unique(e[:4] for e in trace)


def _unique(entries) -> list:
    """Trace entries once each, in order (a stage's entry reaches the sink along every
    path through a join or a key split)."""
    seen, out = set(), []
    for e in entries:
        key = tuple(e)
        if key not in seen:
            seen.add(key)
            out.append(list(e))
    return out


def _error_name(body) -> str:
    """What an error answer's JSON body names, for its log line: `` OperatorFailedError
    (operator 'scale', qid 1)``, or what of it there is."""
    try:
        answer = orjson.loads(body)
        words = f" {answer['error']}"
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return ""
    where = [
        f"{k} {answer[k]!r}" if k == "operator" else f"{k} {answer[k]}" for k in ("operator", "qid") if k in answer
    ]
    return f"{words} ({', '.join(where)})" if where else words


def _races_won(span, trace: list) -> None:
    """Mark on a traced request's span which copy won each race it ran: the copy whose
    output the answer holds (its trace entry names its span, outputs.py), which only the
    consumer that took it first can know (each copy's executor sees its own race)."""
    seen = set()  # an entry reaches the sink along every path through a join or a key split
    for entry in trace:
        extra = entry[4] if len(entry) > 4 and isinstance(entry[4], dict) else None
        if extra is not None and "span" in extra and extra["span"] not in seen:
            seen.add(extra["span"])
            span.add_event(
                "race won",
                {
                    "flowserve.stage": str(entry[0]),
                    "flowserve.executor": str(entry[1]),
                    "flowserve.race.copy": int(extra.get("copy", 0)),
                    "flowserve.race.span": str(extra["span"]),
                },
            )


def _error_body(answer: tuple[int, bytes]) -> tuple[int, bytes, list]:
    """The same error answer on the invoke path: bytes and headers, no Starlette objects."""
    status, body = answer
    return status, body, [JSON_CONTENT_TYPE]


class InvokeFastPath:
    """``POST /flows/{name}`` answered as a bare ASGI app in front of Starlette.

    Invocations are the gateway's hot path; Starlette's middleware, routing and Request/
    Response objects cost about as much per call as everything else the gateway does for
    a small request. Every other route goes through Starlette."""

    def __init__(self, gateway, app):
        self.gateway = gateway
        self.invocations = gateway.invocations
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not path.startswith("/flows/")
            or "/" in path[7:]
            or len(path) == 7
        ):
            if scope["type"] == "http":
                given = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), None)
                send = _with_header(send, (b"x-request-id", request_id(given).encode("ascii")))
                authorization = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), "")
                refused = self.gateway.refusal(path, authorization)
                if refused is not None:
                    return await _send(send, *_error_body(refused))
            return await self.app(scope, receive, send)
        hangup = Hangup()
        watched = _WatchedReceive(receive, hangup)  # ASGI: a disconnect is a message to receive
        try:
            answer = await self.answer(path[7:], scope["headers"], watched, hangup)
        finally:
            watched.stop()
        await _send(send, *answer)

    async def answer(self, name: str, raw_headers, receive, hangup: Hangup | None = None) -> tuple[int, bytes, list]:
        """Flow ``name``'s answer to a request: (status, body, extra headers). ``raw_headers``
        as the server parsed them (lower-case names, bytes); ``hangup``: told by the server
        when the client disconnects. The server's lean path (leanhttp.py) calls this
        directly, and ``send`` for an answer that is not one piece."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers}
        rid = request_id(headers.get("x-request-id"))
        try:
            return await self.invocations.invoke(name, headers, receive, rid, hangup)
        except Exception as exc:  # last resort: never a traceback to a client
            log.exception("unhandled error on /flows/%s (request %s)", name, rid)
            status, body, extra = _error_body(http_error("InternalError", f"{type(exc).__name__}: {exc}"))
            return status, body, [*extra, (b"x-request-id", rid.encode("ascii"))]

    @staticmethod
    async def send(send, status: int, body, extra: list) -> None:
        await _send(send, status, body, extra)


class Hangup:
    """A request's link to its client. The server calls ``hang_up`` when the client
    disconnects before its answer; the dispatcher ``bind``s what gives the request up then
    (Dispatcher.give_up: answered 499, which nobody reads, and its work on the executors
    cancelled): one request, or each row's of a streamed answer (streaming.py). A request
    bound once the client is gone is given up at once."""

    __slots__ = ("_bound", "gone")

    def __init__(self):
        self._bound: dict = {}  # id(request) -> (give_up, request), while it runs
        self.gone = False

    def bind(self, give_up, req) -> None:
        if self.gone:
            give_up(req)
        else:
            self._bound[id(req)] = (give_up, req)

    def unbind(self, req) -> None:
        """The request is answered: let go of it. The server keeps a connection's last
        cycle (and so this) until the next request, and a request holds its rows (shared
        memory segments among them): an idle keep-alive connection must hold none."""
        self._bound.pop(id(req), None)

    def hang_up(self) -> None:
        if self.gone:
            return
        self.gone = True
        bound, self._bound = self._bound, {}
        for give_up, req in bound.values():
            give_up(req)


class _WatchedReceive:
    """An ASGI ``receive`` that, once the whole body has been read, watches for the
    client's disconnect (the next message an ASGI server gives is ``http.disconnect``) and
    tells ``hangup``. ``stop`` ends the watch before the answer is sent: servers also give
    ``http.disconnect`` once an answer is complete."""

    __slots__ = ("_receive", "_hangup", "_task")

    def __init__(self, receive, hangup: Hangup):
        self._receive, self._hangup, self._task = receive, hangup, None

    async def __call__(self):
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self._hangup.hang_up()
        elif not message.get("more_body", False) and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())
        return message

    async def _watch(self) -> None:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self._hangup.hang_up()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _with_header(send, header: tuple[bytes, bytes]):
    """``send`` adding ``header`` to the answer's head (the routes Starlette answers)."""

    async def sending(message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), header]}
        await send(message)

    return sending


class Streamed:
    """An answer sent as it is written: its first piece (written before the status is
    sent, so an answer that cannot be encoded is still a clean 500) and the iterator of the
    rest, each written on a worker thread. Sent without a length (chunked)."""

    def __init__(self, first: bytes, rest):
        self.first, self.rest = first, rest


async def _send(send, status: int, body: bytes | list | Streamed, extra: list) -> None:
    if type(body) is streaming.EventStream:
        await body.send(send, status, extra)
        return
    if isinstance(body, Streamed):
        await send({"type": "http.response.start", "status": status, "headers": extra})
        piece = body.first
        while piece is not None:
            # the server applies flow control: each send waits until the client takes it
            await _body(send, [piece], more=True)
            piece = await asyncio.to_thread(next, body.rest, None)
        await send({"type": "http.response.body", "body": b""})
        return
    # pieces of one answer (arrow_answer: views of its big buffers, not joined), or one big body
    pieces = body if isinstance(body, list) else [body]
    length = sum(memoryview(piece).nbytes for piece in pieces)
    head = [(b"content-length", str(length).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await _body(send, pieces, more=False)


async def _body(send, pieces: list, more: bool) -> None:
    """Send ``pieces`` as the body's next messages (the last one ending the body unless
    ``more``), none longer than WRITE_SLICE, the event loop running others between slices."""
    last = len(pieces) - 1
    for i, piece in enumerate(pieces):
        view = memoryview(piece)
        n = view.nbytes
        if n <= WRITE_SLICE:
            await send({"type": "http.response.body", "body": piece, "more_body": more or i < last})
            continue
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        for at in range(0, n, WRITE_SLICE):
            end = min(at + WRITE_SLICE, n)
            await send({"type": "http.response.body", "body": view[at:end], "more_body": more or i < last or end < n})
            if end < n:
                await asyncio.sleep(0)  # a ready callback (another request's) runs before the next slice
