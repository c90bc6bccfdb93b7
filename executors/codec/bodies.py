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
import math
import re
import struct
from typing import Any

import numpy as np
import orjson

from executors.errors import BadRequestError, RequestTooLargeError  # the client raises these for 4xx too
from flow.errors import DataError, DataTypeError, SchemaError
from flow.table import Column, Table, built_column
from flow.types import ColumnType, build_column, check_fits, int_bounds, tensor_value
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
# (benchmarks/README.md, "Small requests beside big ones").
WRITE_SLICE = 1 << 20


def parse_body(body: bytes, content_type: str, schema: dict[str, ColumnType] | None, max_inflated: int | None = None):
    """The rows of a request body: a list of row dicts (JSON) or a pyarrow Table (validated:
    ``arrow_table``; ``max_inflated`` bounds a compressed one's size uncompressed)."""
    ctype = _media_type(content_type)
    max_table = TABLE_BYTES_PER_BODY_BYTE * (ARROW_MAX_INFLATED if max_inflated is None else max_inflated)
    if ctype == ARROW:
        table = arrow_table(body, max_inflated)
        check_table_bytes(table.num_rows, schema, max_table)
        return table
    if ctype not in _JSON_TYPES:
        raise BadRequestError(f"unsupported Content-Type {content_type!r}; use {JSON} or {ARROW}")
    if schema and len(body) > CHUNKED_JSON_BYTES:
        parts = _json_parts(body, schema, max_table)
        if parts is not None:
            return parts
    doc = _loads(body or b"null")
    rows = [doc] if isinstance(doc, dict) else doc
    if not isinstance(rows, list):  # [] is a request of no rows, as for flow.run and Arrow
        raise BadRequestError("body must be a JSON object (one row) or a list of objects (rows)")
    _check_rows(rows)
    check_table_bytes(len(rows), schema, max_table)
    if schema:
        bools = may_hold_bool(body)
        rows = [_convert_row(r, schema, i, bools) for i, r in enumerate(rows)]
    return rows


def arrow_table(body, max_inflated: int | None = None) -> Any:
    """The pyarrow Table of an Arrow IPC stream body, fully validated before any of its
    values is touched, its columns all of types a Table takes (``BadRequestError`` or
    ``DataTypeError`` naming the column otherwise).

    The IPC reader checks the messages' structure and that each buffer lies within the
    body, not what the buffers say: a string column whose offsets point past its data
    reads fine, and touching its values then reads (or crashes on) memory outside the
    body. ``validate(full=True)`` checks every offset, length, buffer size, null count,
    dictionary index and UTF-8 string (arrow's own fuzz targets read IPC streams the same
    way: read, then validate fully). It costs what it checks: nothing per value for
    fixed-width columns (a 10 MiB float32 tensor: 0.2 us), a pass over the offsets of
    lists and strings, and the UTF-8 check of strings (~0.6 ms for 10 MiB).

    A compressed stream (Arrow's own LZ4/ZSTD buffer compression) is refused before it is
    read if its buffers declare more than ``max_inflated`` bytes (``ARROW_MAX_INFLATED``)
    uncompressed: 6 KB of ZSTD declare (and become) 200 MB of zeros."""
    import pyarrow as pa

    if max_inflated is None:
        max_inflated = ARROW_MAX_INFLATED

    rows, inflated, _data = scan_stream(body)
    if rows > ARROW_MAX_ROWS or rows < 0:
        raise BadRequestError(f"body is an Arrow IPC stream of {rows} rows, over the limit of {ARROW_MAX_ROWS}")
    if inflated > max_inflated:
        raise BadRequestError(
            f"body is a compressed Arrow IPC stream of {inflated} bytes uncompressed, over the limit "
            f"of {max_inflated}; send fewer rows a request"
        )
    try:
        table = pa.ipc.open_stream(body).read_all()
    except (pa.ArrowException, OSError, ValueError) as e:  # UnicodeDecodeError (a name) is a ValueError
        raise BadRequestError(f"body is not an Arrow IPC stream: {e}") from None
    try:
        names = table.schema.names
    except ValueError:
        raise BadRequestError("body is not a valid Arrow IPC stream: a column name is not UTF-8") from None
    scalars = _arrow_scalar_ids()
    for name, field in zip(names, table.schema):
        t = field.type
        if t.id not in scalars and t not in _TYPES_TAKEN:  # the common columns need no more
            problem = _arrow_type_problem(t)
            if problem is not None:
                raise DataTypeError(f"column {_quoted(name)}: {problem}")
            if len(_TYPES_TAKEN) < 256:  # a flow's tensor types, not every type a client made up
                _TYPES_TAKEN.add(t)
    try:
        table.validate(full=True)
    except pa.ArrowException as e:
        for i, name in enumerate(names):  # name the column (a table's own error numbers it)
            try:
                table.column(i).validate(full=True)
            except pa.ArrowException as col_error:
                raise BadRequestError(
                    f"body is not a valid Arrow IPC stream: column {_quoted(name)}: {col_error}"
                ) from None
        raise BadRequestError(f"body is not a valid Arrow IPC stream: {e}") from None
    return table


