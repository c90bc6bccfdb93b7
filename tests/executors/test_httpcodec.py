"""Request bodies to rows and result Tables to JSON (executors/codec/bodies.py)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from executors.codec.bodies import (
    BadRequestError,
    UnencodableError,
    input_table,
    json_rows,
    one_row_table,
    parse_body,
    to_table,
)
from flow.errors import DataTypeError, SchemaError
from flow.table import Table
from flow.types import ColumnType


def test_results_as_json_rows_with_missing_values_as_null():
    t = Table.from_pylist(
        [
            {"f": 1.5, "b": b"xy", "ok": True, "s": "é", "t": np.array([[1, 3], [4, 2]], dtype=np.float16)},
            {"f": float("nan"), "b": b"", "ok": False, "s": "a", "t": np.zeros((2, 2), dtype=np.float16)},
        ],
        qid=np.array([1, 2]),
    )
    assert json.loads(json_rows(t)) == {
        "rows": [
            {"qid": 1, "f": 1.5, "b": "eHk=", "ok": True, "s": "é", "t": [[1.0, 3.0], [4.0, 2.0]]},
            {"qid": 2, "f": None, "b": "", "ok": False, "s": "a", "t": [[0.0, 0.0], [0.0, 0.0]]},
        ]
    }


def test_nan_inside_a_tensor_is_a_value_json_cannot_carry():
    t = Table.from_pylist([{"t": np.array([[1, np.nan], [np.inf, 2]], dtype=np.float16)}], qid=np.array([1]))
    with pytest.raises(UnencodableError, match="tensor column 't' holds NaN or infinity.*Arrow"):
        json_rows(t)


def test_a_tensor_cell_that_is_not_contiguous_is_written_whole():
    t = Table.from_pylist([{"t": np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2]}], qid=np.array([5]))
    assert json.loads(json_rows(t)) == {"rows": [{"qid": 5, "t": [[0.0, 2.0], [3.0, 5.0]]}]}


def test_bodies_are_parsed_and_converted_by_the_schema():
    schema = {"img": ColumnType.tensor(np.uint8, (2, 2)), "x": ColumnType("float")}
    rows = parse_body(
        b'[{"img": [[1, 2], [3, 4]], "x": 1}, {"img": [[0, 0], [0, 0]], "x": 2.5}]', "application/json", schema
    )
    assert rows[0]["img"].dtype == np.uint8 and rows[0]["img"].tolist() == [[1, 2], [3, 4]]
    assert rows[0]["x"] == 1.0 and isinstance(rows[0]["x"], float)


def test_what_the_fast_parser_refuses_is_judged_as_before():
    # a NaN literal is not JSON: refused naming the column; an integer beyond 64 bits is named
    with pytest.raises(BadRequestError, match="column 'x': NaN is not a JSON number"):
        parse_body(b'{"x": NaN}', "application/json", {"x": ColumnType("float")})
    rows = parse_body(b'{"n": 123456789012345678901234567890}', "application/json", None)
    with pytest.raises(DataTypeError, match="column 'n'.*does not fit in int64"):
        to_table(rows, np.array([1]), None)
    with pytest.raises(BadRequestError, match="body is not valid JSON"):
        parse_body(b'{"x": ', "application/json", None)


def test_an_empty_list_is_a_request_of_no_rows():
    """``[]`` is valid (flow.run and Arrow accept 0 rows); with a schema its columns are typed."""
    schema = {"x": ColumnType.parse(float, "x"), "s": ColumnType.parse(str, "s")}
    assert parse_body(b"[]", "application/json", None) == []
    rows = parse_body(b" [ ] ", "application/json", schema)
    table = to_table(rows, np.arange(0, dtype=np.int64), schema)
    assert len(table) == 0 and table.schema == schema
    assert len(to_table([], np.arange(0, dtype=np.int64), None)) == 0
    for body in (b"null", b"3", b'"rows"', b""):
        with pytest.raises(BadRequestError, match="a JSON object \\(one row\\) or a list of objects"):
            parse_body(body, "application/json", None)


def test_the_runtimes_position_column_is_refused_in_a_request():
    import pyarrow as pa

    from flow.errors import SchemaError

    with pytest.raises(BadRequestError, match="row 1: column '#pos' is reserved by the runtime"):
        parse_body(b'[{"x": 1}, {"#pos": 2}]', "application/json", None)
    with pytest.raises(SchemaError, match="column '#pos' is reserved by the runtime"):
        to_table(pa.table({"#pos": [1]}), np.arange(1, dtype=np.int64), None)


# Big JSON bodies are read in pieces straight into columns (httpcodec.JsonParts): the same
# Table and the same errors as reading the whole body at once.
@pytest.fixture
def small_pieces(monkeypatch):
    import executors.codec.bodies as codec

    monkeypatch.setattr(codec, "CHUNKED_JSON_BYTES", 0)
    monkeypatch.setattr(codec, "CHUNK_BYTES", 200)
    monkeypatch.setattr(codec, "JSON_CHUNK_ROWS", 7)
    return codec


PIECE_SCHEMA = {
    "x": ColumnType.parse(float, "x"),
    "s": ColumnType.parse(str, "s"),
    "img": ColumnType.tensor("uint8", (2, 2)),
    "b": ColumnType.parse(bytes, "b"),
}


def _piece_rows(n):
    return [
        {
            "x": i if i % 3 else i + 0.5,
            "s": "},{" * (i % 4) + ('"}, {' if i % 10 == 0 else ""),
            "img": [[i % 256, 1], [2, 3]],
            "b": "aGk=",
        }
        for i in range(n)
    ]


def _whole(body, schema):
    return to_table(parse_body(body, "application/json", schema), np.arange(len(json.loads(body))), schema)


@pytest.mark.parametrize("indent", [None, 2])
def test_a_big_body_read_in_pieces_is_the_table_of_the_whole_body(small_pieces, indent):
    rows = _piece_rows(120)
    body = json.dumps(rows, indent=indent).encode()
    parsed = parse_body(body, "application/json", PIECE_SCHEMA)
    assert isinstance(parsed, small_pieces.JsonParts) and len(parsed.tables) > 5
    got = to_table(parsed, np.arange(120), PIECE_SCHEMA)
    small_pieces.CHUNKED_JSON_BYTES = 1 << 40  # the same body, read whole
    assert got.equals(_whole(body, PIECE_SCHEMA))
    assert got["s"][5] == rows[5]["s"] and got["x"].dtype == np.float64


def test_errors_in_a_later_piece_name_the_row_of_the_whole_body(small_pieces):
    rows = _piece_rows(60)
    rows[41] = dict(rows[41], qid=3)
    with pytest.raises(BadRequestError, match="row 41: 'qid' is assigned by the server"):
        parse_body(json.dumps(rows).encode(), "application/json", PIECE_SCHEMA)
    rows = _piece_rows(60)
    del rows[52]["s"]
    with pytest.raises(SchemaError, match=r"row 52 has different columns than row 0: \['s'\]"):
        to_table(parse_body(json.dumps(rows).encode(), "application/json", PIECE_SCHEMA), np.arange(60), PIECE_SCHEMA)
    rows = _piece_rows(60)
    rows[47]["img"] = [[1, 2], [3, 300]]
    with pytest.raises(DataTypeError, match="column 'img': row 47: 300 does not fit in tensor\\[uint8"):
        parse_body(json.dumps(rows).encode(), "application/json", PIECE_SCHEMA)


def test_a_body_that_does_not_split_cleanly_is_judged_whole(small_pieces):
    # a row holding a list of objects: the cut lands inside it, so the whole body is read
    schema = {"x": ColumnType.parse(float, "x")}
    body = json.dumps([{"x": 1.0, "o": [{"a": 1}, {"b": 2}] * 30}] * 3).encode()
    assert isinstance(parse_body(body, "application/json", schema), list)
    with pytest.raises(BadRequestError, match="column .x.: NaN is not a JSON number"):
        parse_body(b'[{"x": 1.0}, {"x": 2.0}, {"x": NaN' + b" " * 300 + b"}]", "application/json", schema)


def test_a_big_answer_written_in_pieces_is_the_whole_answer(small_pieces):
    table = Table.from_pylist([{"x": float(i), "s": 'a"},' * (i % 3)} for i in range(50)])
    small_pieces.JSON_CHUNK_ROWS = 1 << 30
    whole = json_rows(table)
    small_pieces.JSON_CHUNK_ROWS = 7
    assert bytes(json_rows(table)) == bytes(whole)
    assert json.loads(bytes(json_rows(table)))["rows"][4] == {"qid": 4, "x": 4.0, "s": 'a"},'}


# -- a relayed one-row body of tensors, the short way (one_row_table) -------------------------

_IMAGES = {"img": ColumnType.tensor(np.uint8, (2, 3)), "mask": ColumnType.tensor(np.float32, (2,))}


def _general(body: bytes, schema, qid: int = 9):
    """What the general path makes of the body: its Table, or the error it raises."""
    try:
        rows = parse_body(body, "application/json", schema)
        return input_table("f", rows, np.array([qid], dtype=np.int64), schema)
    except (BadRequestError, DataTypeError, SchemaError) as e:
        return e


def test_a_row_of_tensors_makes_the_general_paths_table():
    body = json.dumps({"mask": [0.5, 1], "img": [[0, 1, 2], [253, 254, 255]]}).encode()
    short, general = one_row_table(body, "application/json", 9, _IMAGES), _general(body, _IMAGES)
    assert short.equals(general) and short.columns == general.columns == ("img", "mask")
    assert short.schema == general.schema and short.qid.tolist() == [9]
    for name in _IMAGES:
        assert short[name].dtype == general[name].dtype and short[name].flags.c_contiguous


@pytest.mark.parametrize(
    "doc",
    [
        {"img": [[0, 1, 2], [3, 4, 1.5]], "mask": [0, 1]},  # a float for uint8
        {"img": [[0, 1, 2], [3, 4, 256]], "mask": [0, 1]},  # out of range
        {"img": [[0, 1], [3, 4]], "mask": [0, 1]},  # the wrong shape
        {"img": [[0, 1, 2], [3, 4, 5]], "mask": [True, False]},  # booleans are not numbers
        {"img": "abc", "mask": [0, 1]},
    ],
)
def test_a_bad_tensor_gets_the_general_paths_error(doc):
    body = json.dumps(doc).encode()
    with pytest.raises(DataTypeError) as short:
        one_row_table(body, "application/json", 9, _IMAGES)
    general = _general(body, _IMAGES)
    assert type(general) is type(short.value) and str(general) == str(short.value)


@pytest.mark.parametrize(
    "body, schema",
    [
        (b'[{"img": [[0, 1, 2], [3, 4, 5]], "mask": [0, 1]}]', _IMAGES),  # a list of rows
        (b'{"img": [[0, 1, 2], [3, 4, 5]]}', _IMAGES),  # a column missing
        (b'{"img": [[0, 1, 2], [3, 4, 5]], "mask": [0, 1], "x": 1}', _IMAGES),  # one too many
        (b'{"img": null, "mask": [0, 1]}', _IMAGES),  # a missing value
        (b'{"img": [[0, 1, 2], [3, 4, 5]], "qid": 1}', {"img": _IMAGES["img"], "qid": _IMAGES["mask"]}),
        (b'{"x": "1"}', {"x": ColumnType.scalar("int")}),  # a string for an int: check_schema's error
        (b'{"x": 9223372036854775808}', {"x": ColumnType.scalar("int")}),  # over int64: the builder's
        (b'{"x": true}', {"x": ColumnType.scalar("int")}),  # a bool is no int
    ],
)
def test_any_other_body_is_left_to_the_general_path(body, schema):
    assert one_row_table(body, "application/json", 9, schema) is None


_TABULAR = {
    "age": ColumnType.scalar("int"),
    "score": ColumnType.scalar("float"),
    "name": ColumnType.scalar("str"),
    "ok": ColumnType.scalar("bool"),
    "blob": ColumnType.scalar("bytes"),
    "img": ColumnType.tensor(np.uint8, (2, 2)),
}


def _same_table(a, b) -> bool:
    """Equal to the bit: column order, types, storage dtypes, values (a float's sign of
    zero included), masks, qids."""
    if a.columns != b.columns or a.schema != b.schema or a.qid.tolist() != b.qid.tolist():
        return False
    for name in a.columns:
        x, y = a._cols[name], b._cols[name]
        if x.values.dtype != y.values.dtype or (x.valid is None) != (y.valid is None):
            return False
        if x.valid is not None and not np.array_equal(x.valid, y.valid):
            return False
        if x.values.dtype.kind == "f":
            if not (np.array_equal(x.values, y.values) and np.array_equal(np.signbit(x.values), np.signbit(y.values))):
                return False
        elif x.values.tolist() != y.values.tolist():
            return False
    return True


def test_a_row_of_scalars_and_tensors_makes_the_general_paths_table():
    doc = {"img": [[1, 2], [3, 4]], "ok": True, "blob": "aGk=", "name": "é", "score": 2, "age": -7}  # keys shuffled
    body = json.dumps(doc).encode()
    short, general = one_row_table(body, "application/json", 9, _TABULAR), _general(body, _TABULAR)
    assert short is not None and _same_table(short, general), (short, general)
    assert short.columns == tuple(_TABULAR) and short["score"].dtype == np.float64 and short["blob"][0] == b"hi"


def _random_value(rng, t: ColumnType):
    """Mostly a value of the column's type, sometimes one of another (or none)."""
    odd = [None, "7", 7, 7.5, -0.0, True, False, 2**63, -(2**63), 2**63 - 1, 1e308, [1, 2], {"a": 1}, "", "!!", 0]
    if rng.random() < 0.3:
        return odd[rng.integers(len(odd))]
    if t.kind == "int":
        return int(rng.integers(-(2**62), 2**62)) if rng.random() < 0.5 else int(rng.integers(-5, 5))
    if t.kind == "float":
        return (
            float(rng.standard_normal() * 10.0 ** int(rng.integers(-5, 5)))
            if rng.random() < 0.7
            else int(rng.integers(-9, 9))
        )
    if t.kind == "str":
        return "".join(chr(int(c)) for c in rng.integers(32, 0x2FF, rng.integers(0, 6)))
    if t.kind == "bool":
        return bool(rng.integers(2))
    if t.kind == "bytes":
        import base64

        return base64.b64encode(rng.bytes(int(rng.integers(0, 5)))).decode()
    shape = (2, 2) if rng.random() < 0.9 else (2, 3)
    return rng.integers(0, 256 if rng.random() < 0.9 else 300, shape).tolist()


