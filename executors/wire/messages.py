"""Everything the gateway and the executors say to each other, as typed classes (values:
never changed once built).

This module is the only place that knows how a message looks on the wire; the dispatcher
(gateway side), the executor and its watchdog build and read these classes only.

The wire format
---------------
A message is a list of frames. transport.py puts it on a stream as ``u32 frame count,
u64 length per frame, the frames`` (bounded: at most 4096 frames and 2 GiB). wire.py
fills the frames: frame 0 is a JSON object, the *header* (never pickle: frames may come
from the network); the frames after it are the raw buffers of the Tables the message
carries, described in the header under ``tables`` (name -> column metadata pointing at
buffer frames; see wire.py). Every message here carries at most one Table, under ``t``,
or, instead of a table, one *blob*: bytes as they are, frame 1 (a body and its answer).

The header's ``type`` says which message it is; the other keys are short because they
travel with every request on every hop. Keys, by message (-> who sends it):

    ping      gateway -> executor   reply (address for the pong), token
    pong      executor -> gateway   executor, token, device ("cpu"/"gpu"), gpus (stats),
                                    relays (takes bodies; omitted: false, as an executor that predates relaying says),
                                    stats (what it counts for the gateway's /metrics: queues, batches,
                                    its KVS cache; executors/worker/executor.py ``stats``; omitted: none)
    load      gateway -> executor   flow, version, stages (names; null: all), reply, token
    loaded    executor -> gateway   executor, flow, version, token, error (null: built)
    unload    gateway -> executor   flow, version
    run       gateway/executor -> executor: one input of one stage for one request attempt
              req (request id, per gateway), att (attempt), flow, ver (flow version),
              stage (the stage to run), from (the producing stage, or "__input__"),
              routes (stage -> addresses that run it for this request), gw (the gateway's
              address), dl (the request's deadline, wall clock in Unix seconds: the machines
              of one cluster are taken to keep their clocks in step, NTP), trace ([stage, executor,
              ms, batch] of the stages run so far), path (where a key-split part sits:
              [[index, count], ...]), copy (which racing copy; omitted: 0), solo (a retry
              that must run unbatched; omitted: false), rj (render the sink's answer
              as JSON: set by the executor that parsed a relayed body, and sent on with the
              request's runs to the sink; omitted: false), rid (the
              X-Request-Id its answer carries, which the executors' log lines about it
              name; omitted: none), tp (the W3C traceparent of the gateway's span of the
              request, when tracing is on: executors/tracing.py; omitted: none), st (a
              streamed request: a sink stage's generator map sends its outputs to the gateway
              as it yields them, as partials; omitted: false); table t.
              A run without a table says the producing alternative gave no valid result
              (first_valid stages).
    body      gateway -> executor   a request's body as the client sent it, for the flow's one
              stage that takes the input (records.relay_stage): req, att, flow, ver, stage, routes, gw, qid (the row's query id), ct
              (Content-Type; omitted: JSON), dl, solo, rid, tp; the body is frame 1, not a table.
              The executor parses and checks it as the gateway would (codec/bodies.py).
    cancel    executor -> executor  gw, req, att, stage: a racing stage's copy of this request
              attempt finished first; drop the other copies still queued or yet to come
    revoke    gateway -> executor   gw, reqs (request ids): the gateway gave up on these
              requests (the client disconnected, or the deadline passed): drop their queued
              and later inputs, stop runs that serve only them, send nothing on for them
    result    executor -> gateway   req, att, path, trace; table t (the sink's output)
    partial   executor -> gateway   req, att, final (one bool per row); table t: a first_then's
                                    fast rows, sent by the sink before its slow rows are done;
                                    or a streamed request's generator outputs as they are
                                    yielded (all final), at (where t's rows begin among their
                                    qid's rows of the answer; omitted: 0)
    answer    executor -> gateway   req, att, trace, n (rows), schema (column -> type): a
                                    body's answer as the client gets it, JSON in frame 1
    error     executor -> gateway   req, att, status (HTTP), error (exception class name),
                                    message, operator and qid (omitted when unknown)
    stuck     executor -> gateway   executor, flow, stage, operator, since (Unix seconds)
    unstuck   executor -> gateway   executor, flow, stage, operator
    recycling executor -> gateway   executor, flow, operator, reason

``decode`` checks the type and every field's JSON type, and raises WireError naming the
message type and the field for anything else; it does not look inside nested values
(routes, trace) beyond their outer type.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import orjson

from executors.wire.frames import WireError, decode_table, pack, unpack, unpack_header
from flow.table import Table
from optimizer.stage import INPUT

_NONE = type(None)
_REQUIRED: Any = object()  # a field's default when the message must carry it
_TABLE = "t"
_EMPTY = ()  # the default of list fields (trace, path): the same object, so ``is`` finds it

# JSON types a field may hold, by what the field means
_INT = (int,)
_NUMBER = (float, int)
_STR = (str,)
_LIST = (list,)
_DICT = (dict,)
_TYPE_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
    bool: "a boolean",
    _NONE: "null",
}


class Message:
    """Base of every message: ``encode()`` gives its frames, ``decode(frames)`` the message.

    Subclasses are declared with ``@message(TYPE)``: slotted dataclasses whose fields say
    their wire form once, ``name: type = wire(JSON types, key=..., default=...)`` (a field
    equal to its default is left off the wire), and ``carried()`` for the Table a message
    carries. The decorator derives ``_FIELDS`` (attribute, wire key, JSON types, default)
    and ``_TABLE_FIELD`` (attribute, required) from them."""

    __slots__ = ()
    TYPE: ClassVar[str]
    _FIELDS: ClassVar[tuple]
    _TABLE_FIELD: ClassVar[tuple | None] = None  # (attribute, required)
    _BLOB_FIELD: ClassVar[str | None] = None  # the attribute holding the bytes of frame 1

    def header(self) -> dict:
        """The JSON header of this message (without its table)."""
        h = {"type": self.TYPE}
        for attr, key, _types, default in self._FIELDS:
            value = getattr(self, attr)
            if value is not default or default is _REQUIRED:
                h[key] = value
        return h

    def tables(self) -> dict[str, Table] | None:
        if self._TABLE_FIELD is None:
            return None
        table = getattr(self, self._TABLE_FIELD[0])
        return None if table is None else {_TABLE: table}

    def encode(self) -> list:
        """The frames of this message (header, then its table's buffers or its blob)."""
        if self._BLOB_FIELD is not None:
            return [orjson.dumps(self.header()), getattr(self, self._BLOB_FIELD)]
        return pack(self.header(), self.tables())

    @classmethod
    def from_header(cls, header: dict, tables: dict[str, Table], blob=None) -> Message:
        args = []
        for _attr, key, types, default in cls._FIELDS:
            value = header.get(key, default)
            if value.__class__ not in types and (value is not default or value is _REQUIRED):
                raise _field_error(cls.TYPE, key, value, types)
            args.append(value)
        if cls._TABLE_FIELD is not None:
            table = tables.get(_TABLE)
            if table is None and cls._TABLE_FIELD[1]:
                raise WireError(f"{cls.TYPE!r} message: its table {_TABLE!r} is missing")
            args.append(table)
        if cls._BLOB_FIELD is not None:
            if blob is None:
                raise WireError(f"{cls.TYPE!r} message: its body (frame 1) is missing")
            args.append(blob)
        return cls(*args)


def wire(types: tuple, *, key: str | None = None, default: Any = _REQUIRED, absent: Any = _REQUIRED):
    """A message field: the JSON types it may hold, its key on the wire (default: its
    name) and its default (none: the message must carry it). ``absent``: for a field
    without a default, the value that a missing key stands for (and that is left off)."""
    meta = {"types": types, "key": key, "absent": default if default is not _REQUIRED else absent}
    return field(metadata=meta) if default is _REQUIRED else field(default=default, metadata=meta)


def carried(*, required: bool):
    """The field holding the Table a message carries (frames after the header)."""
    meta = {"table": required}
    return field(metadata=meta) if required else field(default=None, metadata=meta)


def blob():
    """The field holding the bytes a message carries as they are, in frame 1 (a message
    carries a table or a blob, never both; the blob is its last field, and a decoded
    message without frame 1 is a WireError whatever the default)."""
    return field(default=b"", metadata={"blob": True})


def message(kind: str):
    """Make a Message subclass a slotted dataclass of message type ``kind``, its wire
    description derived from its ``wire()`` and ``carried()`` fields.

    Not ``frozen``: a message is a value, built once and never changed (``dataclasses.replace``
    or ``StageInput.to`` make a changed copy), but Python 3.11 builds a frozen dataclass
    field by field through ``object.__setattr__``: 1.2 us for a run message's 18 fields
    against 0.12 us, and each request builds 3 to 8 messages in each process. Slots still
    refuse an attribute that is not a field."""

    def declare(cls):
        cls = dataclass(slots=True)(cls)
        cls.TYPE = kind
        cls._FIELDS = tuple(
            (f.name, f.metadata["key"] or f.name, f.metadata["types"], f.metadata["absent"])
            for f in fields(cls)
            if "types" in f.metadata
        )
        tables = [(f.name, f.metadata["table"]) for f in fields(cls) if "table" in f.metadata]
        cls._TABLE_FIELD = tables[0] if tables else None
        blobs = [f.name for f in fields(cls) if "blob" in f.metadata]
        cls._BLOB_FIELD = blobs[0] if blobs else None
        cls.header, cls.from_header = _compiled_codec(cls)
        return cls

    return declare


def _compiled_codec(cls) -> tuple:
    """``header`` and ``from_header`` for a message class: what ``Message.header`` and
    ``Message.from_header`` do in a loop over ``_FIELDS``, written out for this class's
    fields and compiled once (as ``dataclass`` writes its ``__init__``).

    Why: every hop of every request encodes one message and decodes another. For a run
    message (17 fields) the loop takes 1.2 us to read a header and 0.9 us to write one,
    the written-out form 0.66 and 0.31 us. A header that does not pass the written-out
    checks is handed to the loop, which raises naming the field (test_messages checks both
    agree, accepting and refusing, for every message type)."""
    ns: dict = {"_TABLE": _TABLE, "_checked": Message.from_header.__func__}
    put, get, ok, args = [], [], [], []
    for i, (attr, key, types, default) in enumerate(cls._FIELDS):
        ns[f"D{i}"], ns[f"T{i}"] = default, types[0] if len(types) == 1 else types
        if default is _REQUIRED:
            put.append(f"{key!r}: self.{attr}")
        get.append(f"v{i} = g({key!r}, D{i})")
        check = f"v{i}.__class__ is T{i}" if len(types) == 1 else f"v{i}.__class__ in T{i}"
        ok.append(check if default is _REQUIRED else f"({check} or v{i} is D{i})")
        args.append(f"v{i}")
    lines = ["def header(self):", f"    h = {{'type': {cls.TYPE!r}, {', '.join(put)}}}"]
    for i, (attr, key, _types, default) in enumerate(cls._FIELDS):
        if default is not _REQUIRED:
            lines += [f"    v = self.{attr}", f"    if v is not D{i}:", f"        h[{key!r}] = v"]
    lines.append("    return h")
    lines += ["def from_header(cls, h, tables, blob=None):", "    g = h.get"]
    lines += [f"    {line}" for line in get]
    last = ""
    if cls._TABLE_FIELD is not None:
        lines.append("    t = tables.get(_TABLE)")
        args.append("t")
        if cls._TABLE_FIELD[1]:
            last = " and t is not None"
    if cls._BLOB_FIELD is not None:
        args.append("blob")
        last = " and blob is not None"
    lines.append(f"    if {' and '.join(ok) or 'True'}{last}:")
    lines.append(f"        return cls({', '.join(args)})")
    lines.append("    return _checked(cls, h, tables, blob)  # raises naming what is wrong")
    exec("\n".join(lines), ns)
    header, from_header = ns["header"], ns["from_header"]
    for fn in (header, from_header):
        fn.__qualname__ = f"{cls.__name__}.{fn.__name__}"
    return header, classmethod(from_header)


def _field_error(kind: str, key: str, value, types: tuple) -> WireError:
    if value is _REQUIRED:
        return WireError(f"{kind!r} message: field {key!r} is missing")
    names = [_TYPE_NAMES.get(t, t.__name__) for t in types if not (t is int and float in types)]
    want = " or ".join(names)
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return WireError(f"{kind!r} message: field {key!r} must be {want}, got {shown}")


def _optional(types: tuple) -> tuple:
    return types + (_NONE,)


# -- membership and deploys ------------------------------------------------------------------


@message("ping")
class Ping(Message):
    """Gateway -> executor: are you there? Answered by a Pong to ``reply``."""

    reply: str = wire(_STR)
    token: str = wire(_STR)


@message("pong")
class Pong(Message):
    """Executor -> gateway: alive; its device class and (on a GPU executor) GPU stats;
    whether it takes relayed bodies (``RawInput``), and whether it passes their JSON answer
    on to a sink anywhere (``renders``: ``StageInput.render`` travels with the request's
    runs). An executor of a release before them sends no ``relays`` (no ``renders``): a
    newer gateway then parses every body for the stages it hosts (for every stage of a
    flow of several), as a body must never go where it cannot be read, nor a split answer
    be rendered part by part, during a rolling upgrade."""

    executor: str = wire(_STR)
    token: str = wire(_STR)
    device: str = wire(_STR)
    gpus: list = wire(_LIST)
    relays: bool = wire((bool,), default=False)
    renders: bool = wire((bool,), key="rn", default=False)
    stats: dict | None = wire(_optional(_DICT), default=None)  # for /metrics (executors/gateway/metrics.py)


@message("load")
class Load(Message):
    """Gateway -> executor: build these stages (None: all) of a flow version from the plan
    in the store; answered by Loaded to ``reply``."""

    flow: str = wire(_STR)
    version: int = wire(_INT)
    stages: list | None = wire(_optional(_LIST), absent=None)
    reply: str = wire(_STR)
    token: str = wire(_STR)


@message("loaded")
class Loaded(Message):
    """Executor -> gateway: a Load is done; ``error`` says why it failed (None: built)."""

    executor: str = wire(_STR)
    flow: str = wire(_STR)
    version: int = wire(_INT)
    token: str = wire(_STR)
    error: str | None = wire(_optional(_STR), default=None)


@message("unload")
class Unload(Message):
    """Gateway -> executor: release a flow version (redeployed, undeployed, lost a race)."""

    flow: str = wire(_STR)
    version: int = wire(_INT)


# -- requests ----------------------------------------------------------------------------------


@message("run")
class StageInput(Message):
    """One input of one stage for one request attempt: the request's rows from the gateway,
    or a producing stage's output from an executor. Without a ``table`` it says the
    producing alternative of a first_valid stage gave no valid result."""

    req: int = wire(_INT)
    attempt: int = wire(_INT, key="att")
    flow: str = wire(_STR)
    version: int = wire(_INT, key="ver")
    stage: str = wire(_STR)
    source: str = wire(_STR, key="from")
    routes: dict = wire(_DICT)  # stage -> [address]
    gateway: str = wire(_STR, key="gw")
    deadline: float | None = wire(_optional(_NUMBER), key="dl", default=None)  # wall clock, Unix seconds
    trace: list | tuple = wire(_LIST, default=_EMPTY)  # [[stage, executor, ms, batch], ...]
    path: list | tuple = wire(_LIST, default=_EMPTY)  # [[index, count], ...]
    copy: int = wire(_INT, default=0)
    solo: bool = wire((bool,), default=False)
    render: bool = wire((bool,), key="rj", default=False)  # the sink answers a body's run as JSON (Rendered)
    rid: str = wire(_STR, default="")  # the request id (X-Request-Id): named in the executors' log lines
    tp: str = wire(_STR, default="")  # traceparent of the request's span (executors/tracing.py); "": untraced
    stream: bool = wire((bool,), key="st", default=False)  # streamed: a generator's outputs go ahead (Partial)
    table: Table | None = carried(required=False)

    def to(
        self, stage: str, source: str, path, copy: int, table: Table | None, trace: list | tuple | None = None
    ) -> StageInput:
        """The same request's input for another stage (``source``'s output, or the rows).
        Not ``solo``: the gateway marks the inputs it sends, and only those. ``render`` and
        ``stream`` stay: the sink, wherever it is, answers a relayed body's request as the
        client's JSON and sends a streamed request's generator outputs ahead."""
        return StageInput(
            self.req,
            self.attempt,
            self.flow,
            self.version,
            stage,
            source,
            self.routes,
            self.gateway,
            self.deadline,
            self.trace if trace is None else trace,
            path,
            copy,
            False,
            self.render,
            self.rid,
            self.tp,
            self.stream,
            table,
        )


@message("body")
class RawInput(Message):
    """Gateway -> executor: a request's body as the client sent it (one row, query id
    ``qid``: one JSON object, or an Arrow stream of one row, by ``ctype``), for the flow's one stage that takes the input
    (records.relay_stage). The executor parses and checks it as the gateway would
    (codec/bodies.py: the same errors) and runs the stage; the sink, on whichever executor,
    answers with the rows already as the client's JSON (``Rendered``).
    A racing stage gets one per copy (``copy``); the first answer wins, as for StageInput.

    Why: for such a flow the gateway's work per request is then a relay's (no parse, no
    Table, no encode or decode of one): on the e2e Ensemble that work was half of what the
    two processes added to the one-process floor at concurrency 1 (benchmarks/README.md)."""

    req: int = wire(_INT)
    attempt: int = wire(_INT, key="att")
    flow: str = wire(_STR)
    version: int = wire(_INT, key="ver")
    stage: str = wire(_STR)
    routes: dict = wire(_DICT)  # stage -> [address]
    gateway: str = wire(_STR, key="gw")
    qid: int = wire(_INT)
    ctype: str = wire(_STR, key="ct", default="")
    deadline: float | None = wire(_optional(_NUMBER), key="dl", default=None)  # wall clock, Unix seconds
    solo: bool = wire((bool,), default=False)
    copy: int = wire(_INT, default=0)  # which of a racing stage's copies this is (StageInput.copy)
    rid: str = wire(_STR, default="")  # the request id (StageInput.rid)
    tp: str = wire(_STR, default="")  # traceparent of the request's span (StageInput.tp)
    body: bytes = blob()

    def as_input(self, table: Table | None) -> StageInput:
        """The stage's input once the body is parsed: the rows, whose answer is rendered."""
        return StageInput(
            self.req,
            self.attempt,
            self.flow,
            self.version,
            self.stage,
            INPUT,
            self.routes,
            self.gateway,
            self.deadline,
            copy=self.copy,
            solo=self.solo,
            render=True,
            rid=self.rid,
            tp=self.tp,
            table=table,
        )


@message("cancel")
class Cancel(Message):
    """Executor -> executor: one copy of racing stage ``stage`` finished first for this
    request attempt (request ids are per ``gateway``); the receiver drops the other copies
    it holds queued and any that arrive later. A copy already running is not interrupted."""

    gateway: str = wire(_STR, key="gw")
    req: int = wire(_INT)
    attempt: int = wire(_INT, key="att")
    stage: str = wire(_STR)


@message("revoke")
class Revoke(Message):
    """Gateway -> executor: the gateway gave up on these requests (request ids are per
    ``gateway``; every attempt of each): its client disconnected or its deadline passed.
    The receiver drops their inputs queued or yet to arrive, stops runs that serve only
    them (``flow.wait`` returns, ``flow.cancelled()`` is true), and sends nothing of them on.
    One message per executor carries every request given up on in one turn of the
    gateway's loop."""

    gateway: str = wire(_STR, key="gw")
    reqs: list = wire(_LIST)  # request ids


@message("result")
class Result(Message):
    """Executor -> gateway: the sink's output for a request attempt (one part of it, when
    the sink ran per key group: ``path`` says which)."""

    req: int = wire(_INT)
    attempt: int = wire(_INT, key="att")
    path: list | tuple = wire(_LIST, absent=_EMPTY)
    trace: list | tuple = wire(_LIST, absent=_EMPTY)
    table: Table = carried(required=True)


@message("partial")
class Partial(Message):
    """Executor -> gateway: the fast rows of a first_then that ends the flow, sent as soon as
    they are computed (flow/progressive.py); or, for a streamed request, a generator map's
    outputs in the sink stage as it yields them (executors/worker/progress.py), all final.
    ``final[i]``: row i is its query's answer (no slow row follows); ``start``: where the
    rows begin among their qid's rows of the answer (a generator's outputs come a few at a
    time; a first_then's fast rows, all at once, begin at 0). The request's Result still
    carries its whole answer."""

    req: int = wire(_INT)
    attempt: int = wire(_INT, key="att")
    final: list = wire(_LIST)
    start: int = wire(_INT, key="at", absent=0)
    table: Table = carried(required=True)


@message("answer")
class Rendered(Message):
    """Executor -> gateway: the answer to a ``RawInput`` as the client gets it (the JSON
    of the sink's output, ``rows`` rows whose column types are ``schema``)."""

    req: int = wire(_INT)
    attempt: int = wire(_INT, key="att")
    trace: list | tuple = wire(_LIST, absent=_EMPTY)
    rows: int = wire(_INT, key="n")
    schema: dict = wire(_DICT)  # column -> ColumnType.to_json()
    body: bytes = blob()


@message("error")
class Failure(Message):
    """Executor -> gateway: a request attempt failed; the client gets ``status`` and a JSON
    body of ``error`` (the exception's class name), ``message``, ``operator``, ``qid``."""

    req: int = wire(_INT)
    attempt: int = wire(_INT, key="att")
    status: int = wire(_INT)
    error: str = wire(_STR)
    message: str = wire(_STR)
    operator: str | None = wire(_optional(_STR), default=None)
    qid: int | None = wire(_optional(_INT), default=None)

    def body(self) -> dict:
        """The client's JSON error body (unknown operator and qid left out)."""
        out = {"error": self.error, "message": self.message}
        if self.operator is not None:
            out["operator"] = self.operator
        if self.qid is not None:
            out["qid"] = self.qid
        return out


# -- an executor's watchdog (watchdog.py) ----------------------------------------------------------


@message("stuck")
class Stuck(Message):
    """Executor -> gateway: a thread is held by an abandoned run of ``operator``."""

    executor: str = wire(_STR)
    flow: str = wire(_STR)
    stage: str = wire(_STR)
    operator: str = wire(_STR)
    since: float = wire(_NUMBER)  # wall clock, Unix seconds


@message("unstuck")
class Unstuck(Message):
    """Executor -> gateway: an abandoned run reported by Stuck came back."""

    executor: str = wire(_STR)
    flow: str = wire(_STR)
    stage: str = wire(_STR)
    operator: str = wire(_STR)


@message("recycling")
class Recycling(Message):
    """Executor -> gateway: abandoned work never came back; this executor exits to be
    replaced (the gateway re-runs what it had in flight there at once)."""

    executor: str = wire(_STR)
    flow: str = wire(_STR)
    operator: str = wire(_STR)
    reason: str = wire(_STR)


MESSAGES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        Ping,
        Pong,
        Load,
        Loaded,
        Unload,
        StageInput,
        RawInput,
        Cancel,
        Revoke,
        Result,
        Partial,
        Rendered,
        Failure,
        Stuck,
        Unstuck,
        Recycling,
    )
}


