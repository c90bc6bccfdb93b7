"""The messages between gateway and executors (executors/wire/messages.py): every type survives
a trip through bytes, anything else is a WireError naming what was wrong, and the
dispatcher's own errors reach clients through the one error -> HTTP mapping."""

from __future__ import annotations

import ast
import dataclasses
import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from executors.errors import NoExecutorError, OperatorCrashedError, status_for
from executors.gateway.records import RequestFailed
from executors.wire.frames import WireError, pack_copies
from executors.wire.messages import (
    MESSAGES,
    Cancel,
    Failure,
    Load,
    Loaded,
    Message,
    Partial,
    Ping,
    Pong,
    RawInput,
    Recycling,
    Rendered,
    Result,
    Revoke,
    StageInput,
    Stuck,
    Unload,
    Unstuck,
    decode,
    decode_unless,
)
from flow.errors import DeadlineExceededError, InternalError
from flow.table import Table
from tests.flowgen import assert_same_rows

ROOT = Path(__file__).resolve().parents[2]


def table() -> Table:
    return Table.from_pylist(
        [{"x": 1.5, "s": "héllo", "t": np.ones((2, 3), np.float32)}, {"x": None, "s": None, "t": None}],
        qid=np.array([7, 8]),
    )


RUN = StageInput(
    12,
    1,
    "cascade",
    3,
    "fast",
    "__input__",
    {"fast": ["ipc:///tmp/e0"], "slow": ["ipc:///tmp/e1"]},
    "ipc:///tmp/gw",
    1.8e9,
    [["pre", "e0", 0.25, 2]],
    [[0, 2]],
    copy=1,
    solo=True,
    table=table(),
)

EVERY = [
    Ping("ipc:///tmp/gw", "ping-1"),
    Pong("e0", "ping-1", "gpu", [{"index": 0, "util": 0.5}]),
    Pong("e1", "ping-2", "cpu", [], relays=True),
    Load("cascade", 3, ["fast", "slow"], "ipc:///tmp/gw", "load-2"),
    Load("cascade", 3, None, "ipc:///tmp/gw", "load-3"),
    Loaded("e0", "cascade", 3, "load-2"),
    Loaded("e0", "cascade", 3, "load-2", error="FlowValueError: gone"),
    Unload("cascade", 3),
    RUN,
    StageInput(12, 0, "cascade", 3, "pick", "slow", {"pick": ["ipc:///tmp/e0"]}, "ipc:///tmp/gw"),  # no table
    StageInput(12, 0, "words", 3, "split", "__input__", {"split": ["ipc:///tmp/e0"]}, "gw", stream=True, table=table()),
    RawInput(12, 1, "ensemble", 3, "all", {"all": ["ipc:///tmp/e0"]}, "ipc:///tmp/gw", 40, body=b'{"img": [[1]]}'),
    RawInput(
        12, 2, "ensemble", 3, "all", {}, "gw", 41, "application/json", 1.8e9, solo=True, body=bytearray(b'{"x":1}')
    ),
    RawInput(12, 3, "raced", 3, "all", {"all": ["ipc:///tmp/e0"] * 3}, "gw", 42, copy=2, body=b'{"x":1}'),
    Cancel("ipc:///tmp/gw", 12, 1, "slow"),
    Revoke("ipc:///tmp/gw", [12, 13]),
    Result(12, 1, [[1, 2]], [["pick", "e0", 0.1, 1]], table()),
    Partial(12, 1, [True, False], 0, table()),
    Partial(12, 1, [True, True], 3, table()),  # a generator's outputs, after 3 of their qid
    Rendered(12, 1, [["all", "e0", 0.3, 1]], 1, {"cls": {"kind": "int"}}, b'{"rows":[{"cls":3}]}'),
    Failure(
        12, 1, 422, "NoValidResultError", "operator 'pick': no alternative gave a valid result", operator="pick", qid=7
    ),
    Failure(12, 1, 500, "ZeroDivisionError", "stage 'a' raised ZeroDivisionError: division by zero"),
    Failure(12, 1, 400, "DataTypeError", "row 0 is bad", operator="parse", qid=0),  # qid 0: falsy, not absent
    Stuck("e0", "cascade", "slow", "BigNet", 1.8e9),
    Unstuck("e0", "cascade", "slow", "BigNet"),
    Recycling("e0", "cascade", "BigNet", "operator 'BigNet' stuck"),
]


def through_bytes(msg: Message) -> Message:
    return decode([bytes(f) for f in msg.encode()])  # as frames off a socket


