"""Request bodies to Tables and Tables to response bodies (JSON or Arrow IPC stream).

JSON: a request is one row as an object or any number of rows (also none) as a list of objects; n-d array
columns are nested lists, converted by the flow's schema; bytes columns are base64
strings. Bodies are read strictly (no NaN/Infinity, no lone surrogates, at most 1024
levels deep). Responses are ``{"rows": [...]}`` with every output column and the ``qid``;
missing values (and NaN in float columns) are ``null``; NaN inside a tensor is refused
(``UnencodableError``: Arrow carries it). Arrow: ``application/vnd.apache.arrow.stream`` both
ways (the request must not carry a ``qid`` column: the gateway assigns query ids).
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import numpy as np
import orjson

from flow.exceptions import DataError, DataTypeError, SchemaError
from flow.table import Table, built_column
from flow.types import ColumnType, build_column
from flow.validation import check_schema
from optimizer.positions import POS

# the runtime's row positions of key-split parts travel in this column (optimizer.positions)
_RESERVED = "{where}column " + repr(POS) + " is reserved by the runtime; rename it in the request"

ARROW = "application/vnd.apache.arrow.stream"
JSON = "application/json"

# The gateway parses bodies above this (and encodes answers above OFF_LOOP_ROWS rows) on a
# worker thread; below it the hop to a thread would cost more than the work it moves. Only
# bodies below it are relayed to an executor unparsed, and only answers below OFF_LOOP_ROWS
# are rendered there (messages.RawInput).
OFF_LOOP_BYTES = 256 * 1024
OFF_LOOP_ROWS = 5_000
# An answer's body goes to the socket in slices of at most this many bytes, the event loop
# serving other requests between them: one write of a 10 MiB answer held it 3-5 ms (the
# copy into the kernel, faulting in the shared pages it is read from); in 1 MiB slices
# the loop's p99 lag beside 25 such answers a second went from 3-5 ms to 0.55-0.75 ms
# (benchmarks/README.md, session 15).
WRITE_SLICE = 1 << 20


class BadRequestError(DataError, ValueError):
    """The body is not valid JSON/Arrow, or not rows of the flow's input."""


def parse_body(body: bytes, content_type: str, schema: dict[str, ColumnType] | None):
    """The rows of a request body: a list of row dicts (JSON) or a pyarrow Table."""
    ctype = _media_type(content_type)
    if ctype == ARROW:
        import pyarrow as pa

        try:
            return pa.ipc.open_stream(body).read_all()
        except (pa.ArrowInvalid, OSError) as e:
            raise BadRequestError(f"body is not an Arrow IPC stream: {e}") from None
    if ctype not in _JSON_TYPES:
        raise BadRequestError(f"unsupported Content-Type {content_type!r}; use {JSON} or {ARROW}")
    if schema and len(body) > CHUNKED_JSON_BYTES:
        parts = _json_parts(body, schema)
        if parts is not None:
            return parts
    doc = _loads(body or b"null")
    rows = [doc] if isinstance(doc, dict) else doc
    if not isinstance(rows, list):  # [] is a request of no rows, as for flow.run and Arrow
        raise BadRequestError("body must be a JSON object (one row) or a list of objects (rows)")
    _check_rows(rows)
    if schema:
        rows = [_convert_row(r, schema, i) for i, r in enumerate(rows)]
    return rows


_JSON_TYPES = (JSON, "text/json", "")


def _media_type(content_type: str) -> str:
    return (content_type or JSON).split(";")[0].strip().lower()


def is_json(content_type: str) -> bool:
    """Whether a request body of this Content-Type is parsed as JSON (as ``parse_body`` does)."""
    return _media_type(content_type) in _JSON_TYPES