def test_random_rows_read_the_short_way_are_what_the_general_path_reads():
    """Whatever the short way makes of a one-row body is the general path's Table to the
    bit, and whatever error it raises is the general path's error; what it leaves (None)
    the general path reads itself."""
    rng = np.random.default_rng(20261126)
    taken = errors = 0
    names = list(_TABULAR)
    for _ in range(1500):
        cols = [n for n in names if rng.random() < 0.6] or ["age"]
        schema = {n: _TABULAR[n] for n in cols}
        doc = {n: _random_value(rng, schema[n]) for n in rng.permutation(cols)}
        body = json.dumps(doc).encode()
        try:
            short = one_row_table(body, "application/json", 9, schema)
        except (BadRequestError, DataTypeError, SchemaError) as e:
            general = _general(body, schema)
            assert type(general) is type(e) and str(general) == str(e), (doc, e, general)
            errors += 1
            continue
        if short is None:
            continue
        taken += 1
        general = _general(body, schema)
        assert not isinstance(general, Exception), (doc, general)
        assert _same_table(short, general), (doc, short, general)
    assert taken > 300 and errors > 30, (taken, errors)  # both sides of the short way were tried


def _untyped_value(rng):
    """A JSON value a flow without a schema may be sent: scalars of every kind, nested lists
    (ragged, mixed, empty), objects, and the edges of int64."""
    values = [None, 7, -0.0, 2.5, 1e308, True, False, "", "é", 2**63, -(2**63), 2**63 - 1, 2**64, [1, 2],
              [[1, 2], [3, 4]], [[1, 2], [3]], [1, "a"], [], [True, False], [1.5, None], {"a": 1}, [[0.5], [2]]]  # fmt: skip
    if rng.random() < 0.5:
        return values[rng.integers(len(values))]
    return int(rng.integers(-(2**62), 2**62)) if rng.random() < 0.5 else float(rng.standard_normal())


