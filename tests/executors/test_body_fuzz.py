"""Fuzzing what the gateway makes of request bodies: mutated Arrow IPC streams and JSON
bodies through the gateway's own functions (``httpcodec.parse_body`` and ``input_table``,
the relayed body's ``one_row_table``, the big body's ``jsontensors.read_rows``), then a
few hundred of them over real HTTP at a local cluster.

Every body must become a Table that validates, or be refused as the gateway refuses a
body (``BadRequestError`` or the ``DataError`` family: a 4xx). Anything else is a bug: an
other exception is a 500 (or worse, on the event loop), and a crash (an Arrow body whose
offsets point past its data is read out of bounds) takes the gateway down, and with it
every request in flight. The in-process cases run in child processes, so a crash is a
test failure naming the case (seed and index: ``python -m tests.executors.test_body_fuzz
--case SEED INDEX`` runs one), not a dead pytest.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import random
import struct
import subprocess
import sys
import time
import traceback
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

from executors.codec import bodies as httpcodec
from executors.codec import jsontensors
from executors.codec.bodies import ARROW, BadRequestError, input_table, one_row_table, parse_body
from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import ColumnType, Flow
from flow.errors import DataError
from flow.table import Table
from flow.validation import check_schema

SEED = 20261204
CASES = 200_000  # the cases a run may reach; each child stops at its time budget
CHILD_BUDGET_S = 12.0  # two children side by side (2 cores): ~13 s of wall time in all
MIN_CASES = 4_000  # fewer than this in the budget: the run proves too little (a slow machine?)
MAX_ROWS = 1_000_000  # the gateway's max_rows: a body of more rows is a 413 before it becomes a Table
REPO = Path(__file__).resolve().parents[2]

U8 = ColumnType.tensor(np.uint8, (2, 3))
F32 = ColumnType.tensor(np.float32, (4,))
F16 = ColumnType.tensor(np.float16, (2,))
SCHEMAS: dict[str, dict | None] = {
    "tabular": {k: ColumnType.scalar(v) for k, v in (("x", "int"), ("f", "float"), ("s", "str"), ("b", "bytes"))}
    | {"ok": ColumnType.scalar("bool")},
    "tensors": {"img": U8, "w": F32, "h": F16},
    "numbers": {
        "k": ColumnType.scalar("int"),
        "v": ColumnType.scalar("float"),
        "t": ColumnType.tensor(np.float32, (3,)),
    },
    "free": None,
}
FLOWS = list(SCHEMAS)
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class Failure(Exception):
    """A body the gateway's functions got wrong (not a Table, not a 4xx)."""


# -- valid bodies ---------------------------------------------------------------------------------


def _rows(r: random.Random, flow: str, n: int) -> list[dict]:
    """``n`` valid rows of a flow's input (numpy arrays for tensors, bytes for bytes)."""
    out = []
    for _ in range(n):
        if flow == "tabular":
            row = {
                "x": r.randint(-1000, 1000),
                "f": r.uniform(-1e3, 1e3),
                "s": r.choice(["", "a", "héllo", "日本", "x" * r.randint(0, 40)]),
                "b": bytes(r.randrange(256) for _ in range(r.randint(0, 8))),
                "ok": r.random() < 0.5,
            }
        elif flow == "tensors":
            row = {
                "img": np.array([[r.randrange(256) for _ in range(3)] for _ in range(2)], np.uint8),
                "w": np.array([r.uniform(-1, 1) for _ in range(4)], np.float32),
                "h": np.array([r.uniform(-100, 100) for _ in range(2)], np.float16),
            }
        elif flow == "numbers":
            row = {
                "k": r.randint(-(10**6), 10**6),
                "v": r.uniform(-1, 1),
                "t": np.array([r.uniform(-5, 5) for _ in range(3)], np.float32),
            }
        else:
            row = {"a": r.randint(0, 9), "name": r.choice(["p", "q", "ü"]), "score": r.random()}
        out.append(row)
    return out


