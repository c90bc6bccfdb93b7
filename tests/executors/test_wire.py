"""The executor-to-executor wire format: every column kind survives a round trip, and any
malformed message is a WireError (never an exception from deep inside, never unpickled)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from executors.wire.frames import WireError, pack, unpack
from flow.table import Table
from tests.flowgen import assert_same_rows


def sample() -> Table:
    return Table.from_pylist(
        [
            {
                "i": 1,
                "f": 0.5,
                "b": True,
                "s": "héllo",
                "y": b"\x00\x01",
                "t": np.arange(6, dtype=np.float32).reshape(2, 3),
            },
            {"i": None, "f": None, "b": False, "s": None, "y": b"", "t": None},
            {"i": -7, "f": 2.25, "b": None, "s": "", "y": None, "t": np.ones((2, 3), np.float32)},
        ],
        qid=np.array([10, 11, 12]),
    )


def roundtrip(table: Table) -> Table:
    frames = [bytes(f) for f in pack({"type": "run"}, {"t": table})]  # as bytes off a socket
    header, tables = unpack(frames)
    assert header == {"type": "run"}
    return tables["t"]


def test_every_column_kind_and_missing_values_round_trip():
    t = sample()
    back = roundtrip(t)
    assert back.schema == t.schema
    assert_same_rows(back, t)
    assert back.qid.tolist() == [10, 11, 12]


def test_empty_tables_and_all_null_columns_round_trip():
    empty = sample().take(np.array([], dtype=np.int64))
    assert len(roundtrip(empty)) == 0 and roundtrip(empty).schema == empty.schema
    nulls = Table.from_pylist([{"n": None}, {"n": None}], qid=np.array([1, 2]))
    assert roundtrip(nulls).column("n").values.tolist() == [None, None]


def test_large_tensors_travel_as_one_frame_without_copies():
    big = Table.from_dict({"x": np.random.default_rng(0).random((1, 1024, 1024)).astype(np.float32)}, qid=np.array([1]))
    frames = pack({"type": "run"}, {"t": big})
    values = big.column("x").values
    (frame,) = [f for f in frames if len(f) == values.nbytes]
    assert np.shares_memory(np.frombuffer(frame, np.float32), values)  # the array itself, not a copy
    _, tables = unpack(frames)
    assert np.array_equal(tables["t"].column("x").values, big.column("x").values)


def _meta(frames):
    return json.loads(bytes(frames[0]))


def _with_meta(frames, mutate):
    doc = _meta(frames)
    mutate(doc["tables"]["t"])
    return [json.dumps(doc).encode()] + list(frames[1:])


@pytest.mark.parametrize(
    "frames, message",
    [
        ([], "empty message"),
        ([b"\xff\xfe"], "not JSON"),
        ([b"[1, 2]"], "must be a JSON object"),
    ],
)
def test_malformed_headers_are_wire_errors(frames, message):
    with pytest.raises(WireError, match=message):
        unpack(frames)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda m: m.update(n=5),  # more rows than the buffers hold
        lambda m: m.update(qid=99),  # a buffer that does not exist
        lambda m: m["cols"][0].update(type={"kind": "bogus"}),  # an unknown column kind
        lambda m: m["cols"][0].update(type=["int"]),  # a type that is not an object
        lambda m: m["cols"][5].update(type={"kind": "tensor", "dtype": "<f4", "shape": 6}),  # shape not a list
        lambda m: m["cols"][5].update(type={"kind": "tensor", "dtype": "<f4", "shape": [4, 4]}),  # size mismatch
        lambda m: m["cols"][3].update(lengths=m["cols"][0]["values"]),  # str lengths that do not add up
        lambda m: m.pop("cols"),
    ],
)
def test_malformed_tables_are_wire_errors(mutate):
    frames = [bytes(f) for f in pack({"type": "run"}, {"t": sample()})]
    with pytest.raises(WireError):
        unpack(_with_meta(frames, mutate))
