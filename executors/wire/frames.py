"""The executor-to-executor wire format: a small JSON header plus raw column buffers.

A message is a list of frames (transport.py): ``[header, buf0, buf1, ...]``. The header is JSON
(never pickle: frames may come from the network) and describes each Table it carries as
column metadata pointing at buffer frames. Numeric and tensor columns travel as their raw
numpy bytes and are rebuilt with ``np.frombuffer`` without a copy; str/bytes columns as an
offsets array plus one data buffer (Arrow's layout), so no per-value framing is needed.
Which headers there are, and their keys, is messages.py's business (documented there).

For the small tables of a single request this is cheaper than an Arrow IPC stream: a
one-row Table (float, str, 2x3 tensor) from Table to Table costs about 4x less
(``python -m benchmarks messages``, results/messages.json); and a 10 MB tensor stays a
single zero-copy frame.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from flow.errors import InternalError
from flow.table import Column, Table
from flow.types import ColumnType


class WireError(InternalError, ValueError):
    """A message between FlowServe's processes that does not follow the wire format
    (truncated, wrong kinds, bad sizes, an unknown type or a missing field: the text names
    the message type and the field), a peer that broke the framing, or a control call the
    other end answered with an error or left unanswered (its channel closed). The receiver
    drops the message (or the connection) and logs it."""


def encode_table(table: Table, buffers: list) -> dict:
    """Describe ``table`` and append its buffers to ``buffers``; returns the JSON-able meta."""
    cols = []
    meta = {"n": len(table), "qid": _push(buffers, table.qid), "cols": cols}
    for name in table.columns:
        col = table.column(name)
        kind = col.type.kind
        entry: dict[str, Any] = {"name": name, "type": col.type.to_json()}
        if kind in ("str", "bytes"):
            encoded = [v.encode() if kind == "str" else bytes(v) for v in col.values]
            lengths = np.fromiter((len(v) for v in encoded), dtype=np.int64, count=len(encoded))
            entry["lengths"] = _push(buffers, lengths)
            entry["data"] = _push(buffers, np.frombuffer(b"".join(encoded), dtype=np.uint8))
        elif kind != "null":
            entry["values"] = _push(buffers, col.values)
        if col.valid is not None:
            entry["valid"] = _push(buffers, col.valid)
        cols.append(entry)
    return meta


def _push(buffers: list, arr: np.ndarray) -> int:
    buffers.append(memoryview(np.ascontiguousarray(arr)).cast("B") if arr.size else b"")
    return len(buffers) - 1


def decode_table(meta: dict, frames: list) -> Table:
    """Rebuild a Table from its meta and the message's buffer frames (zero-copy for numbers)."""
    try:
        n = int(meta["n"])
        qid = _array(frames, meta["qid"], np.dtype(np.int64), (n,))
        cols = {}
        for entry in meta["cols"]:
            ctype = _column_type(entry["type"])
            kind = ctype.kind
            valid = _array(frames, entry["valid"], np.dtype(bool), (n,)) if "valid" in entry else None
            if kind in ("str", "bytes"):
                lengths = _array(frames, entry["lengths"], np.dtype(np.int64), (n,))
                data = bytes(_frame(frames, entry["data"]))
                ends = np.cumsum(lengths)
                if n and ends[-1] != len(data):
                    raise WireError(f"column {entry['name']!r}: lengths do not match the data")
                starts = ends - lengths
                values = np.empty(n, dtype=object)
                if kind == "str":
                    values[:] = [data[s:e].decode() for s, e in zip(starts.tolist(), ends.tolist())]
                else:
                    values[:] = [data[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
            elif kind == "null":
                values = np.full(n, None, dtype=object)
            else:
                values = _array(frames, entry["values"], ctype.dtype, (n,) + ctype.shape)
            cols[str(entry["name"])] = Column(ctype, values, valid)
        return Table(cols, qid)
    except WireError:
        raise
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise WireError(f"malformed table in message: {type(e).__name__}: {e}") from None


_TYPES: dict = {}  # column types seen in messages, by their JSON: parsing one costs ~15 us


def _column_type(doc) -> ColumnType:
    if not isinstance(doc, dict):
        raise WireError(f"column type must be an object, got {doc!r}")
    key = (doc.get("kind"), doc.get("dtype"), tuple(doc.get("shape") or ()))
    ctype = _TYPES.get(key)
    if ctype is None:
        ctype = ColumnType.from_json(doc)
        if len(_TYPES) < 4096:  # peers send few distinct types; a hostile one cannot grow this
            _TYPES[key] = ctype
    return ctype


def _frame(frames: list, i: int):
    f = frames[i]
    return f.buffer if hasattr(f, "buffer") else f


def _array(frames: list, i: int, dtype: np.dtype, shape: tuple) -> np.ndarray:
    buf = _frame(frames, i)
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, dtype=dtype)
    arr = np.frombuffer(buf, dtype=dtype)
    if arr.size != count:
        raise WireError(f"buffer {i} holds {arr.size} values of {dtype}, expected {count}")
    return arr.reshape(shape)


def pack(header: dict, tables: dict[str, Table] | None = None) -> list:
    """Frames for a message: the header (with table metas under ``tables``) then buffers."""
    buffers: list = []
    if tables:
        header = dict(header, tables={k: encode_table(t, buffers) for k, t in tables.items()})
    # orjson: about 15x faster than the json module on a run header (every hop of every
    # request writes one); numpy scalars are written as numbers, as json does for float64
    return [orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)] + buffers


def unpack(frames: list) -> tuple[dict, dict[str, Table]]:
    """(header, tables) from a message's frames; WireError if it is malformed."""
    if not frames:
        raise WireError("empty message")
    try:
        header = orjson.loads(_frame(frames, 0))  # reads a memoryview without copying it
    except (ValueError, TypeError) as e:
        raise WireError(f"message header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise WireError("message header must be a JSON object")
    body = frames[1:]
    tables = {k: decode_table(m, body) for k, m in (header.pop("tables", None) or {}).items()}
    return header, tables


def unpack_header(frames: list) -> dict:
    """The header of a message's frames alone (``unpack`` without reading its tables)."""
    if not frames:
        raise WireError("empty message")
    try:
        header = orjson.loads(_frame(frames, 0))
    except (ValueError, TypeError) as e:
        raise WireError(f"message header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise WireError("message header must be a JSON object")
    return header


def pack_copies(headers: list[dict], tables: dict[str, Table] | None) -> list[list]:
    """``pack`` for several messages that carry the same tables (a race's copies): the
    tables are encoded once and their buffers shared by every message's frames."""
    buffers: list = []
    metas = {k: encode_table(t, buffers) for k, t in tables.items()} if tables else None
    return [
        [orjson.dumps(dict(h, tables=metas) if metas else h, option=orjson.OPT_SERIALIZE_NUMPY)] + buffers
        for h in headers
    ]