# A compressed Arrow body may declare at most this many bytes uncompressed (the default
# limit on a body's size: a compressed body holds no more than an uncompressed one may).
ARROW_MAX_INFLATED = 64 * 1024 * 1024
# A request's rows may take at most this many times the body limit as columns. A body's
# values take about as much room as columns as they took in the body (an Arrow body's are
# its columns; JSON's text is as long as its numbers or longer, ``{"a":1,"b":2}`` about
# 1.2x), but a missing value takes none there and a whole value in a column (a column of
# nulls is a few bytes of Arrow; 600,000 null rows of a (256, 256) float32 tensor are 146 GiB).
TABLE_BYTES_PER_BODY_BYTE = 4


def check_table_bytes(rows: int, schema: dict[str, ColumnType] | None, limit: int, more: bool = False) -> None:
    """Refuse (``RequestTooLargeError``, 413) ``rows`` rows whose columns, as the flow's
    schema types them, would take more than ``limit`` bytes: estimated before one is built
    (no schema: the body's own values, bounded by its size). ``more``: the body has rows
    after these (read in pieces)."""
    if not schema or not rows:
        return
    per_row = row_table_bytes(schema)
    need = rows * per_row
    if need > limit:
        raise RequestTooLargeError(
            f"the request's {'first ' if more else ''}{rows} rows would take {need / 2**20:,.0f} MiB as columns ({per_row:,} bytes a row), "
            f"over the limit of {limit / 2**20:,.0f} MiB ({TABLE_BYTES_PER_BODY_BYTE}x the body limit); "
            f"send fewer rows a request"
        )


def row_table_bytes(schema: dict[str, ColumnType]) -> int:
    """The bytes one row of ``schema`` takes as columns, whatever its values (``check_table_bytes``)."""
    return 8 + sum(_row_bytes(t) for t in schema.values())  # 8: the qid


def one_row_bytes(body) -> int | None:
    """The data bytes of ``body`` when it is an Arrow IPC stream whose batches declare one
    row in all and no compressed bytes to inflate, as read from its messages' metadata
    (``scan_stream``) without reading the stream: such a body may be relayed to an
    executor, which reads and checks it (``arrow_table``) as the gateway would, under any
    limit on inflated bytes. None for anything else, a broken stream included (the gateway
    reads it and says what is wrong)."""
    try:
        rows, inflated, data = scan_stream(body)
    except BadRequestError:
        return None
    return data if rows == 1 and inflated == 0 else None


def _row_bytes(t: ColumnType) -> int:
    """The bytes one row of a column of type ``t`` takes, whatever its value (strings and
    bytes: their pointer; their text is in the body)."""
    if t.kind == "tensor":
        return t.dtype.itemsize * math.prod(t.shape)  # np.prod costs ~4 us a request
    return t.dtype.itemsize


# An Arrow body may declare at most this many rows (the gateway's max_rows, 1,000,000 by
# default, is checked after): a column of nulls takes no bytes, and Arrow's sum of the
# batches' lengths, in 64 bits, wraps around (four batches of 2**62 rows make a Table of 0).
ARROW_MAX_ROWS = 1 << 32

_I32 = struct.Struct("<i").unpack_from
_U32 = struct.Struct("<I").unpack_from
_U16 = struct.Struct("<H").unpack_from
_I64 = struct.Struct("<q").unpack_from
_U8 = struct.Struct("<B").unpack_from