def test_random_rows_of_a_flow_without_a_schema_read_the_short_way_are_the_general_paths():
    """Without a schema a one-row body's columns are its own: whatever the short way makes
    of it is the general path's Table to the bit; what it leaves (None) the general path
    reads itself, and the short way never raises where the general path would not."""
    rng = np.random.default_rng(20261128)
    taken = left = 0
    for _ in range(1500):
        names = ["b", "a", "x", "qid", "", "img"]
        doc = {n: _untyped_value(rng) for n in names[: rng.integers(0, len(names) + 1)] if rng.random() < 0.7}
        if rng.random() < 0.05:
            doc = [doc] if rng.random() < 0.5 else None
        body = json.dumps(doc).encode()
        short = one_row_table(body, "application/json", 9, None)
        general = _general(body, None)
        if short is None:
            left += 1
            continue
        taken += 1
        assert not isinstance(general, Exception), (doc, general)
        assert _same_table(short, general), (doc, short, general)
    assert taken > 300 and left > 100, (taken, left)  # both sides of the short way were tried


def test_a_flow_with_an_empty_schema_is_left_to_the_general_path():
    assert one_row_table(b'{"x": 1}', "application/json", 9, {}) is None
    assert isinstance(one_row_table(b'{"x": 1}', "application/json", 9, None), Table)