def _json_value(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    return v


def _json_doc(rows: list[dict], one: bool):
    docs = [{k: _json_value(v) for k, v in row.items()} for row in rows]
    return docs[0] if one and docs else docs


def _stream(data, options=None, chunk: int | None = None) -> bytes:
    """The Arrow IPC stream of a pyarrow Table (or list of batches)."""
    sink = pa.BufferOutputStream()
    batches = data if isinstance(data, list) else data.to_batches(max_chunksize=chunk)
    schema = batches[0].schema if isinstance(data, list) else data.schema
    with pa.ipc.new_stream(sink, schema, options=options) as w:
        for b in batches:
            w.write_batch(b)
    return sink.getvalue().to_pybytes()


def _as_call(rows: list[dict]) -> pa.Table:
    """A Table's Arrow form as ``Deployment.call`` sends it (tensors as fixed_shape_tensor)."""
    return Table.from_pylist(rows).to_arrow().drop_columns(["qid"])


def _with_extension(arr: pa.Array, name: str, meta: bytes, column: str = "e") -> pa.Table:
    """A column whose field claims an extension type (the metadata is read when the stream is)."""
    field = pa.field(column, arr.type, metadata={b"ARROW:extension:name": name, b"ARROW:extension:metadata": meta})
    return pa.Table.from_arrays([arr], schema=pa.schema([field]))


def _arrow_corpus() -> list[tuple[str, bytes]]:
    """Valid Arrow streams: what clients send (every flow's rows as Deployment.call encodes
    them, tensors as plain and nested lists), what the gateway must refuse by type, and
    the stream features a mutation can reach (dictionaries, deltas, compression, many
    batches, metadata, extension types)."""
    r = random.Random(SEED)
    out: list[tuple[str, bytes]] = []
    for flow in FLOWS:
        for n in (0, 1, 3):
            rows = _rows(r, flow, n)
            if n:
                out.append((f"{flow}-call-{n}", _stream(_as_call(rows))))
    rows = _rows(r, "tensors", 3)
    img = [x["img"].reshape(-1).tolist() for x in rows]
    w = [x["w"].tolist() for x in rows]
    h = [x["h"].tolist() for x in rows]
    fsl = pa.FixedSizeListArray.from_arrays
    out += [
        (
            "tensors-fsl",
            _stream(
                pa.table(
                    {
                        "img": fsl(pa.array(sum(img, []), pa.uint8()), 6),
                        "w": fsl(pa.array(sum(w, []), pa.float32()), 4),
                        "h": fsl(pa.array(sum(h, []), pa.float16()), 2),
                    }
                )
            ),
        ),
        (
            "tensors-lists",
            _stream(
                pa.table(
                    {
                        "img": pa.array([[v[:3], v[3:]] for v in img], pa.list_(pa.list_(pa.uint8()))),
                        "w": pa.array(w, pa.list_(pa.float32())),
                        "h": pa.array(h, pa.large_list(pa.float16())),
                    }
                )
            ),
        ),
        (
            "tensors-wide-values",  # int64 for uint8, float64 for float32/float16: checked and cast
            _stream(pa.table({"img": pa.array([[v[:3], v[3:]] for v in img]), "w": pa.array(w), "h": pa.array(h)})),
        ),
        (
            "tensors-overflowing",
            _stream(pa.table({"img": [[[1, 2, 3], [4, 5, 6]]], "w": [[1e39, 0.0, 1.0, 2.0]], "h": [[7e4, 1]]})),
        ),
        (
            "tensors-floats-for-uint8",
            _stream(pa.table({"img": [[[0.5] * 3] * 2], "w": [[1.0] * 4], "h": [[1.0, 2.0]]})),
        ),
        ("tensors-bools", _stream(pa.table({"img": [[[True] * 3] * 2], "w": [[1.0] * 4], "h": [[1.0, 2.0]]}))),
        (
            "tensors-nulls",
            _stream(
                pa.table(
                    {"img": pa.array([None, [1] * 6, [1, None, 1, 1, 1, 1]]), "w": [None] * 3, "h": [[1.0, None]] * 3}
                )
            ),
        ),
    ]
    rows = _rows(r, "tabular", 5)
    cols = {k: [row[k] for row in rows] for k in rows[0]}
    tab = pa.table(cols)
    strings = pa.array(["a", None, "héllo", "", "日本"])
    out += [
        ("tabular-plain", _stream(tab)),
        ("tabular-batches", _stream(tab, chunk=1)),
        ("tabular-nulls", _stream(tab.set_column(2, "s", strings).set_column(0, "x", pa.array([1, None, 3, None, 5])))),
        ("tabular-sliced", _stream(tab.slice(1, 3))),
        ("tabular-dict", _stream(tab.set_column(2, "s", strings.dictionary_encode()))),
        (
            "tabular-dict-deltas",
            _stream(
                [
                    pa.record_batch([pa.array(["a", "b", "a"]).dictionary_encode()], names=["s"]),
                    pa.record_batch(
                        [pa.DictionaryArray.from_arrays(pa.array([0, 2, 1], pa.int32()), pa.array(["a", "b", "c"]))],
                        names=["s"],
                    ),
                ],
                options=pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True),
            ),
        ),
        (
            "tabular-large",
            _stream(
                tab.set_column(2, "s", strings.cast(pa.large_string())).set_column(
                    3, "b", pa.array(cols["b"], pa.large_binary())
                )
            ),
        ),
        (
            "tabular-views",
            _stream(
                tab.set_column(2, "s", strings.cast(pa.string_view())).set_column(
                    3, "b", pa.array(cols["b"], pa.binary_view())
                )
            ),
        ),
        ("tabular-fixed-binary", _stream(tab.set_column(3, "b", pa.array([b"ab"] * 5, pa.binary(2))))),
        (
            "tabular-narrow",
            _stream(
                tab.set_column(0, "x", pa.array(cols["x"], pa.int16())).set_column(
                    1, "f", pa.array(cols["f"], pa.float16())
                )
            ),
        ),
        ("tabular-uint64", _stream(tab.set_column(0, "x", pa.array([2**63, 1, 2, 3, 4], pa.uint64())))),
        ("tabular-lz4", _stream(tab, options=pa.ipc.IpcWriteOptions(compression="lz4"))),
        ("tabular-zstd", _stream(tab, options=pa.ipc.IpcWriteOptions(compression="zstd"))),
        ("tabular-many-batches", _stream(pa.concat_tables([tab] * 60), chunk=1)),
        ("tabular-schema-only", _stream([pa.record_batch([pa.array([], pa.int64())], names=["x"])])),
        (
            "tabular-metadata",
            _stream(tab.replace_schema_metadata({"pandas": "{not json", "\u00ff" * 10: "\x00" * 300})),
        ),
        ("names-odd", _stream(pa.table({"": [1], "é" * 200: [2], " ": [3]}))),
        ("names-duplicate", _stream(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"]))),
        ("names-qid", _stream(pa.table({"x": [1], "qid": [2]}))),
        ("names-pos", _stream(pa.table({"x": [1], "#pos": [2]}))),
        ("nulls-only", _stream(pa.table({"x": pa.nulls(4), "s": pa.nulls(4, pa.string())}))),
        ("no-columns", _stream(pa.table({"x": [1, 2]}).drop_columns(["x"]))),
        ("zstd-tensors", _stream(_as_call(_rows(r, "tensors", 4)), options=pa.ipc.IpcWriteOptions(compression="zstd"))),
    ]
    # types a Table does not take: refused by name before a value is read
    out += [
        ("struct", _stream(pa.table({"x": pa.array([{"a": 1, "b": "x"}, None])}))),
        ("map", _stream(pa.table({"x": pa.array([[("a", 1)], []], pa.map_(pa.string(), pa.int64()))}))),
        (
            "dense-union",
            _stream(
                pa.table(
                    {
                        "x": pa.UnionArray.from_dense(
                            pa.array([0, 1], pa.int8()), pa.array([0, 0], pa.int32()), [pa.array([1]), pa.array(["a"])]
                        )
                    }
                )
            ),
        ),
        (
            "sparse-union",
            _stream(
                pa.table(
                    {
                        "x": pa.UnionArray.from_sparse(
                            pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["a", "b"])]
                        )
                    }
                )
            ),
        ),
        ("timestamp", _stream(pa.table({"x": pa.array([0, 2**62], pa.timestamp("ns", "UTC"))}))),
        ("decimal", _stream(pa.table({"x": pa.array([1, 2], pa.decimal128(38, 2))}))),
        ("list-of-strings", _stream(pa.table({"x": [["a"], ["b", "c"]]}))),
        ("run-end", _stream(pa.table({"x": pa.RunEndEncodedArray.from_arrays([2**20], [7])}))),
        ("nested-deep", _stream(pa.table({"x": pa.array([[[[[[1.0]]]]]])}))),
        ("list-view", _stream(pa.table({"x": pa.array([[1, 2], [3]], pa.list_view(pa.int64()))}))),
    ]
    storage = fsl(pa.array(np.arange(8, dtype=np.float32)), 4)
    for meta in (
        b'{"shape":[4]}',
        b'{"shape":[5]}',
        b'{"shape":[2,2],"permutation":[1,0]}',
        b'{"shape":[]}',
        b'{"shape":[-1,-4]}',
        b'{"shape":[2,2],"dim_names":["a"]}',
        b'{"shape":"x"}',
        b"not json",
        b"",
    ):
        out.append(
            (
                f"ext-tensor-{meta[:20].decode(errors='replace')}",
                _stream(_with_extension(storage, b"arrow.fixed_shape_tensor", meta)),
            )
        )
    out += [
        ("ext-json", _stream(_with_extension(pa.array(['{"a": 1}', "[]"]), b"arrow.json", b""))),
        ("ext-uuid", _stream(_with_extension(pa.array([b"0" * 16], pa.binary(16)), b"arrow.uuid", b""))),
        ("ext-bool8", _stream(_with_extension(pa.array([0, 1, -1], pa.int8()), b"arrow.bool8", b""))),
        (
            "ext-opaque",
            _stream(_with_extension(pa.array([b"x"]), b"arrow.opaque", b'{"type_name":"t","vendor_name":"v"}')),
        ),
        ("ext-unknown", _stream(_with_extension(pa.array([1, 2]), b"vendor.thing", b"\x00\xff"))),
    ]
    return out