def scan_stream(body) -> tuple[int, int, int]:
    """(rows, bytes uncompressed, bytes of data) that an Arrow IPC stream's batches declare
    (the last: their bodies' lengths, as sent), read from
    its messages before Arrow reads it: each message's flatbuffer as far as its header
    (Arrow's Message.fbs: a RecordBatch's length, whether it is compressed, its buffers),
    a compressed buffer's size uncompressed from its first 8 bytes. Arrow verifies the
    flatbuffers and the buffers' bounds itself when it reads the stream; this walks the
    messages as its reader does (a length, the metadata, the body), so a message this
    cannot read is one Arrow refuses too."""
    view = memoryview(body)
    end = len(view)
    pos = rows = inflated = data = 0
    try:
        while pos + 4 <= end:
            (size,) = _I32(view, pos)
            pos += 4
            if size == -1:  # the continuation marker before each message's length
                (size,) = _I32(view, pos)
                pos += 4
            if size <= 0:  # 0: the end of the stream; below 0: Arrow refuses it
                break
            root = pos + _U32(view, pos)[0]  # Message
            pos += size
            kind = _fb_scalar(view, root, 1, _U8)  # Message.header_type: 2 DictionaryBatch, 3 RecordBatch
            length = _fb_scalar(view, root, 3, _I64)  # Message.bodyLength
            if kind in (2, 3):
                batch = _fb_table(view, root, 2)  # Message.header
                if batch is not None and kind == 2:
                    batch = _fb_table(view, batch, 1)  # DictionaryBatch.data
                if batch is not None:
                    if kind == 3:
                        rows += _fb_scalar(view, batch, 0, _I64)  # RecordBatch.length
                        data += max(length, 0)
                    if _fb_field(view, batch, 3) is not None:  # RecordBatch.compression
                        inflated += _declared_inflated(view, batch, pos, min(pos + length, end), pos)
            if length < 0 or rows < 0 or rows > ARROW_MAX_ROWS:
                break
            pos += length
    except (struct.error, IndexError, ValueError):
        raise BadRequestError(
            "body is not an Arrow IPC stream: a message's metadata is not a valid flatbuffer"
        ) from None
    return rows, inflated, data


def _declared_inflated(view: memoryview, batch: int, start: int, stop: int, metadata_end: int) -> int:
    """What a compressed batch's buffers (in the body from ``start`` to ``stop``) declare
    they inflate to: the int64 each begins with (-1: left uncompressed, its bytes after
    those 8). The buffer list lies in the metadata (before ``metadata_end``), as Arrow's
    verifier requires: a list longer than that is refused, not walked."""
    buffers = _fb_table(view, batch, 2)  # RecordBatch.buffers: [Buffer {offset: long, length: long}]
    if buffers is None:
        return 0
    (count,) = _U32(view, buffers)
    if buffers + 4 + 16 * count > metadata_end:
        raise ValueError("a batch's buffer list runs past its metadata")
    spans = np.frombuffer(view, dtype="<i8", count=2 * count, offset=buffers + 4).reshape(count, 2)
    offsets, lengths = spans[:, 0], spans[:, 1]
    spans = spans[(lengths >= 8) & (offsets >= 0) & (offsets <= stop - start - 8)]
    if not len(spans):
        return 0
    raw = np.frombuffer(view, dtype=np.uint8)
    sizes = raw[(start + spans[:, :1]) + np.arange(8)].copy().view("<i8")[:, 0]
    return int(np.where(sizes == -1, spans[:, 1] - 8, np.maximum(sizes, 0)).sum(dtype=object))


def _fb_field(buf: memoryview, table: int, index: int) -> int | None:
    """Where field ``index`` of the flatbuffer table at ``table`` lies, or None if absent."""
    vtable = table - _I32(buf, table)[0]
    if 4 + 2 * index >= _U16(buf, vtable)[0]:
        return None
    at = _U16(buf, vtable + 4 + 2 * index)[0]
    return table + at if at else None


def _fb_scalar(buf: memoryview, table: int, index: int, unpack) -> int:
    """Scalar field ``index`` of a flatbuffer table (0 when absent, its default here)."""
    at = _fb_field(buf, table, index)
    return 0 if at is None else unpack(buf, at)[0]


def _fb_table(buf: memoryview, table: int, index: int) -> int | None:
    """The table or vector field ``index`` of a table points to, or None if absent."""
    at = _fb_field(buf, table, index)
    return None if at is None else at + _U32(buf, at)[0]


def _quoted(name: str) -> str:
    """A column's name for an error message: quoted, a long one cut short."""
    return repr(name) if len(name) <= 100 else repr(name[:100]) + "..."


