"""A JSON body of rows of numbers (tensors, ints, floats), read by Arrow's JSON reader
outside the GIL.

An image sent as nested lists (224x224x3 uint8: 640 KB of JSON) cost the gateway 22 ms of
interpreter time to parse: orjson's Python objects, then numpy's walk over them. The
gateway parses a big body on a worker thread, but both hold the GIL, so its event loop
waited as long, and so did every other request (a small flow's p99 went from 0.4 to 38
ms beside 20 such images a second; benchmarks/README.md, "Small requests beside big ones"). Arrow's reader
builds flat arrays from the same bytes with the GIL released. A batch of tabular rows is
the same story (1,000 rows of 20 floats: 34 ms of GIL the general way).

``read_rows`` takes only bodies it reads exactly as the general path (bodies.parse_body
and input_table) does: one object, or a list of objects, each with the schema's columns
as keys, each once; values that are numbers, brackets and commas only (no literal, no
string, no escape: JSON's NaN/Infinity, booleans and nulls never reach Arrow, whose
reader would take the first two); nested lists as regular as the column's shape;
integers for integer columns within the dtype's range, and for float columns numbers
that a double holds exactly when they are integers (and no integer -0 there: the general
path makes it 0.0, Arrow -0.0) and that the column's dtype holds without overflowing to an
infinity (the general path refuses 70000 as float16). For anything else it returns None
and the general path reads the body and names what is wrong.
tests/executors/test_jsontensors.py compares them.
"""

from __future__ import annotations

import collections
import io
import re
import threading

import numpy as np

from executors.codec.bodies import _bounds
from flow.table import Column, built_column
from flow.types import ColumnType

# from this size the gateway reads such a body this way, on a worker thread (below it the
# body is relayed to the flow's executor, or parsed on the loop in under ~2 ms)
MIN_BYTES = 64 * 1024
# what a body of numbers may hold besides its keys' own characters
_ALLOWED = b'0123456789-+.eE,[]{}: \t\r\n"'
_KEY = re.compile(rb'"([^"]*)"')
_SPACE = b" \t\r\n"
_ROW_GAP = re.compile(rb"\}\s*,\s*\{")
_EXACT = float(2**53)  # integers a double holds exactly: the general path reads ints as int64
# the integer -0, which the general path reads as 0 (an int) and Arrow as -0.0 in a float column
_MINUS_ZERO_INT = re.compile(rb"-0(?![.\deE])")


_loading = threading.Lock()


def preload(schema: dict[str, ColumnType] | None) -> None:
    """For a flow whose rows hold tensors (images: the big JSON bodies), load Arrow's JSON
    reader on a thread of its own, once per process: its first read costs ~0.25 s more
    than the next (11 ms for an image). Other flows load it on their first big body, so a
    gateway that never gets one never holds it (~30 MB)."""
    if eligible(schema) and any(t.kind == "tensor" for t in schema.values()) and _loading.acquire(blocking=False):
        # the lock is never released: one loader per process
        tiny = {"w": ColumnType.tensor(np.uint8, (2,))}
        threading.Thread(target=read_rows, args=(b'{"w": [1, 2]}', tiny), name="json-reader-load", daemon=True).start()


def eligible(schema: dict[str, ColumnType] | None) -> bool:
    """Whether bodies of this schema can take the short way: columns of numbers (int and
    float scalars, tensors of numbers)."""
    return bool(schema) and all(
        t.kind in ("int", "float") or (t.kind == "tensor" and t.dtype.kind in "iuf" and t.shape and all(t.shape))
        for t in schema.values()
    )


def read_rows(body: bytes, schema: dict[str, ColumnType]) -> tuple[int, dict[str, Column]] | None:
    """(rows, the columns) of a body that is one row (an object) or rows (a list of
    objects), or None: see the module's text."""
    import pyarrow as pa
    import pyarrow.json as pj

    body = bytes(body).strip(_SPACE)  # a bytearray (a body read in pieces) copied once: its keys must hash
    n = body.count(b"{")
    if n == 0 or b"\\" in body or body.count(b'"') != 2 * len(schema) * n:
        return None
    keys = _KEY.findall(body)
    if collections.Counter(keys) != {k.encode("latin-1"): n for k in schema}:
        return None
    # nothing but numbers and structure between the keys: no literal, no other string
    if body.translate(None, _ALLOWED) != b"".join(keys).translate(None, _ALLOWED):
        return None
    if any(t.dtype.kind == "f" for t in schema.values()) and b"-0" in body and _MINUS_ZERO_INT.search(body):
        return None
    if body[:1] == b"[":  # rows: one object a line, as Arrow's reader takes them (braces are only objects' here)
        if body[-1:] != b"]":
            return None
        body, gaps = _ROW_GAP.subn(b"}\n{", body[1:-1])
        if gaps != n - 1:  # objects side by side without a comma: Arrow's reader would take them
            return None
    elif n != 1:
        return None
    fields = []
    for name, t in schema.items():
        typ = pa.int64() if t.dtype.kind in "iu" else pa.float64()
        for _ in t.shape:
            typ = pa.list_(typ)
        fields.append((name, typ))
    try:
        table = pj.read_json(
            io.BytesIO(body),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(body) + 1),
            parse_options=pj.ParseOptions(
                explicit_schema=pa.schema(fields), newlines_in_values=True, unexpected_field_behavior="error"
            ),
        )
    except (pa.ArrowInvalid, ValueError):
        return None
    if table.num_rows != n:
        return None
    out = {}
    for name, t in schema.items():
        values = _values(table.column(name).combine_chunks(), t, n)
        if values is None:
            return None
        out[name] = built_column(t, values, None)
    return n, out


def _values(arr, t: ColumnType, n: int) -> np.ndarray | None:
    """The ``n`` rows' values as one (n, *shape) array (shape () for a scalar column), as
    the general path makes them; None if it would refuse them or read them otherwise
    (nulls, ragged lists, a wrong shape, values out of range)."""
    for size in t.shape:
        if arr.null_count or not np.all(np.diff(arr.offsets.to_numpy()) == size):
            return None
        arr = arr.flatten()
    if arr.null_count:
        return None
    values = arr.to_numpy(zero_copy_only=False)
    if values.size != n * int(np.prod(t.shape)):
        return None
    if t.dtype.kind in "iu":
        low, high = _bounds(t.dtype)  # the general path's own range check
        if values.min() < low or values.max() > high:
            return None
    elif not np.all(np.abs(values) < _EXACT):  # a long integer token: the general path reads it as int64 first
        return None
    elif t.dtype.kind == "f" and float(np.finfo(t.dtype).max) < _EXACT:
        # a finite number beyond a narrow float's range (70000 as float16) would be an
        # infinity: the general path refuses it (float32 holds every value below _EXACT)
        with np.errstate(over="ignore"):
            out = values.astype(t.dtype)
        return None if np.isinf(out).any() else out.reshape((n, *t.shape))
    return values.astype(t.dtype, copy=False).reshape((n, *t.shape))