# -- numbers a narrower float cannot hold -----------------------------------------------------

_FLOATS = {"v": ColumnType.tensor(np.float32, (2,)), "h": ColumnType.tensor(np.float16, (2,))}


@pytest.mark.parametrize(
    "doc, says",
    [
        (
            {"v": [1e39, 1.0], "h": [1, 2]},
            "column 'v': row 0: 1e+39 does not fit in tensor[float32, (2,)] (numbers within ±3.4028235e+38)",
        ),
        (
            {"v": [1.0, -1e39], "h": [1, 2]},
            "column 'v': row 0: -1e+39 does not fit in tensor[float32, (2,)] (numbers within ±3.4028235e+38)",
        ),
        (
            {"v": [3.41e38, 1.0], "h": [1, 2]},
            "column 'v': row 0: 3.41e+38 does not fit in tensor[float32, (2,)] (numbers within ±3.4028235e+38)",
        ),
        (
            {"v": [1.0, 2.0], "h": [70000, 1]},
            "column 'h': row 0: 70000 does not fit in tensor[float16, (2,)] (numbers within ±65504)",
        ),
        (
            {"v": [1.0, 2.0], "h": [1.0, -65520.0]},
            "column 'h': row 0: -65520.0 does not fit in tensor[float16, (2,)] (numbers within ±65504)",
        ),
    ],
)
def test_a_finite_number_a_narrower_float_cannot_hold_is_refused_on_each_json_path(doc, says, small_pieces):
    """1e39 as float32 (70000 as float16) would be an infinity: the general path, the
    one-row short way (a relayed body) and a big body read in pieces each refuse it,
    naming the row, the column and the value."""
    body = json.dumps(doc).encode()
    small_pieces.CHUNKED_JSON_BYTES = 1 << 40  # whole bodies first
    with pytest.raises(DataTypeError) as general:
        input_table("f", parse_body(body, "application/json", _FLOATS), np.array([9]), _FLOATS)
    assert str(general.value) == says
    with pytest.raises(DataTypeError) as short:
        one_row_table(body, "application/json", 9, _FLOATS)
    assert str(short.value) == says
    small_pieces.CHUNKED_JSON_BYTES = 0  # a list of rows read in pieces: the row of the whole body
    rows = [{"v": [0.5, 0.5], "h": [1, 1]}] * 30 + [doc]
    with pytest.raises(DataTypeError, match=re.escape(says.replace("row 0", "row 30"))):
        parse_body(json.dumps(rows).encode(), "application/json", _FLOATS)


