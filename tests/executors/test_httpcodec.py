"""Request bodies to rows and result Tables to JSON (executors/httpcodec.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from executors.httpcodec import (
    BadRequestError,
    UnencodableError,
    input_table,
    json_rows,
    one_row_table,
    parse_body,
    to_table,
)
from flow.exceptions import DataTypeError, SchemaError
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

    from flow.exceptions import SchemaError

    with pytest.raises(BadRequestError, match="row 1: column '#pos' is reserved by the runtime"):
        parse_body(b'[{"x": 1}, {"#pos": 2}]', "application/json", None)
    with pytest.raises(SchemaError, match="column '#pos' is reserved by the runtime"):
        to_table(pa.table({"#pos": [1]}), np.arange(1, dtype=np.int64), None)


# Big JSON bodies are read in pieces straight into columns (httpcodec.JsonParts): the same
# Table and the same errors as reading the whole body at once.
@pytest.fixture
def small_pieces(monkeypatch):
    import executors.httpcodec as codec

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
    with pytest.raises(DataTypeError, match="row 47: column 'img': values out of range for uint8"):
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
