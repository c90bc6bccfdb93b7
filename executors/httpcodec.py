"""Request bodies to Tables and Tables to response bodies (JSON or Arrow IPC stream).

JSON: a request is one row as an object or any number of rows (also none) as a list of objects; n-d array
columns are nested lists, converted by the flow's schema; bytes columns are base64
strings. Responses are ``{"rows": [...]}`` with every output column and the ``qid``;
NaN and missing values are ``null``. Arrow: ``application/vnd.apache.arrow.stream`` both
ways (the request must not carry a ``qid`` column: the gateway assigns query ids).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import orjson

from flow.exceptions import DataError, DataTypeError, SchemaError
from flow.table import Table
from flow.types import ColumnType
from optimizer.positions import POS

# the runtime's row positions of key-split parts travel in this column (optimizer.positions)
_RESERVED = "{where}column " + repr(POS) + " is reserved by the runtime; rename it in the request"

ARROW = "application/vnd.apache.arrow.stream"
JSON = "application/json"


class BadRequestError(DataError, ValueError):
    """The body is not valid JSON/Arrow, or not rows of the flow's input."""


def parse_body(body: bytes, content_type: str, schema: dict[str, ColumnType] | None):
    """The rows of a request body: a list of row dicts (JSON) or a pyarrow Table."""
    ctype = (content_type or JSON).split(";")[0].strip().lower()
    if ctype == ARROW:
        import pyarrow as pa

        try:
            return pa.ipc.open_stream(body).read_all()
        except (pa.ArrowInvalid, OSError) as e:
            raise BadRequestError(f"body is not an Arrow IPC stream: {e}") from None
    if ctype not in (JSON, "text/json", ""):
        raise BadRequestError(f"unsupported Content-Type {content_type!r}; use {JSON} or {ARROW}")
    doc = _loads(body or b"null")
    rows = [doc] if isinstance(doc, dict) else doc
    if not isinstance(rows, list):  # [] is a request of no rows, as for flow.run and Arrow
        raise BadRequestError("body must be a JSON object (one row) or a list of objects (rows)")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise BadRequestError(f"row {i}: expected a JSON object, got {type(r).__name__}")
        if "qid" in r:
            raise BadRequestError(f"row {i}: 'qid' is assigned by the server; remove it from the request")
        if POS in r:
            raise BadRequestError(_RESERVED.format(where=f"row {i}: "))
    if schema:
        rows = [_convert_row(r, schema, i) for i, r in enumerate(rows)]
    return rows


def _loads(body: bytes):
    """orjson (5x faster than the json module on an image's nested lists of numbers) where it
    reads a body as the json module does; otherwise the json module. orjson turns integers
    beyond 64 bits into floats, which the schema checks could then not refuse; and it
    refuses what json reads (NaN literals, UTF-16/32 bodies), left for those checks too."""
    if body.translate(_DIGITS).find(_LONG_NUMBER) < 0:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequestError(f"body is not valid JSON: {e}") from None


# a run of 20 digits may be an integer beyond 64 bits (found in C: digits -> 1, the rest -> 0)
_DIGITS = bytes(1 if chr(b).isdigit() and b < 128 else 0 for b in range(256))
_LONG_NUMBER = b"\x01" * 20


def _convert_row(row: dict, schema: dict[str, ColumnType], i: int) -> dict:
    out = dict(row)
    for name, t in schema.items():
        if name not in row or row[name] is None:
            continue
        v = row[name]
        if t.kind == "bytes":
            if not isinstance(v, str):
                raise DataTypeError(f"row {i}: column {name!r} should be bytes as a base64 string, got {type(v).__name__}")
            try:
                out[name] = base64.b64decode(v, validate=True)
            except ValueError:
                raise DataTypeError(f"row {i}: column {name!r} is not valid base64") from None
        elif t.kind == "tensor":
            try:
                arr = np.asarray(v, dtype=t.dtype)
            except (ValueError, TypeError):
                raise DataTypeError(f"row {i}: column {name!r} should be {t} (nested lists of numbers)") from None
            if arr.shape != t.shape:
                raise DataTypeError(f"row {i}: column {name!r} should have shape {t.shape}, got {arr.shape}")
            out[name] = arr
        elif t.kind == "float" and isinstance(v, int) and not isinstance(v, bool):
            out[name] = float(v)
    return out


def to_table(rows, qids: np.ndarray, schema) -> Table:
    """The input Table for parsed rows with the gateway's qids (schema errors name the column)."""
    if type(rows).__module__.startswith("pyarrow"):
        if "qid" in rows.column_names:
            raise SchemaError("column 'qid' is assigned by the server; remove it from the request")
        if POS in rows.column_names:
            raise SchemaError(_RESERVED.format(where=""))
        return Table.from_arrow(rows, qid=qids, schema=schema)
    return Table.from_pylist(rows, qid=qids, schema=schema)


def json_rows(table: Table) -> bytes:
    """``{"rows": [...]}`` for a result Table (NaN and infinities become ``null``)."""
    return orjson.dumps({"rows": table.to_pylist()}, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)


def arrow_bytes(table: Table) -> bytes:
    import pyarrow as pa

    t = table.to_arrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def _json_default(v: Any):
    """What orjson does not write itself: bytes (base64), and the numpy arrays it leaves
    to us (not C-contiguous, or of a dtype it does not know)."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"cannot send a {type(v).__name__} as JSON")