def _check_rows(rows: list, first: int = 0, keys=None) -> None:
    """Each row an object without the server's columns; ``keys``: the columns every row
    must have (a chunk's rows are held to the first chunk's first row)."""
    for i, r in enumerate(rows, first):
        if not isinstance(r, dict):
            raise BadRequestError(f"row {i}: expected a JSON object, got {type(r).__name__}")
        if "qid" in r:
            raise BadRequestError(f"row {i}: 'qid' is assigned by the server; remove it from the request")
        if POS in r:
            raise BadRequestError(_RESERVED.format(where=f"row {i}: "))
        if keys is not None and r.keys() != keys:
            diff = sorted(set(r) ^ set(keys))
            raise SchemaError(f"row {i} has different columns than row 0: {diff}")


# A JSON body above this is read in pieces of about this size, each straight into columns:
# as one list of row dicts a 50 MB body of 1.4 M rows took 700 MB and 6 s to become a Table.
CHUNKED_JSON_BYTES = 1 << 20
CHUNK_BYTES = 512 << 10
MAX_CUT_TRIES = 8  # then the body is read whole (its strings are full of "},{", or it is not JSON)
_ROW_GAP = re.compile(rb"\}\s*,\s*\{")


class JsonParts:
    """A big JSON list of rows, read piece by piece into Tables (no qids yet): what
    ``parse_body`` returns for it instead of a list of row dicts; ``to_table`` joins them."""

    def __init__(self, tables: list[Table]):
        self.tables = tables
        self.rows = sum(len(t) for t in tables)

    def __len__(self) -> int:
        return self.rows


def _json_parts(body: bytes, schema: dict[str, ColumnType]) -> JsonParts | None:
    """The rows of a JSON list, converted a piece (about ``CHUNK_BYTES``) at a time, or None
    when the body is not a plain list of objects that splits cleanly (the whole-body path
    then reads it, and says what is wrong with it).

    Pieces are cut where one object ends and the next begins (``},{``, whitespace allowed).
    A cut that falls inside a string or inside a row leaves the piece before it unbalanced,
    so that piece is not valid JSON: every piece parsing means every cut was between rows."""
    view = memoryview(body)
    start = len(body) - len(body.lstrip())
    end = len(body.rstrip())
    if body[start : start + 1] != b"[" or body[end - 1 : end] != b"]":
        return None
    start, end = start + 1, end - 1
    tables: list[Table] = []
    keys = None
    row = 0
    while start < end:
        cut = _ROW_GAP.search(body, min(start + CHUNK_BYTES, end), end)
        for _ in range(MAX_CUT_TRIES):
            stop = cut.start() + 1 if cut else end
            try:
                rows = _loads(b"".join((b"[", view[start:stop], b"]")))
                break
            except BadRequestError:  # cut inside a string or row: try the next gap
                if cut is None:
                    return None
                cut = _ROW_GAP.search(body, cut.end(), end)
        else:
            return None
        if not isinstance(rows, list):
            return None
        if keys is None and rows and isinstance(rows[0], dict):
            keys = rows[0].keys()
        _check_rows(rows, row, keys)
        # columns straight from the rows (every row has the first row's keys: checked)
        data = {
            n: _convert_column([r[n] for r in rows], schema[n], n, row) if n in schema else [r[n] for r in rows]
            for n in (keys or ())
        }
        tables.append(Table.from_dict(data, schema=schema) if rows else Table.from_pylist([], schema=schema))
        row += len(rows)
        start = cut.end() - 1 if cut else end
    return JsonParts(tables)


def _loads(body: bytes):
    """The body's JSON, strictly: NaN and Infinity (not JSON) and lone surrogates (not
    Unicode) are refused naming the column, and so is nesting deeper than 1024 levels.

    orjson (5x faster than the json module on an image's nested lists of numbers) reads
    every body it can; it refuses integers beyond 64 bits (it would turn them into floats,
    which the schema checks could then not refuse), non-finite numbers, lone surrogates and
    UTF-16/32 bodies, which go to the json module with checks that say what was wrong."""
    if body.translate(_DIGITS).find(_LONG_NUMBER) < 0:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            if "depth limit" in str(e):
                raise BadRequestError(f"body is nested deeper than {MAX_DEPTH} levels") from None
    try:
        doc = json.loads(body, parse_constant=_NonFinite, parse_float=_finite_float, object_pairs_hook=_checked)
    except RecursionError:
        raise BadRequestError(f"body is nested deeper than {MAX_DEPTH} levels") from None
    except BadRequestError:
        raise
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequestError(f"body is not valid JSON: {e}") from None
    try:
        _check_value(doc, None)  # what no object held (a bare list or value)
    except RecursionError:
        raise BadRequestError(f"body is nested deeper than {MAX_DEPTH} levels") from None
    return doc