_ARROW_SUPPORTED = (
    "Arrow columns may be bool, integer, floating point, string, binary, null, dictionaries of "
    "these, and tensors (fixed_shape_tensor, or (nested) lists of numbers or booleans)"
)


_SCALAR_IDS: frozenset = frozenset()
_TYPES_TAKEN: set = set()  # nested and tensor types found good before (3.5 us to check a tensor type)


def _arrow_scalar_ids() -> frozenset:
    """The ids of the Arrow types a Table takes as they are (numbers, strings, binary, null)."""
    global _SCALAR_IDS
    if not _SCALAR_IDS:
        import pyarrow as pa

        types = [pa.bool_(), pa.null(), pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]
        types += [pa.string_view(), pa.binary_view(), pa.binary(1), pa.float16(), pa.float32(), pa.float64()]
        types += [getattr(pa, f"{s}int{n}")() for s in ("", "u") for n in (8, 16, 32, 64)]
        _SCALAR_IDS = frozenset(t.id for t in types)
    return _SCALAR_IDS


def _arrow_type_problem(t) -> str | None:
    """Why a Table cannot take an Arrow column of type ``t`` (None: it can): checked before
    a value is read, so a type the conversion does not know never reaches it."""
    import pyarrow as pa
    import pyarrow.types as pt

    if isinstance(t, pa.FixedShapeTensorType):
        shape = list(t.shape)
        if not _arrow_number(t.value_type):
            return f"a tensor of {t.value_type} is not supported: tensors hold numbers or booleans"
        if not shape or any(d < 0 for d in shape) or int(np.prod(shape)) != t.storage_type.list_size:
            return f"tensor shape {shape} does not match its storage of {t.storage_type.list_size} values"
        if t.permutation is not None and list(t.permutation) != list(range(len(shape))):
            return "a tensor with a permutation of its dimensions is not supported; send it in row-major order"
        return None
    if isinstance(t, pa.BaseExtensionType):
        return f"Arrow extension type {t.extension_name!r} is not supported; {_ARROW_SUPPORTED}"
    if pt.is_dictionary(t):
        value = t.value_type
        if _arrow_scalar(value) and not pt.is_null(value):
            return None
        return f"a dictionary of {value} is not supported; {_ARROW_SUPPORTED}"
    if _arrow_scalar(t):
        return None
    if _arrow_list(t):
        leaf, depth = t, 0
        while _arrow_list(leaf):
            leaf, depth = leaf.value_type, depth + 1
        if _arrow_number(leaf) and depth <= 32:
            return None
        return f"Arrow type {t} is not supported: lists are tensors of numbers or booleans; {_ARROW_SUPPORTED}"
    return f"Arrow type {t} is not supported; {_ARROW_SUPPORTED}"


def _arrow_number(t) -> bool:
    import pyarrow.types as pt

    return pt.is_integer(t) or pt.is_floating(t) or pt.is_boolean(t)


def _arrow_list(t) -> bool:
    import pyarrow.types as pt

    return pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t)


def _arrow_scalar(t) -> bool:
    import pyarrow.types as pt

    return (
        _arrow_number(t)
        or pt.is_null(t)
        or pt.is_string(t)
        or pt.is_large_string(t)
        or pt.is_binary(t)
        or pt.is_large_binary(t)
        or pt.is_fixed_size_binary(t)
        or pt.is_string_view(t)
        or pt.is_binary_view(t)
    )


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


def _json_parts(body: bytes, schema: dict[str, ColumnType], max_table: int) -> JsonParts | None:
    """The rows of a JSON list, converted a piece (about ``CHUNK_BYTES``) at a time, or None
    when the body is not a plain list of objects that splits cleanly (the whole-body path
    then reads it, and says what is wrong with it).

    Pieces are cut where one object ends and the next begins (``},{``, whitespace allowed).
    A cut that falls inside a string or inside a row leaves the piece before it unbalanced,
    so that piece is not valid JSON: every piece parsing means every cut was between rows.
    Before a piece becomes columns, the rows so far are held to ``max_table`` bytes
    (``check_table_bytes``)."""
    view = memoryview(body)
    bools = may_hold_bool(body)
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
        check_table_bytes(row + len(rows), schema, max_table, more=cut is not None)
        # columns straight from the rows (every row has the first row's keys: checked)
        data = {
            n: _convert_column([r[n] for r in rows], schema[n], n, row, bools) if n in schema else [r[n] for r in rows]
            for n in (keys or ())
        }
        try:
            tables.append(Table.from_dict(data, schema=schema) if rows else Table.from_pylist([], schema=schema))
        except DataError:
            raise
        except (ValueError, TypeError) as e:
            raise _named(e, _row_columns(rows, schema)) from None
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
    if type(body) is memoryview:  # a relayed body is a view of the message it came in
        body = bytes(body)
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