def same(a: Message, b: Message) -> bool:
    """Equal field by field; tables by their rows; lists the wire turns tuples into compared as lists."""
    if type(a) is not type(b):
        return False
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, Table) or isinstance(y, Table):
            if not (isinstance(x, Table) and isinstance(y, Table)):
                return False
            assert_same_rows(x, y)
            assert x.qid.tolist() == y.qid.tolist()
        elif isinstance(x, (bytes, bytearray, memoryview)):
            if bytes(x) != bytes(y):
                return False
        elif json.loads(json.dumps(x)) != json.loads(json.dumps(y)):
            return False
    return True


def test_every_message_type_is_covered_here():
    assert {type(m) for m in EVERY} == set(MESSAGES.values())


@pytest.mark.parametrize("msg", EVERY, ids=lambda m: m.TYPE)
def test_every_message_round_trips_through_bytes(msg):
    back = through_bytes(msg)
    assert same(back, msg), (back, msg)


def test_messages_take_no_attribute_that_is_not_a_field():
    with pytest.raises(AttributeError):
        RUN.extra = 1  # slots: a misspelt field is an error, not a new attribute


def test_a_run_for_the_next_stage_is_a_new_message_and_leaves_the_first_as_it_was():
    before = {f.name: getattr(RUN, f.name) for f in fields(RUN)}
    nxt = RUN.to("next", RUN.stage, (), 0, None, [["s", "e", 1.0, 1]])
    assert nxt is not RUN and (nxt.stage, nxt.source, nxt.table) == ("next", RUN.stage, None)
    assert {f.name: getattr(RUN, f.name) for f in fields(RUN)} == before


def test_a_run_message_keeps_the_short_keys_and_leaves_defaults_off():
    h = json.loads(bytes(RUN.to("slow", "fast", (), 0, None).encode()[0]))
    assert h == {
        "type": "run",
        "req": 12,
        "att": 1,
        "flow": "cascade",
        "ver": 3,
        "stage": "slow",
        "from": "fast",
        "routes": RUN.routes,
        "gw": "ipc:///tmp/gw",
        "dl": 1.8e9,
        "trace": [["pre", "e0", 0.25, 2]],
    }


CODEC_CASES = EVERY + [
    StageInput(1, 0, "f", 1, "s", "__input__", {}, "gw"),
    StageInput(1, 0, "f", 1, "s", "__input__", {}, "gw", deadline=5),
    StageInput(1, 0, "f", 1, "s", "__input__", {}, "gw", render=True, table=table()),
]


def _blob(msg: Message):
    return getattr(msg, msg._BLOB_FIELD) if msg._BLOB_FIELD else None


def _generic_decode(msg: Message, h: dict):
    return Message.from_header.__func__(type(msg), h, msg.tables() or {}, _blob(msg))


@pytest.mark.parametrize("msg", CODEC_CASES, ids=lambda m: m.TYPE)
def test_each_message_types_compiled_codec_agrees_with_the_generic_loop(msg):
    assert msg.header() == Message.header(msg)
    h = msg.header()
    assert same(type(msg).from_header(h, msg.tables() or {}, _blob(msg)), _generic_decode(msg, h))


def _wrong(types: tuple):
    """A JSON value of none of ``types``."""
    return next(v for v in ({"x": 1}, [1], "s", 1.5, True, None) if v.__class__ not in types)


@pytest.mark.parametrize("msg", EVERY, ids=lambda m: m.TYPE)
def test_each_message_types_compiled_decoder_rejects_what_the_generic_loop_rejects(msg):
    cls = type(msg)
    for _attr, key, types, _default in cls._FIELDS:
        for h in ({**msg.header(), key: _wrong(types)}, {k: v for k, v in msg.header().items() if k != key}):
            try:
                want = _generic_decode(msg, h)
            except WireError as e:
                with pytest.raises(WireError) as got:
                    cls.from_header(h, msg.tables() or {}, _blob(msg))
                assert str(got.value) == str(e), key
            else:  # a field left off that has a default
                assert same(cls.from_header(h, msg.tables() or {}, _blob(msg)), want)
    if cls._TABLE_FIELD is not None and cls._TABLE_FIELD[1]:
        with pytest.raises(WireError, match="its table 't' is missing"):
            cls.from_header(msg.header(), {})
    if cls._BLOB_FIELD is not None:
        with pytest.raises(WireError, match=r"body \(frame 1\) is missing"):
            cls.from_header(msg.header(), {})