def _messages(body: bytes) -> list[bytes]:
    """A valid stream's messages, each as it lies in the stream (the end marker left off)."""
    return [m.serialize().to_pybytes() for m in pa.ipc.MessageReader.open_stream(body)]


# -- mutations ------------------------------------------------------------------------------------

_I32 = (0, 1, -1, 2, 7, 8, 255, 65536, 2**30, 2**31 - 1, -(2**31))
_I64 = (0, 1, -1, 8, 2**31 - 1, 2**31, 2**32, 2**40, 2**62, 2**63 - 1, -(2**63))


def _candidates(body: bytes, width: int) -> np.ndarray:
    """Aligned positions of small non-negative integers: lengths, offsets, counts, sizes."""
    n = len(body) // width
    values = np.frombuffer(body, dtype="<i4" if width == 4 else "<i8", count=n)
    return np.flatnonzero((values >= 0) & (values <= 1 << 20)) * width


def _mutate_bytes(r: random.Random, body: bytes, others: list[bytes]) -> tuple[str, bytes]:
    b = bytearray(body)
    op = r.choices(
        ["bits", "byte", "int32", "int64", "truncate", "extend", "splice", "insert", "delete", "repeat"],
        weights=[14, 8, 24, 20, 6, 5, 6, 4, 4, 4],
    )[0]
    if not b:
        return "empty", bytes(r.randrange(256) for _ in range(r.randint(0, 16)))
    if op == "bits":
        spots = [r.randrange(len(b) * 8) for _ in range(r.randint(1, 6))]
        for s in spots:
            b[s // 8] ^= 1 << (s % 8)
        return f"bits {spots}", bytes(b)
    if op == "byte":
        at, v = r.randrange(len(b)), r.choice((0, 0xFF, 0x7F, 0x80, 1))
        b[at] = v
        return f"byte {v:#x} at {at}", bytes(b)
    if op in ("int32", "int64"):
        width = 4 if op == "int32" else 8
        if len(b) < width:
            return op, bytes(b)
        spots = _candidates(bytes(b), width)
        at = int(r.choice(spots)) if len(spots) and r.random() < 0.85 else r.randrange(len(b) // width) * width
        old = int.from_bytes(b[at : at + width], "little", signed=True)
        v = r.choice((*(_I32 if width == 4 else _I64), old + 1, old - 1, old * 2, old + 8, old + 4096))
        lo, hi = (-(2**31), 2**31 - 1) if width == 4 else (-(2**63), 2**63 - 1)
        v = min(max(v, lo), hi)
        b[at : at + width] = v.to_bytes(width, "little", signed=True)
        return f"{op} {old} -> {v} at {at}", bytes(b)
    if op == "truncate":
        at = r.randrange(len(b))
        return f"truncate at {at}", bytes(b[:at])
    if op == "extend":
        tail = r.choice(others) if r.random() < 0.5 else bytes(r.randrange(256) for _ in range(r.randint(1, 64)))
        return f"extend by {len(tail)}", bytes(b) + tail
    if op == "splice":
        other = r.choice(others)
        a, c = r.randrange(len(b)), r.randrange(len(other) or 1)
        return f"splice {a} | {c}", bytes(b[:a]) + other[c:]
    if op == "insert":
        at, extra = r.randrange(len(b)), bytes(r.randrange(256) for _ in range(r.randint(1, 16)))
        return f"insert {extra.hex()} at {at}", bytes(b[:at]) + extra + bytes(b[at:])
    if op == "delete":
        at = r.randrange(len(b))
        n = r.randint(1, 32)
        return f"delete {n} at {at}", bytes(b[:at]) + bytes(b[at + n :])
    at, n = r.randrange(len(b)), r.randint(1, 64)
    k = r.randint(2, 20)
    return f"repeat {n} at {at} x{k}", bytes(b[: at + n]) + bytes(b[at : at + n]) * k + bytes(b[at + n :])


def _mutate_messages(r: random.Random, messages: list[bytes], corpus: list[list[bytes]]) -> tuple[str, bytes]:
    """Valid messages recombined: another stream's schema, batches dropped, repeated or out of order."""
    ms = list(messages)
    op = r.choice(["schema", "drop", "repeat", "shuffle", "foreign", "no-end"])
    other = r.choice(corpus)
    if op == "schema" and other:
        ms[0] = other[0]
    elif op == "drop" and len(ms) > 1:
        del ms[r.randrange(len(ms))]
    elif op == "repeat" and len(ms) > 1:
        i = r.randrange(1, len(ms))
        ms[i:i] = [ms[i]] * r.randint(1, 200)
    elif op == "shuffle":
        r.shuffle(ms)
    elif op == "foreign" and len(other) > 1:
        ms.insert(r.randrange(1, len(ms) + 1), other[r.randrange(1, len(other))])
    return f"messages {op}", b"".join(ms) + (b"" if op == "no-end" else EOS)


_TOKENS = [
    b"NaN", b"Infinity", b"-Infinity", b"1e39", b"-1e39", b"3.4028235e38", b"3.41e38", b"1e308", b"1e309",
    b"-1e400", b"70000", b"65504", b"65520", b"-65520.0", b"9223372036854775807", b"9223372036854775808",
    b"-9223372036854775809", b"123456789012345678901234567890", b"-0", b"-0.0", b"0e0", b"1E-400", b"0.1",
    b"true", b"false", b"null", b'""', b'"x"', b'"\\ud800"', b'"\\udc00\\ud800"', b'"\\u0000"', b'"aGk="',
    b'"***"', b"[]", b"{}", b"[[1,2],[3]]", b"[" * 1100 + b"]" * 1100, b'{"a":' * 1100 + b"1" + b"}" * 1100,
    b"[1e39,1,2,3]", b"[70000,1]", b"[[300,1,2],[0,0,0]]", b"[[true,false,true],[1,2,3]]", b"[1.5,2,3]",
    b"[[0,0,0],[0,0,0.5]]", b"[1,2]", b"[[1,2,3],[4,5,6]]", b"[0,0,0,0]", b"[1e-50,1]", b"[" + b"1," * 3000 + b"1]",
    b'"' + b"x" * 5000 + b'"', b"\xff", b"\xed\xa0\x80",
]  # fmt: skip


def _mutate_json(r: random.Random, doc, flow: str) -> tuple[str, bytes]:
    op = r.choices(["value", "key", "text", "shape", "encoding"], weights=[40, 12, 30, 8, 4])[0]
    if op == "value":
        target = doc[r.randrange(len(doc))] if isinstance(doc, list) and doc else doc
        if isinstance(target, dict) and target:
            key = r.choice(list(target))
            token = r.choice(_TOKENS)
            target[key] = "@@TOKEN@@"
            body = json.dumps(doc).encode().replace(b'"@@TOKEN@@"', token, 1)
            return f"value {key!r} := {token[:40]!r}", body
        op = "text"
    body = json.dumps(doc).encode()
    if op == "key":
        target = doc[r.randrange(len(doc))] if isinstance(doc, list) and doc else doc
        if isinstance(target, dict):
            what = r.choice(["drop", "extra", "qid", "pos", "dup", "rename"])
            if what == "drop" and target:
                del target[r.choice(list(target))]
            elif what == "extra":
                target["zz"] = 1
            elif what == "qid":
                target["qid"] = 5
            elif what == "pos":
                target["#pos"] = 0
            elif what == "rename" and target:
                k = r.choice(list(target))
                target[k + "\u00e9"] = target.pop(k)
            body = json.dumps(doc).encode()
            if what == "dup":
                body = body.replace(b"{", b'{"x": "dup", ', 1)
            return f"key {what}", body
        op = "text"
    if op == "shape":
        wrapped = r.choice([[doc], [[doc]], {"rows": doc}, 1, "x", None, [], [doc] * r.randint(2, 50)])
        return "shape", json.dumps(wrapped).encode()
    if op == "encoding":
        enc = r.choice(["utf-16", "utf-32", "utf-8-sig", "latin-1"])
        return f"encoding {enc}", json.dumps(doc, ensure_ascii=False).encode(enc, errors="replace")
    what = r.random()
    if what < 0.4:
        at = r.randrange(len(body) + 1)
        token = r.choice(_TOKENS)
        return f"insert {token[:20]!r} at {at}", body[:at] + token + body[at:]
    description, mutated = _mutate_bytes(r, body, [body])
    return f"text {description}", mutated


# -- cases ----------------------------------------------------------------------------------------

_CORPUS = None


def _corpus():
    global _CORPUS
    if _CORPUS is None:
        arrow = _arrow_corpus()
        _CORPUS = (arrow, [_messages(b) for _, b in arrow], [b for _, b in arrow])
    return _CORPUS


def make_case(seed: int, index: int) -> tuple[str, str, str, bytes]:
    """Case ``index`` of a run: (what it is, the flow, the Content-Type, the body)."""
    r = random.Random(seed * 1_000_003 + index)
    flow = r.choice(FLOWS)
    if r.random() < 0.55:
        arrow, messages, bodies = _corpus()
        i = r.randrange(len(arrow))
        label, body = arrow[i]
        if r.random() < 0.04:
            return f"arrow {label} as it is", flow, ARROW, body
        steps = []
        if r.random() < 0.15:
            what, body = _mutate_messages(r, messages[i], messages)
            steps.append(what)
        for _ in range(1 if r.random() < 0.7 else r.randint(2, 3)):
            what, body = _mutate_bytes(r, body, bodies)
            steps.append(what)
        return f"arrow {label}: " + "; ".join(steps), flow, ARROW, body
    source = flow if r.random() < 0.85 else r.choice(FLOWS)  # sometimes another flow's rows
    n = r.choice([1, 1, 1, 2, 3, 0])
    doc = _json_doc(_rows(r, source, max(n, 1)), one=n == 1 and r.random() < 0.8)
    if n == 0:
        doc = []
    ctype = r.choice(["application/json", "application/json", "text/json", "", "application/json; charset=utf-8"])
    if r.random() < 0.05:
        return f"json {source} rows as they are", flow, ctype, json.dumps(doc).encode()
    what, body = _mutate_json(r, doc, source)
    if r.random() < 0.2:
        more, body = _mutate_json(r, doc, source) if r.random() < 0.5 else _mutate_bytes(r, body, [body])
        what += "; " + more
    return f"json {source} rows: {what}", flow, ctype, body


_REFUSED = (BadRequestError, DataError)  # what the gateway answers with a 4xx (errors.status_for)


def _table_or_refusal(fn, *args):
    """A Table, or the 4xx exception; anything else raises Failure."""
    try:
        return fn(*args)
    except _REFUSED as e:
        return e
    except Exception as e:
        raise Failure(f"{fn.__name__} raised {type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}") from None


def _general(body: bytes, ctype: str, flow: str):
    """What the gateway makes of a body the general way: parse, the row limit, the Table."""
    schema = SCHEMAS[flow]

    def general():
        rows = parse_body(body, ctype, schema)
        if len(rows) > MAX_ROWS:
            return "too many rows"
        return input_table(flow, rows, np.arange(len(rows), dtype=np.int64), schema)

    return _table_or_refusal(general)


def _check_table(table: Table, flow: str) -> None:
    """A Table as the flow's operators may take it: the flow's schema, a value (and a mask
    entry) per row in every column, and Arrow's full validation of its Arrow form."""
    schema = SCHEMAS[flow]
    if schema is not None and dict(table.schema) != schema:
        raise Failure(f"the Table's schema {dict(table.schema)} is not the flow's {schema}")
    for name, col in table._cols.items():
        t = col.type
        if len(col.values) != len(table) or (col.valid is not None and col.valid.shape != (len(table),)):
            raise Failure(f"column {name!r} has {len(col.values)} values for {len(table)} rows")
        if t.kind == "tensor" and (col.values.shape[1:] != t.shape or col.values.dtype != t.dtype):
            raise Failure(f"column {name!r} of {t} holds {col.values.dtype} values of shape {col.values.shape[1:]}")
    if not any(t.kind == "tensor" and 0 in t.shape for t in table.schema.values()):
        # (Table.to_arrow cannot write a tensor of no values per row: flow/table.py's to fix)
        table.to_arrow().validate(full=True)


def _same(a: Table, b: Table) -> bool:
    return a.columns == b.columns and dict(a.schema) == dict(b.schema) and a.to_arrow().equals(b.to_arrow())


def _check_declared_sizes(body: bytes) -> None:
    """What the gateway reads of a stream before Arrow does (the rows and the bytes
    uncompressed its batches declare) bounds what Arrow then makes of it: the memory it
    allocates is the inflated buffers, and copies of the body's own (aligned, dictionaries
    joined), never more. (Its values are not touched here: reading a stream is safe.)"""
    try:
        rows, inflated = httpcodec.scan_stream(body)[:2]
    except BadRequestError:
        return
    if inflated > httpcodec.ARROW_MAX_INFLATED or not 0 <= rows <= httpcodec.ARROW_MAX_ROWS:
        return  # refused before it is read
    before = pa.total_allocated_bytes()
    try:
        table = pa.ipc.open_stream(body).read_all()
    except Exception:
        return
    grown = pa.total_allocated_bytes() - before
    if grown > inflated + 2 * len(body) + (1 << 16):
        raise Failure(f"reading the stream allocated {grown} bytes; its batches declared {inflated} inflated")
    if table.num_rows != rows and table.num_rows <= httpcodec.ARROW_MAX_ROWS:
        raise Failure(f"the stream has {table.num_rows} rows; its batches declared {rows}")


def run_case(description: str, flow: str, ctype: str, body: bytes) -> str:
    """The case's outcome ("table", "refused ErrorName", "too many rows"); Failure if the
    gateway's functions got it wrong."""
    schema = SCHEMAS[flow]
    if ctype == ARROW:
        _check_declared_sizes(body)
    general = _general(body, ctype, flow)
    if isinstance(general, Table):
        _check_table(general, flow)
    if ctype != ARROW and schema is not None:
        # a relayed body (one JSON object) is read the short way when it can be: the same Table or error
        short = _table_or_refusal(one_row_table, body, ctype, 7, schema)
        if isinstance(short, Table):
            qid0 = _table_or_refusal(lambda: general.with_qid(np.array([7])) if isinstance(general, Table) else general)
            if not (isinstance(qid0, Table) and _same(short, qid0)):
                raise Failure(f"one_row_table made a Table, the general path {general!r}")
        elif isinstance(short, Exception) and (type(short) is not type(general) or str(short) != str(general)):
            raise Failure(f"one_row_table raised {short!r}, the general path {general!r}")
        if jsontensors.eligible(schema):
            # a big body of numbers is read by Arrow's JSON reader: what it takes, exactly as the general path
            try:
                got = jsontensors.read_rows(body, schema)
            except Exception as e:
                raise Failure(f"jsontensors.read_rows raised {type(e).__name__}: {e}") from None
            if got is not None:
                n, cols = got
                table = _table_or_refusal(
                    lambda: check_schema(flow, schema, Table.built(cols, np.arange(n, dtype=np.int64)))
                )
                if not (isinstance(general, Table) and isinstance(table, Table) and _same(table, general)):
                    raise Failure(f"jsontensors.read_rows read {table!r}, the general path {general!r}")
    return (
        "table"
        if isinstance(general, Table)
        else (general if isinstance(general, str) else f"refused {type(general).__name__}")
    )


# -- the child process ----------------------------------------------------------------------------


def _child(seed: int, start: int, stop: int, budget: float, progress: str) -> None:
    import faulthandler

    faulthandler.enable()  # a crash prints where it happened on stderr; the parent names the case
    fd = os.open(progress, os.O_WRONLY)
    end = time.monotonic() + budget
    outcomes: collections.Counter = collections.Counter()
    failures = []
    done = 0
    for index in range(start, stop):
        if time.monotonic() > end:
            break
        os.pwrite(fd, struct.pack("<q", index), 0)
        case = make_case(seed, index)
        try:
            outcomes[run_case(*case).split(":")[0]] += 1
        except Exception as e:
            why = str(e) if isinstance(e, Failure) else f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=-4)}"
            failures.append({"index": index, "case": case[0][:300], "flow": case[1], "failure": why[:1500]})
        done += 1
    print(json.dumps({"done": done, "outcomes": outcomes, "failures": failures[:25]}), flush=True)


