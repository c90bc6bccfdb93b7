"""Request bodies to rows and result Tables to JSON (executors/httpcodec.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from executors.httpcodec import BadRequestError, UnencodableError, json_rows, parse_body, to_table
from flow.exceptions import DataTypeError
from flow.table import Table
from flow.types import ColumnType


def test_results_as_json_rows_with_missing_values_as_null():
    t = Table.from_pylist([
        {"f": 1.5, "b": b"xy", "ok": True, "s": "é", "t": np.array([[1, 3], [4, 2]], dtype=np.float16)},
        {"f": float("nan"), "b": b"", "ok": False, "s": "a", "t": np.zeros((2, 2), dtype=np.float16)},
    ], qid=np.array([1, 2]))
    assert json.loads(json_rows(t)) == {"rows": [
        {"qid": 1, "f": 1.5, "b": "eHk=", "ok": True, "s": "é", "t": [[1.0, 3.0], [4.0, 2.0]]},
        {"qid": 2, "f": None, "b": "", "ok": False, "s": "a", "t": [[0.0, 0.0], [0.0, 0.0]]},
    ]}


def test_nan_inside_a_tensor_is_a_value_json_cannot_carry():
    t = Table.from_pylist([{"t": np.array([[1, np.nan], [np.inf, 2]], dtype=np.float16)}], qid=np.array([1]))
    with pytest.raises(UnencodableError, match="tensor column 't' holds NaN or infinity.*Arrow"):
        json_rows(t)


def test_a_tensor_cell_that_is_not_contiguous_is_written_whole():
    t = Table.from_pylist([{"t": np.arange(6, dtype=np.float32).reshape(2, 3)[:, ::2]}], qid=np.array([5]))
    assert json.loads(json_rows(t)) == {"rows": [{"qid": 5, "t": [[0.0, 2.0], [3.0, 5.0]]}]}


def test_bodies_are_parsed_and_converted_by_the_schema():
    schema = {"img": ColumnType.tensor(np.uint8, (2, 2)), "x": ColumnType("float")}
    rows = parse_body(b'[{"img": [[1, 2], [3, 4]], "x": 1}, {"img": [[0, 0], [0, 0]], "x": 2.5}]', "application/json", schema)
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