def test_numbers_at_the_edge_of_a_float_range_are_kept():
    """The largest finite values (and what rounds to them) are values, not overflows."""
    body = json.dumps({"v": [3.4028235e38, -3.4028235e38], "h": [65504, -65519.99]}).encode()
    table = input_table("f", parse_body(body, "application/json", _FLOATS), np.array([1]), _FLOATS)
    assert np.isfinite(table["v"]).all() and np.isfinite(table["h"]).all()
    assert table["h"].dtype == np.float16 and table["h"][0].tolist() == [65504.0, -65504.0]
    assert one_row_table(body, "application/json", 1, _FLOATS).equals(table)


# -- Arrow bodies: validated before a value is read; typed as JSON's --------------------------


def _arrow(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _arrow_table(body: bytes, schema=None):
    rows = parse_body(body, "application/vnd.apache.arrow.stream", schema)
    return input_table("f", rows, np.arange(len(rows), dtype=np.int64), schema)


def _offsets_past_the_data() -> bytes:
    """A string column whose last offset points 1 GiB past its 6 bytes of data: Arrow's
    reader takes it, and reading its values read (and crashed on) memory past the body."""
    import struct

    import pyarrow as pa

    body = bytearray(_arrow(pa.table({"s": ["ab", "cd", "ef"]})))
    at = body.find(struct.pack("<4i", 0, 2, 4, 6))
    body[at : at + 16] = struct.pack("<4i", 0, 2, 4, 1 << 30)
    return bytes(body)


def test_an_arrow_body_whose_offsets_point_past_its_data_is_refused_naming_the_column():
    with pytest.raises(BadRequestError, match="body is not a valid Arrow IPC stream: column 's': .*offset"):
        parse_body(_offsets_past_the_data(), "application/vnd.apache.arrow.stream", None)


def _replace(body: bytes, old: bytes, new: bytes) -> bytes:
    assert body.count(old) >= 1
    return body.replace(old, new)


def test_arrow_bodies_that_lie_about_their_data_are_refused():
    """Invalid UTF-8, a dictionary index past its dictionary, a null count the bitmap does
    not have, a list's offsets past its values: each a 400 naming the column."""
    import struct

    import pyarrow as pa

    cases = [
        (_replace(_arrow(pa.table({"s": ["héllo"]})), "héllo".encode(), b"h\xe9llo "[:6]), "column 's'.*UTF8"),
        (
            _replace(
                _arrow(pa.table({"d": pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int8()), ["a", "b"])})),
                b"\x00\x01\x00\x00\x00\x00\x00\x00",
                b"\x00\x7f\x00\x00\x00\x00\x00\x00",
            ),
            "column 'd'.*Dictionary indices invalid",
        ),
        (
            _replace(
                _arrow(pa.table({"l": pa.array([[1.0, 2.0], [3.0]], pa.list_(pa.float32()))})),
                struct.pack("<3i", 0, 2, 3),
                struct.pack("<3i", 0, 2, 1 << 28),
            ),
            "column 'l'",
        ),
    ]
    nulls = _arrow(pa.table({"x": pa.array([1, None, 3, None, 5, 6, 7, 8])}))
    cases.append((_replace(nulls, struct.pack("<qq", 8, 2), struct.pack("<qq", 8, 5)), "column 'x'.*null"))
    for body, says in cases:
        with pytest.raises(BadRequestError, match=says):
            parse_body(body, "application/vnd.apache.arrow.stream", None)