MAX_DEPTH = 1024  # orjson's limit; the json module gets the same answer instead of a RecursionError


class _NonFinite:
    """NaN, Infinity or an overflowing number where a value was expected: not JSON."""

    def __init__(self, text: str):
        self.text = text


def _finite_float(text: str):
    value = float(text)
    return value if value not in (float("inf"), float("-inf")) else _NonFinite(text)


def _checked(pairs: list) -> dict:
    for key, value in pairs:
        _check_value(key, None)
        _check_value(value, key)
    return dict(pairs)


def _check_value(value, column) -> None:
    """Refuse what the json module reads but JSON or Unicode do not have, naming the column."""
    where = f"column {column!r}: " if column is not None else ""
    if isinstance(value, _NonFinite):
        raise BadRequestError(
            f"{where}{value.text} is not a JSON number (NaN and Infinity have no JSON form; "
            f"send null for a missing value)"
        )
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequestError(f"{where}invalid Unicode: a lone surrogate in a string") from None
    elif isinstance(value, list):
        for v in value:
            _check_value(v, column)


# a run of 20 digits may be an integer beyond 64 bits (found in C: digits -> 1, the rest -> 0)
_DIGITS = bytes(1 if chr(b).isdigit() and b < 128 else 0 for b in range(256))
_LONG_NUMBER = b"\x01" * 20


def _convert_row(row: dict, schema: dict[str, ColumnType], i: int) -> dict:
    out = dict(row)
    for name, t in schema.items():
        v = row.get(name)
        if v is not None:
            out[name] = _convert_value(v, t, name, i)
    return out


def _convert_column(values: list, t: ColumnType, name: str, first: int) -> list:
    """A column's JSON values (rows ``first``...) as ``_convert_row`` converts them, in place."""
    if t.kind not in ("bytes", "tensor", "float"):
        return values
    for i, v in enumerate(values):
        if v is not None:
            values[i] = _convert_value(v, t, name, first + i)
    return values


def _convert_value(v, t: ColumnType, name: str, i: int):
    """A JSON value as column ``name`` of type ``t`` holds it: base64 to bytes, nested lists
    to a tensor of its dtype and shape, an integer to a float; type errors name row and column."""
    if t.kind == "bytes":
        if not isinstance(v, str):
            raise DataTypeError(f"row {i}: column {name!r} should be bytes as a base64 string, got {type(v).__name__}")
        try:
            return base64.b64decode(v, validate=True)
        except ValueError:
            raise DataTypeError(f"row {i}: column {name!r} is not valid base64") from None
    if t.kind == "tensor":
        arr = _tensor(v, t, name, i)
        if arr.shape != t.shape:
            raise DataTypeError(f"row {i}: column {name!r} should have shape {t.shape}, got {arr.shape}")
        return arr
    if t.kind == "float" and type(v) is int:
        return float(v)
    return v


def _tensor(value, t: ColumnType, name: str, i: int) -> np.ndarray:
    """A JSON tensor (nested lists) as ``t``'s dtype, as strictly as scalars are typed:
    booleans are not numbers, floats never become integers, integers must fit the dtype."""
    try:
        raw = np.asarray(value)
    except (ValueError, TypeError):
        raise DataTypeError(_tensor_what(t, name, i)) from None
    want = t.dtype.kind
    got = raw.dtype.kind
    if got not in "biuf" or (got == "b") != (want == "b") or (got == "f" and want in "iu"):
        what = _tensor_what(t, name, i)  # built only for an error: formatting a type costs ~10 us
        raise DataTypeError(f"{what}, got {raw.dtype.name} values" if got in "biuf" else what)
    if got in "iu" and want in "iu" and raw.size and raw.dtype != t.dtype:
        low, high = _bounds(t.dtype)
        if raw.min() < low or raw.max() > high:
            raise DataTypeError(f"row {i}: column {name!r}: values out of range for {t.dtype.name} ({low}..{high})")
    return raw.astype(t.dtype, copy=False)