def test_to_gives_the_same_request_for_another_stage():
    nxt = RUN.to("slow", "fast", ((1, 2),), 0, None, trace=[["fast", "e0", 1.0, 1]])
    assert (nxt.req, nxt.attempt, nxt.flow, nxt.version, nxt.routes, nxt.gateway, nxt.deadline) == (
        RUN.req,
        RUN.attempt,
        RUN.flow,
        RUN.version,
        RUN.routes,
        RUN.gateway,
        RUN.deadline,
    )
    assert (nxt.stage, nxt.source, nxt.path, nxt.table, nxt.trace) == (
        "slow",
        "fast",
        ((1, 2),),
        None,
        [["fast", "e0", 1.0, 1]],
    )
    assert not nxt.solo  # the gateway marks the inputs it sends (a retry after a crash), and only those
    assert not nxt.stream
    streamed = dataclasses.replace(RUN, stream=True)
    assert streamed.to("slow", "fast", (), 0, None).stream  # the sink, on any stage, sends its outputs ahead


def test_a_streamed_runs_flag_and_a_partials_start_are_off_the_wire_unless_set():
    assert "st" not in header_of(RUN)  # a request that is not streamed pays nothing for it
    assert header_of(dataclasses.replace(RUN, stream=True))["st"] is True
    assert "at" not in header_of(Partial(12, 1, [True], 0, table().take([0])))
    assert header_of(Partial(12, 1, [True], 2, table().take([0])))["at"] == 2
    with pytest.raises(WireError, match="'run' message: field 'st' must be a boolean, got 1"):
        decode(frames_with(RUN, st=1))


def header_of(msg: Message) -> dict:
    return json.loads(bytes(msg.encode()[0]))


def frames_with(msg: Message, **changes) -> list:
    """``msg``'s frames with header keys replaced (a value of ... removes the key)."""
    frames = [bytes(f) for f in msg.encode()]
    h = json.loads(frames[0])
    for k, v in changes.items():
        if v is ...:
            h.pop(k, None)
        else:
            h[k] = v
    return [json.dumps(h).encode()] + frames[1:]


@pytest.mark.parametrize(
    "frames, error",
    [
        ([b'{"req": 1}'], "message without a 'type'"),
        ([b'{"type": "bogus"}'], "unknown message type 'bogus' (expected one of ping, pong, load"),
        ([b'{"type": 7}'], "unknown message type 7"),
        (frames_with(RUN, req=...), "'run' message: field 'req' is missing"),
        (frames_with(RUN, att="1"), "'run' message: field 'att' must be an integer, got '1'"),
        (frames_with(RUN, ver=True), "'run' message: field 'ver' must be an integer, got True"),
        (frames_with(RUN, routes=["ipc:///tmp/e0"]), "'run' message: field 'routes' must be an object, got ['ipc"),
        (frames_with(RUN, dl="soon"), "'run' message: field 'dl' must be a number or null, got 'soon'"),
        (frames_with(RUN, path="0:2"), "'run' message: field 'path' must be a list"),
        (frames_with(RUN, solo=1), "'run' message: field 'solo' must be a boolean, got 1"),
        (frames_with(RUN, gw="x" * 200), None),  # long values are fine
        ([json.dumps({"type": "result", "req": 1, "att": 0}).encode()], "'result' message: its table 't' is missing"),
        (frames_with(Ping("gw", "t"), token=None), "'ping' message: field 'token' must be a string, got None"),
        (frames_with(Loaded("e0", "f", 1, "t"), error=3), "'loaded' message: field 'error' must be a string or null"),
        (frames_with(Failure(1, 0, 500, "E", "m"), status="500"), "'error' message: field 'status' must be an integer"),
        (frames_with(Stuck("e0", "f", "s", "op", 1.0), since=...), "'stuck' message: field 'since' is missing"),
    ],
)
def test_malformed_messages_are_message_errors_naming_what_is_wrong(frames, error):
    if error is None:
        assert decode(frames).gateway == "x" * 200
        return
    with pytest.raises(WireError) as info:
        decode(frames)
    assert error in str(info.value)
    assert isinstance(info.value, InternalError)  # ours, not the request's: dropped and logged


def test_a_long_bad_value_is_shortened_in_the_error():
    with pytest.raises(WireError, match=r"got \['x+\.\.\.$"):
        decode(frames_with(Ping("gw", "t"), token=["x" * 500]))