def test_arrow_bodies_of_types_a_table_does_not_take_are_refused_by_name_before_they_are_read():
    import pyarrow as pa

    for column, says in [
        (pa.array([{"a": 1}]), "struct<a: int64> is not supported"),
        (pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())), "map<string, int64> is not supported"),
        (pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array([1]), pa.array(["a"])]), "sparse_union"),
        (pa.array([1], pa.timestamp("s")), "timestamp"),
        (pa.array([["a"]]), "lists are tensors of numbers"),
        (pa.RunEndEncodedArray.from_arrays([1 << 30], [1]), "run_end_encoded"),
    ]:
        with pytest.raises(DataTypeError, match=f"column 'c': .*{says}"):
            parse_body(_arrow(pa.table({"c": column})), "application/vnd.apache.arrow.stream", None)


def test_a_compressed_arrow_body_that_inflates_past_the_limit_is_refused_before_it_is_read():
    """6 KB of ZSTD inflate to 200 MB of zeros: refused from what the batches declare."""
    import pyarrow as pa

    zeros = pa.table({"z": np.zeros(200_000_000, dtype=np.int8)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, zeros.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(zeros)
    body = sink.getvalue().to_pybytes()
    assert len(body) < 10_000
    with pytest.raises(BadRequestError, match="compressed Arrow IPC stream of 200000000 bytes uncompressed"):
        parse_body(body, "application/vnd.apache.arrow.stream", None)
    small = zeros.slice(0, 1000)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, small.schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as w:
        w.write_table(small)
    assert len(_arrow_table(sink.getvalue().to_pybytes())) == 1000  # a compressed body within the limit reads


def test_an_arrow_body_declaring_more_rows_than_64_bits_count_is_refused():
    """Columns of nulls take no bytes: four batches of 2**62 rows summed to a Table of 0."""
    import struct

    import pyarrow as pa

    batch = pa.record_batch([pa.nulls(12345)], names=["x"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        for _ in range(4):
            w.write_batch(batch)
    body = _replace(sink.getvalue().to_pybytes(), struct.pack("<q", 12345), struct.pack("<q", 2**62))
    with pytest.raises(BadRequestError, match="of 18446744073709551616 rows|of 4611686018427387904 rows"):
        parse_body(body, "application/vnd.apache.arrow.stream", None)


def test_arrow_tensors_of_another_dtype_are_held_to_the_rules_of_json_tensors():
    """A schema's dtype is not a licence to wrap, truncate or overflow: 300 is no uint8,
    0.5 no integer, True no number, 1e39 no float32; what fits is cast, and infinities and
    NaN (Arrow values, not overflows) stay what they are."""
    import pyarrow as pa

    schema = {"img": ColumnType.tensor(np.uint8, (2,)), "v": ColumnType.tensor(np.float32, (2,))}
    good = {"img": pa.array([[1, 255]]), "v": pa.array([[1e38, float("inf")]])}
    for column, values, says in [
        (
            "img",
            [[1, 300]],
            "column 'img': row 0: 300 does not fit in tensor\\[uint8, \\(2,\\)\\] \\(integers 0..255\\)",
        ),
        ("img", [[-1, 3]], "column 'img': row 0: -1 does not fit in tensor\\[uint8"),
        ("img", [[0.5, 1.0]], "column 'img': row 0: 0.5 does not fit in tensor\\[uint8, \\(2,\\)\\]"),
        ("img", [[True, False]], "column 'img': row 0: True does not fit"),
        (
            "v",
            [[1e39, 1.0]],
            "column 'v': row 0: 1e\\+39 does not fit in tensor\\[float32, \\(2,\\)\\] \\(numbers within ±3.4028235e\\+38\\)",
        ),
        ("v", [[float("nan"), -1e39]], "column 'v': row 0: -1e\\+39 does not fit in tensor\\[float32"),
    ]:
        with pytest.raises(DataTypeError, match=says):
            _arrow_table(_arrow(pa.table(dict(good, **{column: pa.array(values)}))), schema)
    table = _arrow_table(_arrow(pa.table(good)), schema)
    assert table["img"].dtype == np.uint8 and table["img"].tolist() == [[1, 255]]
    assert table["v"].dtype == np.float32 and table["v"][0][0] == np.float32(1e38) and np.isinf(table["v"][0][1])


def test_ragged_nested_lists_are_a_400_naming_the_column():
    """numpy's ValueError for lists of lists of ragged lengths names no column: it is
    found, in a JSON body of a flow without a schema and in an Arrow list of lists."""
    import pyarrow as pa

    with pytest.raises(DataTypeError, match="column 'a': row 0: not an array of numbers .*different lengths"):
        input_table("f", parse_body(b'{"a": [[1, 2], [3]], "b": 1}', "application/json", None), np.array([1]), None)
    with pytest.raises(DataTypeError, match="column 'a' cannot be read: .*inhomogeneous"):
        _arrow_table(_arrow(pa.table({"b": [1], "a": [[[1, 2], [3]]]})))


def test_validating_an_arrow_tensor_body_costs_next_to_nothing():
    """A 10 MiB float32 tensor (as Deployment.call sends it): its full validation reads no
    value (its offsets are implicit). Measured: ~0.2 us, the whole parse ~10 us."""
    import time

    import pyarrow as pa

    body = _arrow(Table.from_dict({"t": np.ones((1, 10 << 18), np.float32)}).to_arrow().drop_columns(["qid"]))
    table = pa.ipc.open_stream(body).read_all()
    took = []
    for _ in range(20):
        t0 = time.perf_counter()
        table.validate(full=True)
        took.append(time.perf_counter() - t0)
    assert min(took) < 200e-6, min(took)  # 1000x the measured time: only a pass over the values fails it


def test_a_relayed_body_read_from_a_view_of_its_message_parses_as_bytes_do():
    """An executor gets a relayed body as a memoryview of the frames it arrived in."""
    from executors.codec.bodies import one_row_table

    schema = {"x": ColumnType.scalar("int"), "v": ColumnType.tensor(np.float32, (2,))}
    body = b'{"x": 3, "v": [1.5, 2.5]}'
    (whole,) = parse_body(body, "application/json", schema)
    (viewed,) = parse_body(memoryview(body), "application/json", schema)
    assert viewed["x"] == whole["x"] == 3 and viewed["v"].tolist() == whole["v"].tolist() == [1.5, 2.5]
    short = one_row_table(memoryview(body), "application/json", 7, schema)
    plain = one_row_table(body, "application/json", 7, schema)
    assert short is not None and short["x"].tolist() == plain["x"].tolist() == [3]
    assert short["v"].tolist() == plain["v"].tolist() == [[1.5, 2.5]] and short["qid"].tolist() == [7]


# -- rows whose columns would not fit in memory ------------------------------------------------


def test_rows_whose_columns_would_take_more_than_4x_the_body_limit_are_refused_before_any_is_built(small_pieces):
    """Missing values take no room in a body and a whole row in a column: 100 rows of
    nulls for a (256, 256) float32 tensor are 26 MB of columns from a 1.3 KB body."""
    import pyarrow as pa

    from executors.errors import RequestTooLargeError

    schema = {"img": ColumnType.tensor(np.float32, (256, 256))}
    body = json.dumps([{"img": None}] * 100).encode()
    limit = 1 << 20  # the body limit: 4 MiB of columns
    small_pieces.CHUNKED_JSON_BYTES = 1 << 40  # read whole
    with pytest.raises(RequestTooLargeError, match=r"the request's 100 rows would take 25 MiB as columns"):
        parse_body(body, "application/json", schema, limit)
    small_pieces.CHUNKED_JSON_BYTES = 0  # read in pieces: refused at the first piece over the limit
    with pytest.raises(RequestTooLargeError, match=r"the request's first \d+ rows would take"):
        parse_body(body, "application/json", schema, limit)
    with pytest.raises(RequestTooLargeError):
        parse_body(_arrow(pa.table({"img": pa.nulls(100)})), "application/vnd.apache.arrow.stream", schema, limit)
    rows = parse_body(json.dumps([{"img": None}] * 15).encode(), "application/json", schema, limit)  # 3.8 MiB
    assert len(to_table(rows, np.arange(15), schema)) == 15