def _tensor_what(t: ColumnType, name: str, i: int) -> str:
    return f"row {i}: column {name!r} should be {t} (nested lists of numbers)"


_BOUNDS: dict = {}


def _bounds(dtype: np.dtype) -> tuple[int, int]:
    """An integer dtype's (min, max) as ints (np.iinfo computes them on each access)."""
    bounds = _BOUNDS.get(dtype)
    if bounds is None:
        info = np.iinfo(dtype)
        bounds = _BOUNDS[dtype] = (int(info.min), int(info.max))
    return bounds


def to_table(rows, qids: np.ndarray, schema) -> Table:
    """The input Table for parsed rows with the gateway's qids (schema errors name the column)."""
    if isinstance(rows, JsonParts):
        if not rows.tables:
            return Table.from_pylist([], qid=qids, schema=schema)
        return Table.concat(rows.tables).with_qid(qids)
    if type(rows).__module__.startswith("pyarrow"):
        if "qid" in rows.column_names:
            raise SchemaError("column 'qid' is assigned by the server; remove it from the request")
        if POS in rows.column_names:
            raise SchemaError(_RESERVED.format(where=""))
        return Table.from_arrow(rows, qid=qids, schema=schema)
    return Table.from_pylist(rows, qid=qids, schema=schema)


class UnencodableError(ValueError):
    """An answer JSON cannot carry (the client may ask for Arrow instead)."""


def one_row_table(body, content_type: str, qid: int, schema) -> Table | None:
    """The Table ``parse_body`` and ``input_table`` make of a one-row JSON body (a relayed
    request: an image model's, a tabular model's row), built the short way: no row dicts,
    no Table of the row's own column order to re-check and reorder.

    It calls what the general path calls, in the same order: first ``_convert_value`` on
    every value in schema order (the general path converts the whole row before it builds
    a column, so a conversion's error is the same error), then each column's builder
    (``types.build_column``; a tensor's array is its column as it is). None, for the
    general path to read and say what is wrong, when the body is anything else (a list,
    other or missing columns, a null) or a column does not build as the schema's type.
    tests/executors/test_httpcodec.py compares the two on random bodies."""
    if not schema or len(body) > CHUNKED_JSON_BYTES or _media_type(content_type) not in _JSON_TYPES:
        return None
    if "qid" in schema or POS in schema:  # the server's columns: _check_rows' errors
        return None
    doc = _loads(body or b"null")
    if type(doc) is not dict or doc.keys() != schema.keys():
        return None
    values = []
    for name, t in schema.items():
        value = doc[name]
        if value is None:
            return None
        values.append(_convert_value(value, t, name, 0))  # the general path's value, or its error
    cols = {}
    for (name, t), value in zip(schema.items(), values):
        if t.kind == "tensor":  # a fresh array of t's dtype and shape
            cols[name] = built_column(t, value[None], None)
            continue
        try:
            ctype, arr, valid = build_column([value], name, t)
        except (DataError, ValueError, TypeError):
            return None  # the general path builds in the body's column order: its error is its own
        if ctype != t:
            return None  # a cast, or a type error: check_schema's to decide
        cols[name] = built_column(ctype, arr, valid)
    return Table.built(cols, np.array([qid], dtype=np.int64))


def input_table(name: str, rows, qids: np.ndarray, schema) -> Table:
    """The request's Table with the gateway's qids, checked against flow ``name``'s schema
    (the gateway's for a parsed body; an executor's for a body relayed as it came)."""
    table = to_table(rows, qids, schema)
    return table if schema is None else check_schema(name, schema, table)


def json_rows(table: Table) -> bytes:
    """``{"rows": [...]}`` for a result Table. In scalar float columns NaN is a missing
    value and is ``null`` (as are infinities); inside a tensor NaN and infinity are values,
    which JSON has no form for: ``UnencodableError`` names the column."""
    return b"".join(json_pieces(table))