def test_a_header_that_is_not_a_json_object_is_a_wire_error():
    with pytest.raises(WireError, match="not JSON"):
        decode([b"\xff"])
    with pytest.raises(WireError, match="must be a JSON object"):
        decode([b"[]"])


@pytest.mark.parametrize(
    "error, status",
    [
        (NoExecutorError("flow 'f': no live executor hosts stage 'a'"), 503),
        (DeadlineExceededError("flow 'f': no answer within 1 s"), 504),
        (OperatorCrashedError("flow 'f': operator 'boom' crashed its executor", operator="boom", qid=9), 500),
    ],
)
def test_the_dispatchers_errors_take_their_status_from_status_for(error, status):
    failed = RequestFailed.of(error)
    assert failed.status == status == status_for(error)
    assert failed.body["error"] == type(error).__name__ and failed.body["message"] == str(error)
    assert ("operator" in failed.body) == (getattr(error, "operator", None) is not None)
    if isinstance(error, OperatorCrashedError):
        assert (failed.body["operator"], failed.body["qid"]) == ("boom", 9)


SHORT_KEYS = {"att", "ver", "dl", "gw", "req", "invalid"}


RUNTIME = sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "executors").rglob("*.py") if p != ROOT / "executors/wire/messages.py"
)


@pytest.mark.parametrize("module", RUNTIME)
def test_no_other_module_spells_the_wire_keys(module):
    tree = ast.parse((ROOT / module).read_text())
    spelled = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in SHORT_KEYS}
    assert not spelled, f"{module} spells wire keys {sorted(spelled)}: use executors/wire/messages.py"


def test_racing_copies_share_one_encoded_table_and_decode_as_their_own():
    copies = [dataclasses.replace(RUN, copy=j) for j in range(3)]
    frames = pack_copies([m.header() for m in copies], copies[0].tables())
    for m, f in zip(copies, frames):
        assert same(decode([bytes(x) for x in f]), m)
        assert [bytes(x) for x in f] == [bytes(x) for x in m.encode()]  # what encode() writes, byte for byte
    assert all(f[1:][i] is frames[0][1:][i] for f in frames for i in range(len(f) - 1))  # buffers shared


def test_decode_unless_skips_a_stale_answer_without_reading_its_tables():
    answer = Result(12, 1, [], [], table())
    frames = [bytes(f) for f in answer.encode()]
    assert decode_unless(frames, lambda h: h["req"] == 12) is None
    assert same(decode_unless(frames, lambda h: False), answer)
    broken = frames[:1] + [b"\x00"]  # a table frame that cannot be read: never looked at when stale
    assert decode_unless(broken, lambda h: True) is None
    with pytest.raises(WireError):
        decode_unless(broken, lambda h: False)
    with pytest.raises(WireError, match="unknown message type"):
        decode_unless([b'{"type": "nope"}'], lambda h: False)


def test_a_body_and_its_answer_travel_as_they_are_in_frame_1():
    """A relayed body and its rendered answer: the bytes are frame 1 untouched (no JSON
    string inside the header, no table), and a message that lost its frame 1 is an error."""
    run = next(m for m in EVERY if isinstance(m, RawInput))
    frames = run.encode()
    assert len(frames) == 2 and bytes(frames[1]) == b'{"img": [[1]]}'
    assert "tables" not in json.loads(bytes(frames[0]))
    answer = next(m for m in EVERY if isinstance(m, Rendered))
    assert bytes(answer.encode()[1]) == b'{"rows":[{"cls":3}]}'
    for msg in (run, answer):
        with pytest.raises(WireError, match=r"body \(frame 1\) is missing"):
            decode([bytes(msg.encode()[0])])
    stale = [bytes(f) for f in answer.encode()]
    assert decode_unless(stale, lambda h: True) is None
    assert same(decode_unless(stale, lambda h: False), answer)


def test_a_bodys_runs_ask_the_sink_for_json_wherever_it_is():
    run = next(m for m in EVERY if isinstance(m, RawInput)).as_input(table())
    assert run.render and run.source == "__input__" and (run.req, run.attempt, run.stage) == (12, 1, "all")
    assert json.loads(bytes(run.encode()[0]))["rj"] is True
    after = run.to("next", "all", (), 0, None)
    assert after.render and not after.solo  # the next stage's run, sent on: it may be the sink
    assert decode(after.encode()).render
    assert not next(m for m in EVERY if isinstance(m, StageInput)).to("next", "all", (), 0, None).render