# a run of 20 digits may be an integer beyond 64 bits, and so may a minus and 19 digits
# (orjson reads -9223372036854775809 as a float): found in C, digits and "-" -> 1, the rest
# -> 0, in one search (a run that is no such number only takes the slower path)
_DIGITS = bytes(1 if (chr(b).isdigit() and b < 128) or b == ord("-") else 0 for b in range(256))
_LONG_NUMBER = b"\x01" * 20


def _convert_row(row: dict, schema: dict[str, ColumnType], i: int, bools: bool = True) -> dict:
    out = dict(row)
    for name, t in schema.items():
        v = row.get(name)
        if v is not None:
            out[name] = _convert_value(v, t, name, i, bools)
    return out


def _convert_column(values: list, t: ColumnType, name: str, first: int, bools: bool = True) -> list:
    """A column's JSON values (rows ``first``...) as ``_convert_row`` converts them, in place."""
    if t.kind not in ("bytes", "tensor", "float", "int"):
        return values
    for i, v in enumerate(values):
        if v is not None:
            values[i] = _convert_value(v, t, name, first + i, bools)
    return values


def may_hold_bool(body) -> bool:
    """Whether a JSON body may hold a boolean: ``true`` or ``false`` appears in it (in a
    string too, which costs only a closer look). In numpy's array of a nested list a
    boolean among numbers becomes 0 or 1, so a tensor of numbers is searched for one, but
    only in a body that may hold one."""
    data = body if isinstance(body, (bytes, bytearray)) else bytes(body)
    # both words hold an "e": one memchr (0.3 us for a 3 KB image's body) rules most bodies
    # of numbers out before the two word searches (3-9 us there: CPython finds a word more
    # slowly than a byte)
    return b"e" in data and (b"true" in data or b"false" in data)


def _convert_value(v, t: ColumnType, name: str, i: int, bools: bool = True):
    """A JSON value as column ``name`` of type ``t`` holds it: base64 to bytes, nested lists
    to a tensor of its dtype and shape, an integer to a float, a number without a fraction
    to an integer (JSON Schema's reading, which the OpenAPI document follows: 75.0 is 75);
    type errors name row and column. ``bools``: the body may hold a boolean
    (``may_hold_bool``), which a tensor of numbers must not."""
    if t.kind == "bytes":
        if not isinstance(v, str):
            raise DataTypeError(f"row {i}: column {name!r} should be bytes as a base64 string, got {type(v).__name__}")
        # padded, nothing after the padding: exactly openapi.BASE64 (b64decode alone takes "AAAA=")
        if len(v) % 4 or "=" in v[:-2] or (v[-2:-1] == "=" and v[-1:] != "="):
            raise DataTypeError(f"row {i}: column {name!r} is not valid base64")
        try:
            return base64.b64decode(v, validate=True)
        except ValueError:
            raise DataTypeError(f"row {i}: column {name!r} is not valid base64") from None
    if t.kind == "tensor":
        if bools and t.dtype.kind != "b" and _holds_bool(v):
            raise DataTypeError(f"column {name!r}: row {i}: a boolean among the numbers of a {t}")
        arr = _tensor(v, t, name, i)
        if arr.shape != t.shape:
            raise DataTypeError(f"row {i}: column {name!r} should have shape {t.shape}, got {arr.shape}")
        return arr
    if t.kind == "float" and type(v) is int:
        if -_FLOAT64_MAX <= v <= _FLOAT64_MAX:
            return float(v)
        digits = str(v)
        raise DataTypeError(
            f"column {name!r}: row {i}: {digits[:24]}... ({len(digits)} digits) does not fit in float64 "
            f"(numbers within ±{_FLOAT64_MAX:.8g})"
        )
    if t.kind == "int" and type(v) is float and v.is_integer():
        return int(v)  # its range is the column builder's to check
    return v


_FLOAT64_MAX = int(np.finfo(np.float64).max)