def decode(frames: list) -> Message:
    """The message in ``frames``; WireError if it is not a known, well-formed one."""
    header, tables = unpack(frames)
    cls = _message_class(header)
    if cls._BLOB_FIELD is not None:
        return cls.from_header(header, tables, frames[1] if len(frames) == 2 else None)
    return cls.from_header(header, tables)


def _message_class(header: dict) -> type:
    """The Message class a header's ``type`` names; WireError if none."""
    kind = header.get("type")
    cls = MESSAGES.get(kind) if kind.__class__ is str else None
    if cls is None:
        if kind is None:
            raise WireError("message without a 'type'")
        raise WireError(f"unknown message type {kind!r} (expected one of {', '.join(MESSAGES)})")
    return cls


def decode_unless(frames: list, stale) -> Message | None:
    """``decode``, except that a message whose header ``stale(header)`` finds no longer
    wanted comes back None with its tables never read: the gateway drops the answers of a
    race's losing copies (and superseded attempts) this way, at the cost of a header."""
    header = unpack_header(frames)
    if stale(header):
        return None
    cls = _message_class(header)
    if cls._BLOB_FIELD is not None:
        return cls.from_header(header, {}, frames[1] if len(frames) == 2 else None)
    body = frames[1:]
    tables = {k: decode_table(m, body) for k, m in (header.pop("tables", None) or {}).items()}
    return cls.from_header(header, tables)


def answer_key(header: dict) -> tuple | None:
    """(request, attempt) of a Result's, Rendered's or Failure's header; None for other messages."""
    kind = header.get("type")
    if kind != "result" and kind != "error" and kind != "answer":
        return None
    return header.get("req"), header.get("att")