def _crash_report(stderr: str) -> str:
    """faulthandler's report of a crash: the error and the Python stack, not the module list."""
    at = stderr.find("Fatal Python error")
    text = stderr[at:] if at >= 0 else stderr
    return text.split("\nExtension modules:")[0][-2500:]


def _run_children(seed: int, cases: int, budget: float, workdir: Path, children: int = 2, max_crashes: int = 5):
    """Run cases [0, cases) in ``children`` processes side by side, each for ``budget``
    seconds. A child that crashes is restarted after the case it crashed on (its
    remaining budget), up to ``max_crashes`` times each, so one run shows several crashes."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    results, crashes = [], []
    running = []

    def start(k: int, first: int, stop: int, seconds: float):
        progress = workdir / f"progress-{k}-{first}"
        progress.write_bytes(struct.pack("<q", first))
        cmd = [sys.executable, "-m", "tests.executors.test_body_fuzz", "--child", str(seed), str(first), str(stop)]
        cmd += [f"{seconds:.2f}", str(progress)]
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        running.append((k, proc, progress, stop, time.monotonic() + seconds, 0))

    per = cases // children
    for k in range(children):
        start(k, k * per, (k + 1) * per, budget)
    while running:
        k, proc, progress, stop, end, crashed = running.pop(0)
        out, err = proc.communicate(timeout=budget + 120)
        if proc.returncode == 0:
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
            continue
        (index,) = struct.unpack("<q", progress.read_bytes())
        description, flow, ctype, body = make_case(seed, index)
        crashes.append(
            {
                "seed": seed,
                "index": index,
                "returncode": proc.returncode,
                "case": description,
                "flow": flow,
                "body": f"{len(body)} bytes, {body[:64].hex()}...",
                "stderr": _crash_report(err.decode(errors="replace")),
            }
        )
        left = end - time.monotonic()
        if crashed + 1 < max_crashes and left > 1 and index + 1 < stop:
            start(k, index + 1, stop, left)
            running[-1] = running[-1][:5] + (crashed + 1,)
    return results, crashes


def test_mutated_bodies_become_valid_tables_or_4xx_and_never_crash(tmp_path):
    """Thousands of mutated Arrow streams and JSON bodies (bit flips, boundary integers
    over lengths and offsets, truncations, splices, recombined messages, nasty JSON
    tokens, wrong keys and encodings) through the gateway's parsing in child processes:
    each is a Table that validates or a 4xx error, never another exception or a crash."""
    t0 = time.monotonic()
    results, crashes = _run_children(SEED, CASES, CHILD_BUDGET_S, tmp_path)
    elapsed = time.monotonic() - t0
    done = sum(r["done"] for r in results)
    outcomes = collections.Counter()
    for r in results:
        outcomes.update(r["outcomes"])
    failures = [f for r in results for f in r["failures"]]
    report = json.dumps({"crashes": crashes, "failures": failures[:10]}, indent=1, ensure_ascii=False)
    assert not crashes, (
        f"the gateway's parsing crashed (run one case: python -m {__name__} --case SEED INDEX):\n{report}"
    )
    assert not failures, f"{len(failures)} cases were neither a valid Table nor a 4xx:\n{report}"
    print(f"fuzz: {done} cases in {elapsed:.1f} s: {dict(outcomes)}")
    assert done >= MIN_CASES, (done, elapsed)
    # both sides of the line were reached: bodies read and bodies refused, Arrow's and JSON's errors
    assert outcomes["table"] > done // 50 and outcomes["refused BadRequestError"] > done // 10, outcomes
    assert outcomes["refused DataTypeError"] > done // 50 and outcomes["refused SchemaError"] > done // 100, outcomes


def test_the_corpus_reaches_the_features_it_claims():
    """Each valid stream of the corpus is read as its label says: the client's bodies
    become Tables, the unsupported types are refused by name, the bombs are refused."""
    outcomes = {}
    for label, body in _corpus()[0]:
        flow = label.split("-")[0]
        flow = flow if flow in SCHEMAS and label not in ("tensors-fsl", "tabular-dict-deltas") else "free"
        outcomes[label] = run_case(label, flow, ARROW, body)
    for label in ("tabular-plain", "tabular-dict", "tabular-dict-deltas", "tabular-lz4", "tabular-zstd", "tensors-fsl"):
        assert outcomes[label] == "table", (label, outcomes[label])
    for label in ("tensors-lists", "tensors-wide-values", "tabular-many-batches", "zstd-tensors", "tabular-views"):
        assert outcomes[label] == "table", (label, outcomes[label])
    for label in ("struct", "map", "dense-union", "sparse-union", "timestamp", "decimal", "run-end", "list-view"):
        assert outcomes[label] == "refused DataTypeError", (label, outcomes[label])
    for label in ("tensors-overflowing", "tensors-floats-for-uint8", "tensors-bools", "ext-json"):
        assert outcomes[label] == "refused DataTypeError", (label, outcomes[label])
    for label in ('ext-tensor-{"shape":[5]}', "ext-tensor-not json"):
        assert outcomes[label] == "refused BadRequestError", (label, outcomes[label])


# -- over real HTTP -------------------------------------------------------------------------------


def echo_rows(row):
    """One number per row from all of its columns, so a row read wrong answers wrong."""
    total = 0.0
    for name in row.keys():
        v = row[name]
        if isinstance(v, (bool, np.bool_)) or v is None:
            continue
        if isinstance(v, (int, float, np.integer, np.floating)):
            total += float(v)
        elif isinstance(v, np.ndarray):
            total += float(v.astype(np.float64).sum())
        elif isinstance(v, (str, bytes)):
            total += len(v)
    return total


@pytest.fixture(scope="module")
def served():
    """A cluster of its own (its gateway's pid is checked) with a flow per schema; bodies
    up to 4 MiB, so an Arrow body of 1 MiB or more is read into shared memory as it arrives."""
    config = ClusterConfig(executors=1, request_timeout_s=20, max_body_bytes=4 << 20)
    with LocalCluster(config) as c:
        flows = {}
        for name, schema in SCHEMAS.items():
            f = Flow(f"fuzz-{name}", schema=schema) if schema else Flow(f"fuzz-{name}")
            f.map(echo_rows, names=["y"])
            c.deploy(f)
            flows[name] = f
        yield c, flows


def _gateway(c) -> tuple:
    health = c.http.get("/healthz", timeout=10)
    assert health.status_code == 200, health.text
    gateway = health.json().get("gateway") or {}
    return gateway.get("pid", c.state.get("pid")), gateway.get("restarts", 0)


def _check_good_requests(c, flows) -> None:
    r = random.Random(1)
    for name, f in flows.items():
        rows = _rows(r, name, 2)
        want = [float(v) for v in f.run(rows)["y"]]
        for body, ctype in (
            (json.dumps(_json_doc(rows[:1], one=True)).encode(), "application/json"),  # relayed when one stage
            (json.dumps(_json_doc(rows, one=False)).encode(), "application/json"),
            (_stream(_as_call(rows)), ARROW),
        ):
            got = c.http.post(f"/flows/fuzz-{name}", content=body, headers={"content-type": ctype}, timeout=30)
            assert got.status_code == 200, (name, ctype, got.text[:300])
            ys = [row["y"] for row in got.json()["rows"]]
            assert ys == pytest.approx(want[: len(ys)]), (name, ctype, ys, want)


def _big_arrow_bodies() -> list[tuple[str, bytes]]:
    """Arrow bodies over 1 MiB (read into a shared segment as they arrive): strings, whose
    offsets a mutation can point anywhere, beside a float32 tensor."""
    n = 20_000
    strings = pa.array([f"row {i} " + "x" * (i % 50) for i in range(n)])
    tensor = Table.from_dict({"t": np.ones((n, 16), np.float32)}).to_arrow().column("t")
    body = _stream(pa.table({"s": strings, "t": tensor}))
    assert len(body) > 1 << 20
    r = random.Random(SEED + 1)
    out = []
    for _ in range(30):
        b = bytearray(body)
        values = np.frombuffer(body[: len(body) // 4 * 4], "<i4")
        start = int(np.flatnonzero(values == 0)[0])  # somewhere in the offsets of "s"
        at = (start + r.randrange(n)) * 4 if r.random() < 0.7 else r.randrange(0, 600, 4)
        v = r.choice((2**31 - 1, 2**30, -1, 1 << 24, 7))
        b[at : at + 4] = struct.pack("<i", v)
        out.append((f"big: int32 {v} at {at}", bytes(b)))
    return out


def test_mutated_bodies_over_http_get_4xx_and_the_gateway_lives_on(served):
    """A few hundred mutated bodies at a real cluster: every answer is a 4xx with a JSON
    error (or a 200 when the mutation left a valid body, with a row per row read); after
    each batch the gateway is the same process, /healthz answers and good requests get
    the right rows. Big Arrow bodies take the shared-memory path."""
    c, flows = served
    relayed = c.http.get("/flows/fuzz-tabular").json()["relay_stage"]
    assert relayed is not None  # one JSON row for it goes to the executor unparsed
    pid, restarts = _gateway(c)
    _check_good_requests(c, flows)
    cases = [make_case(SEED + 7, i) for i in range(360)]
    cases += [(what, "free", ARROW, body) for what, body in _big_arrow_bodies()]
    statuses = collections.Counter()
    for batch in range(0, len(cases), 60):
        for description, flow, ctype, body in cases[batch : batch + 60]:
            try:
                got = c.http.post(f"/flows/fuzz-{flow}", content=body, headers={"content-type": ctype}, timeout=30)
            except httpx.HTTPError as e:
                pytest.fail(f"{description} -> {flow}: the request failed: {e!r}")
            statuses[got.status_code] += 1
            if got.status_code == 200:
                local = _general(body, ctype, flow)
                assert isinstance(local, Table) and len(got.json()["rows"]) == len(local), (description, local)
                continue
            assert 400 <= got.status_code < 500, (description, flow, got.status_code, got.text[:300])
            error = got.json()
            assert set(error) >= {"error", "message"} and "Traceback" not in error["message"], (description, error)
        assert _gateway(c) == (pid, restarts), "the gateway restarted"
        _check_good_requests(c, flows)
    print(f"over HTTP: {len(cases)} bodies: {dict(statuses)}")
    assert statuses[400] > len(cases) // 3 and statuses[200] > 0, statuses


def _main(argv: list[str]) -> None:
    if argv[0] == "--child":
        _child(int(argv[1]), int(argv[2]), int(argv[3]), float(argv[4]), argv[5])
    elif argv[0] == "--case":  # one case, in this process: a crash shows here
        case = make_case(int(argv[1]), int(argv[2]))
        print(case[0], "->", case[1], repr(case[2]), f"{len(case[3])} bytes")
        print(run_case(*case))


if __name__ == "__main__":
    _main(sys.argv[1:])