def json_pieces(table: Table):
    """``json_rows``' bytes a piece (``JSON_CHUNK_ROWS`` rows) at a time, for a big answer
    to be sent as it is written: its rows never all exist as dicts, nor its JSON at once.
    Checked before the first piece: a tensor's NaN (``UnencodableError``)."""
    for name, ctype in table.schema.items():
        if ctype.kind == "tensor" and ctype.dtype.kind in "fc":
            values = _present(table[name])
            if values.size and not np.isfinite(values).all():
                raise UnencodableError(
                    f"tensor column {name!r} holds NaN or infinity, which JSON cannot carry; "
                    f"ask for Arrow (Accept: {ARROW})"
                )
    if len(table) <= JSON_CHUNK_ROWS:
        yield orjson.dumps({"rows": table.to_pylist()}, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)
        return
    n = len(table)
    for a in range(0, n, JSON_CHUNK_ROWS):
        b = min(a + JSON_CHUNK_ROWS, n)
        rows = orjson.dumps(table.take(np.arange(a, b)).to_pylist(), default=_json_default, option=_NUMPY)
        yield (b'{"rows":[' if a == 0 else b",") + rows[1:-1] + (b"]}" if b == n else b"")


_NUMPY = orjson.OPT_SERIALIZE_NUMPY
JSON_CHUNK_ROWS = 20_000


def _present(values: np.ndarray) -> np.ndarray:
    """A tensor column's values without its missing rows (an object array holds None there)."""
    if values.dtype != object:
        return values
    rows = [v for v in values if v is not None]
    return np.stack(rows) if rows else np.zeros(0)


def arrow_bytes(table: Table) -> bytes:
    """The Arrow IPC stream of ``table``."""
    return b"".join(arrow_pieces(table))


def arrow_pieces(table: Table, rows_per_batch: int = 256 * 1024):
    """``arrow_bytes`` a record batch at a time, for a big answer to be sent as it is
    written: what the IPC writer wrote so far is handed out after each batch (the schema
    message with the first, the end-of-stream marker with the last)."""
    import pyarrow as pa

    t = table.to_arrow()
    written = _Collected()
    with pa.ipc.new_stream(pa.PythonFile(written, mode="w"), t.schema) as w:
        for batch in t.to_batches(max_chunksize=rows_per_batch):
            w.write_batch(batch)
            yield written.take()
    yield written.take()


def arrow_answer(table: Table, big: int = 64 * 1024) -> bytes | list:
    """``arrow_bytes`` without copying the answer's big buffers: the IPC stream as a list
    of pieces in which each buffer of ``big`` bytes or more is a view of the answer's own
    column (a column in a shared-memory segment goes to the socket straight from there),
    the small ones joined between them; plain bytes when no buffer is big. The IPC writer
    hands its body buffers to the file as Arrow buffers, so keeping them is enough (the
    join of a 10 MiB answer cost three copies, 5-7 ms, on the event loop)."""
    import pyarrow as pa

    t = table.to_arrow()
    out = _Pieces(big)
    with pa.ipc.new_stream(pa.PythonFile(out, mode="w"), t.schema) as w:
        for batch in t.to_batches():
            w.write_batch(batch)
    return out.result()


class _Pieces:
    """A write-only file that keeps big writes as views and joins the small ones."""

    closed = False

    def __init__(self, big: int):
        self.big, self.pieces, self.small = big, [], []

    def write(self, data) -> int:
        view = memoryview(data)
        if view.nbytes >= self.big:
            if self.small:
                self.pieces.append(b"".join(self.small))
                self.small = []
            self.pieces.append(view.cast("B"))
        else:
            self.small.append(bytes(view))
        return view.nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def result(self) -> bytes | list:
        tail = b"".join(self.small)
        if not self.pieces:
            return tail
        return [*self.pieces, tail] if tail else self.pieces


class _Collected:
    """A write-only file that keeps what is written until ``take()``."""

    closed = False

    def __init__(self):
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


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