def _holds_bool(value) -> bool:
    """Whether a nested list holds a boolean (one pass over it, the innermost lists in C)."""
    if type(value) is not list or not value:
        return type(value) is bool
    if type(value[0]) is list:
        return any(map(_holds_bool, value))
    return bool in set(map(type, value))


def _tensor(value, t: ColumnType, name: str, i: int) -> np.ndarray:
    """A JSON tensor (nested lists) as ``t``'s dtype, refused as ``flow.run`` refuses it
    (``types.tensor_value``, ``types.check_fits``: one check for every path): not an
    array of numbers, a boolean where numbers go (or a number where booleans go), a
    fraction where integers go, a value beyond the dtype's range."""
    raw = tensor_value(value, name, i)
    if raw.shape != t.shape:
        raise DataTypeError(f"column {name!r}: row {i}: expected shape {t.shape}, got {raw.shape}")
    if raw.dtype == t.dtype:
        return raw
    check_fits(raw[None], t, name, i)
    return raw.astype(t.dtype)


_bounds = int_bounds  # jsontensors checks its integers against the same ranges


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
        try:
            return Table.from_arrow(rows, qid=qids, schema=schema)
        except DataError:
            raise
        except (ValueError, TypeError) as e:
            raise _named(e, _arrow_columns(rows, schema)) from None
    try:
        return Table.from_pylist(rows, qid=qids, schema=schema)
    except DataError:
        raise
    except (ValueError, TypeError) as e:
        raise _named(e, _row_columns(rows, schema)) from None


def _named(error: Exception, columns) -> DataTypeError:
    """A builder's error that names no column (numpy's ValueError for nested lists of
    ragged lengths below the first level) as a ``DataTypeError`` naming it: found by
    building each column (``columns``: (name, build it) pairs) alone."""
    for name, build_one in columns:
        try:
            build_one()
        except DataError:
            continue
        except (ValueError, TypeError) as col_error:
            return DataTypeError(f"column {_quoted(name)} cannot be read: {col_error}")
    return DataTypeError(f"the rows cannot be read: {error}")


def _row_columns(rows: list, schema):
    """(name, build it) for each column of JSON rows (for ``_built``'s error only)."""
    names = dict.fromkeys(n for r in rows for n in r)
    for name in names:
        t = schema.get(name) if schema else None
        yield name, lambda name=name, t=t: build_column([r.get(name) for r in rows], name, t)


def _arrow_columns(table, schema):
    """(name, build it) for each column of an Arrow table (for ``_built``'s error only)."""
    import pyarrow as pa

    for i, name in enumerate(table.column_names):
        one = {name: schema[name]} if schema and name in schema else None
        yield (
            name,
            lambda i=i, name=name, one=one: Table.from_arrow(pa.table([table.column(i)], names=[name]), schema=one),
        )


class UnencodableError(DataError, ValueError):
    """An answer JSON cannot carry (the client may ask for Arrow instead); the gateway
    answers it as the operator's ``OperatorOutputError``, naming the operator."""


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
    A flow without a schema takes the body's columns as they come (``_untyped_row_table``).
    tests/executors/test_httpcodec.py compares the two on random bodies."""
    if len(body) > CHUNKED_JSON_BYTES or _media_type(content_type) not in _JSON_TYPES:
        return None
    if schema is None:
        return _untyped_row_table(body, qid)
    if not schema or "qid" in schema or POS in schema:  # the server's columns: _check_rows' errors
        return None
    doc = _loads(body or b"null")
    if type(doc) is not dict or doc.keys() != schema.keys():
        return None
    values = []
    bools = may_hold_bool(body)
    for name, t in schema.items():
        value = doc[name]
        if value is None:
            return None
        values.append(_convert_value(value, t, name, 0, bools))  # the general path's value, or its error
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


def _untyped_row_table(body, qid: int) -> Table | None:
    """``one_row_table`` for a flow without a schema: the body's columns in its own order,
    each value built as ``Table.from_dict`` builds a column of one value (``build_column``
    infers its type; the same ``Column``). None, for the general path, when the body is
    not one object of columns, names a server column, or a value does not build (the
    general path's error is then its own)."""
    doc = _loads(body or b"null")
    if type(doc) is not dict or not doc or "qid" in doc or POS in doc or "" in doc:
        return None
    cols = {}
    for name, value in doc.items():
        try:
            ctype, arr, valid = build_column([value], name)
        except (DataError, ValueError, TypeError):
            return None
        cols[name] = Column(ctype, arr, valid)
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
