"""Table: constructors, schema checks, row access, conversions and round trips."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from flow import ColumnType, DataError, DataTypeError, Row, SchemaError, Table
from flow.table import Column, built_column
from flow.types import build_column

T2 = ColumnType.tensor(np.float64, (2,))


def full_table() -> Table:
    """Every kind, with a missing value in every column."""
    return Table.from_pylist(
        [
            {"i": 1, "f": 1.5, "b": True, "s": "a", "y": b"x", "t": np.array([1.0, 2.0]), "n": None},
            {"i": None, "f": None, "b": None, "s": None, "y": None, "t": None, "n": None},
            {"i": -(2**63), "f": -0.0, "b": False, "s": "", "y": b"", "t": np.array([0.0, -1.0]), "n": None},
        ]
    )


# -- constructors -------------------------------------------------------------------------------


def test_from_pylist_infers_schema_and_default_qids():
    t = full_table()
    assert t.schema == {
        "i": ColumnType("int"),
        "f": ColumnType("float"),
        "b": ColumnType("bool"),
        "s": ColumnType("str"),
        "y": ColumnType("bytes"),
        "t": T2,
        "n": ColumnType("null"),
    }
    assert t.qid.tolist() == [0, 1, 2] and t.qid.dtype == np.int64
    assert len(t) == t.num_rows == 3
    assert t.columns == ("i", "f", "b", "s", "y", "t", "n")


def test_from_dict_with_arrays_and_lists():
    imgs = np.zeros((2, 4, 4), dtype=np.float32)
    t = Table.from_dict({"x": [1, 2], "img": imgs}, qid=[10, 20])
    assert t.schema["img"] == ColumnType.tensor(np.float32, (4, 4))
    assert t["img"].shape == (2, 4, 4) and t["img"].flags.c_contiguous
    assert t.qid.tolist() == [10, 20]


def test_from_pandas_all_kinds():
    df = pd.DataFrame(
        {
            "i": [1, 2],
            "f": [1.5, np.nan],
            "b": [True, False],
            "s": ["a", None],
            "y": [b"x", None],
            "t": [np.ones(2), np.zeros(2)],
            "ni": pd.array([1, None], dtype="Int64"),
            "nb": pd.array([True, None], dtype="boolean"),
        }
    )
    t = Table.from_pandas(df)
    assert {n: str(c) for n, c in t.schema.items()} == {
        "i": "int",
        "f": "float",
        "b": "bool",
        "s": "str",
        "y": "bytes",
        "t": "tensor[float64, (2,)]",
        "ni": "int",
        "nb": "bool",
    }
    row = t.to_pylist()[1]
    assert row.pop("t").tolist() == [0.0, 0.0]
    assert row == {"qid": 1, "i": 2, "f": None, "b": False, "s": None, "y": None, "ni": None, "nb": None}


def test_from_pandas_uses_qid_column_only_when_asked():
    df = pd.DataFrame({"qid": [7, 8], "x": [1, 2]})
    with pytest.raises(SchemaError, match="column 'qid' is reserved"):
        Table.from_pandas(df)
    assert Table.from_pandas(df, qid="qid").qid.tolist() == [7, 8]


def test_from_arrow_all_kinds_with_nulls():
    at = pa.table(
        {
            "i": pa.array([1, None], pa.int32()),
            "f": pa.array([1.5, None]),
            "b": pa.array([None, True]),
            "s": pa.array(["a", None]),
            "y": pa.array([b"x", None]),
            "l": pa.array([[1, 2], None]),
            "n": pa.nulls(2),
        }
    )
    t = Table.from_arrow(at)
    assert {n: str(c) for n, c in t.schema.items()} == {
        "i": "int",
        "f": "float",
        "b": "bool",
        "s": "str",
        "y": "bytes",
        "l": "tensor[int64, (2,)]",
        "n": "null",
    }
    assert [r["i"] for r in t.to_pylist()] == [1, None]
    assert t.row(1).l is None and t.row(0).l.tolist() == [1, 2]


def test_from_arrow_record_batch_and_chunked_columns():
    batch = pa.record_batch({"x": [1, 2]})
    assert Table.from_arrow(batch).to_pylist(qid=False) == [{"x": 1}, {"x": 2}]
    chunked = pa.concat_tables([pa.table({"x": [1]}), pa.table({"x": [2]})])
    assert Table.from_arrow(chunked)["x"].tolist() == [1, 2]


def test_from_arrow_nan_is_missing_and_empty_keeps_types():
    t = Table.from_arrow(pa.table({"f": pa.array([np.nan, 1.0])}))
    assert t.to_pylist(qid=False) == [{"f": None}, {"f": 1.0}]
    empty = pa.table(
        {
            "s": pa.array([], pa.string()),
            "y": pa.array([], pa.binary()),
            "i": pa.array([], pa.int64()),
            "b": pa.array([], pa.bool_()),
        }
    )
    assert {n: c.kind for n, c in Table.from_arrow(empty).schema.items()} == {
        "s": "str",
        "y": "bytes",
        "i": "int",
        "b": "bool",
    }
    all_null = pa.table({"f": pa.array([None], pa.float64()), "s": pa.array([None], pa.string())})
    assert {n: c.kind for n, c in Table.from_arrow(all_null).schema.items()} == {"f": "float", "s": "str"}


def test_from_any_dispatches_and_rejects_other_types():
    rows = [{"x": 1}]
    for data in (rows, {"x": [1]}, pd.DataFrame(rows), pa.Table.from_pylist(rows), Table.from_pylist(rows)):
        assert Table.from_any(data).to_pylist() == [{"qid": 0, "x": 1}]
    t = Table.from_pylist(rows)
    assert Table.from_any(t) is t
    with pytest.raises(DataTypeError, match="cannot make a Table from int"):
        Table.from_any(3)


def test_empty_tables():
    assert len(Table.from_pylist([])) == 0 and Table.from_pylist([]).columns == ()
    t = Table.empty({"x": int, "img": T2})
    assert t.schema == {"x": ColumnType("int"), "img": T2} and t["img"].shape == (0, 2)
    assert Table.from_pylist([], schema={"x": float}).schema == {"x": ColumnType("float")}
    assert Table.from_dict({"x": []}).schema == {"x": ColumnType("null")}
    assert Table.from_pandas(pd.DataFrame({"x": pd.Series([], dtype=int)})).schema == {"x": ColumnType("int")}
    assert t.to_pylist() == [] and len(t.to_pandas()) == 0 and t.to_arrow().num_rows == 0
    assert Table.concat([]).columns == ()


# -- schema checks on construction name the column ------------------------------------------------


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: Table.from_pylist([{"t": np.zeros(2)}, {"t": np.zeros(3)}]), DataTypeError, "column 't': ragged"),
        (lambda: Table.from_pylist([{"a": 1}, {"a": "x"}]), DataTypeError, "column 'a': mixed"),
        (lambda: Table.from_pylist([{"a": 1}], schema={"a": str}), DataTypeError, "column 'a': expected str"),
        (lambda: Table.from_pylist([{"qid": 1}]), SchemaError, "column 'qid' is reserved"),
        (lambda: Table.from_dict({"qid": [1]}), SchemaError, "column 'qid' is reserved"),
        (
            lambda: Table.from_pandas(pd.DataFrame([[1, 2]], columns=["a", "a"])),
            SchemaError,
            "duplicate column name 'a'",
        ),
        (
            lambda: Table.from_arrow(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"])),
            SchemaError,
            "duplicate column name 'a'",
        ),
        (lambda: Table.from_dict({"a": [1, 2], "b": [1]}), SchemaError, "column 'b' has 1 rows"),
        (lambda: Table.from_dict({"a": "xy"}), DataTypeError, "column 'a': expected a sequence"),
        (lambda: Table.from_dict({"": [1]}), SchemaError, "non-empty strings"),
        (lambda: Table.from_dict({1: [1]}), SchemaError, "non-empty strings"),
        (lambda: Table.from_dict([1]), DataTypeError, "mapping"),
        (
            lambda: Table.from_pylist([{"a": 1}, {"b": 1}]),
            SchemaError,
            r"row 1 has different columns than row 0: \['a', 'b'\]",
        ),
        (lambda: Table.from_pylist([3]), DataTypeError, "row 0: expected a mapping"),
        (lambda: Table.from_pandas([1]), DataTypeError, "expects a DataFrame"),
        (lambda: Table.from_arrow([1]), DataTypeError, "expects a pyarrow Table"),
        (lambda: Table.from_pandas(pd.DataFrame({"d": pd.to_datetime(["2020-01-01"])})), DataTypeError, "column 'd'"),
        (lambda: Table.from_arrow(pa.table({"d": pa.array([1], pa.timestamp("s"))})), DataTypeError, "column 'd'"),
        (
            lambda: Table.from_pylist([{"x": 2**64}]),
            DataTypeError,
            "column 'x': row 0: 18446744073709551616 does not fit",
        ),
        (lambda: Table.from_dict({"x": [1]}, qid=["a"]), DataTypeError, "query ids must be integers"),
        (lambda: Table.from_dict({"x": [1]}, qid=[1, 2]), SchemaError, "expected 1 query ids"),
        (lambda: Table.from_dict({"x": [1]}, qid="nope"), SchemaError, "qid='nope' names no column"),
        (lambda: Table.empty({"x": object}), DataTypeError, "column 'x'"),
    ],
)
def test_construction_errors_name_the_column(make, exc, match):
    with pytest.raises(exc, match=match):
        make()
    assert issubclass(exc, DataError)


def test_tables_may_repeat_qids_but_flow_inputs_may_not():
    t = Table.from_dict({"x": [1, 2]}, qid=[5, 5])  # e.g. the result of a join, sent between stages
    assert t.qid.tolist() == [5, 5]
    from flow import Flow

    flow = Flow("f")
    flow.map(lambda r: r.x, names=["y"])
    with pytest.raises(SchemaError, match="query ids must be unique in a request; 5 appears more than once"):
        flow.run(t)


# -- rows ------------------------------------------------------------------------------------------


def test_row_access_by_attribute_key_and_helpers():
    t = full_table()
    r = t.row(0)
    assert isinstance(r, Row)
    assert r.i == r["i"] == 1 and type(r.i) is int
    assert r.f == 1.5 and type(r.f) is float and r.b is True and r.s == "a" and r.y == b"x"
    assert r.t.tolist() == [1.0, 2.0] and r.n is None
    assert r.qid == r["qid"] == 0
    assert r.get("nope", 5) == 5 and r.get("i") == 1
    assert r.keys() == list(t.columns)
    assert r.as_dict(qid=True)["qid"] == 0 and "qid" not in r.as_dict()
    assert "Row(" in repr(r)
    missing = t.row(1)
    assert missing.i is None and missing.f is None and missing.t is None and missing.b is None
    with pytest.raises(KeyError, match="row has no column 'zz'"):
        r["zz"]
    with pytest.raises(AttributeError, match="row has no column 'zz'"):
        r.zz  # noqa: B018  (the attribute read is what raises)
    assert [row.qid for row in t] == [0, 1, 2]


def test_column_access_as_numpy():
    t = full_table()
    assert np.isnan(t["f"][1]) and t["f"].dtype == np.float64
    assert t["i"].tolist() == [1, None, -(2**63)]  # object array: None for missing
    assert t["qid"].tolist() == [0, 1, 2]
    assert t["t"][1] is None and t["t"][0].tolist() == [1.0, 2.0]
    assert "i" in t and "qid" in t and "zz" not in t
    with pytest.raises(SchemaError, match="no column 'zz'"):
        t["zz"]


# -- conversions and round trips -----------------------------------------------------------------


def test_to_pylist_and_to_dict():
    t = full_table()
    rows = t.to_pylist()
    assert rows[1] == {"qid": 1, "i": None, "f": None, "b": None, "s": None, "y": None, "t": None, "n": None}
    assert "qid" not in t.to_pylist(qid=False)[0]
    d = t.to_dict()
    assert d["qid"].tolist() == [0, 1, 2] and d["t"][1] is None


def test_to_pandas_dtypes():
    df = full_table().to_pandas()
    assert list(df.columns) == ["qid", "i", "f", "b", "s", "y", "t", "n"]
    assert str(df["i"].dtype) == "Int64" and str(df["b"].dtype) == "boolean"
    assert df["f"].dtype == np.float64 and np.isnan(df["f"][1])
    assert df["i"].isna().tolist() == [False, True, False] and df["s"].isna().tolist() == [False, True, False]
    assert df["t"][0].tolist() == [1.0, 2.0] and df["t"][1] is None
    no_nulls = Table.from_pylist([{"i": 1, "b": True}]).to_pandas()
    assert no_nulls["i"].dtype == np.int64 and no_nulls["b"].dtype == bool


def test_to_arrow_types():
    at = full_table().to_arrow()
    assert at.column_names == ["qid", "i", "f", "b", "s", "y", "t", "n"]
    assert [str(at.schema.field(n).type) for n in ("qid", "i", "f", "b", "s", "y", "n")] == [
        "int64",
        "int64",
        "double",
        "bool",
        "string",
        "binary",
        "null",
    ]
    assert isinstance(at.schema.field("t").type, pa.FixedShapeTensorType)
    assert all(at.column(n).null_count == 1 for n in ("i", "f", "b", "s", "y", "t"))


@pytest.mark.parametrize("n", [0, 1, 3])
def test_round_trips_with_nulls_in_every_kind(n):
    t = full_table().take(np.arange(n))
    assert Table.from_arrow(t.to_arrow(), qid="qid").equals(t)
    assert Table.from_pandas(t.to_pandas(), qid="qid").equals(t)
    assert Table.from_pylist(t.to_pylist(qid=False), qid=t.qid, schema=t.schema).equals(t)


def test_pandas_round_trip_of_all_missing_columns_keeps_types():
    t = Table.from_pylist([{"i": None, "t": None, "y": None}], schema={"i": int, "t": T2, "y": bytes})
    back = Table.from_pandas(t.to_pandas(), qid="qid")
    assert back.schema == t.schema
    # without the stored schema (a DataFrame made elsewhere) such a column is null
    df = t.to_pandas()
    df.attrs.clear()
    assert Table.from_pandas(df, qid="qid").schema["y"].kind == "null"


def test_tensor_round_trip_keeps_dtype_and_shape():
    t = Table.from_dict({"img": np.arange(24, dtype=np.uint8).reshape(2, 3, 4)})
    for back in (Table.from_arrow(t.to_arrow(), qid="qid"), Table.from_pandas(t.to_pandas(), qid="qid")):
        assert back.schema["img"] == ColumnType.tensor(np.uint8, (3, 4))
        assert np.array_equal(back["img"], t["img"])


def test_arrow_tensor_with_missing_elements_is_an_error():
    storage = pa.FixedSizeListArray.from_arrays(pa.array([1.0, None]), 2)
    arr = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float64(), [2]), storage)
    with pytest.raises(DataTypeError, match="column 't': a tensor row has missing elements"):
        Table.from_arrow(pa.table({"t": arr}))


def test_nan_and_null_are_the_same_missing_value():
    a = Table.from_pylist([{"f": float("nan")}, {"f": None}])
    assert a.to_pylist(qid=False) == [{"f": None}, {"f": None}]
    assert a.to_arrow().column("f").null_count == 2
    assert a.equals(Table.from_dict({"f": np.array([np.nan, np.nan])}))
    inf = Table.from_pylist([{"f": float("inf")}])
    assert inf.row(0).f == float("inf")  # inf is a value


# -- relational building blocks ---------------------------------------------------------------------


def test_take_and_filter():
    t = full_table()
    assert t.take([2, 0, 0]).qid.tolist() == [2, 0, 0]
    assert t.take([]).schema == t.schema
    with pytest.raises(IndexError, match="row position -1 out of range"):
        t.take([-1])  # never "the last row"
    with pytest.raises(IndexError):
        t.take([3])
    assert t.filter([True, False, True]).qid.tolist() == [0, 2]
    with pytest.raises(ValueError, match="filter mask has shape"):
        t.filter([True])


def test_a_filter_keeping_every_row_is_the_table_itself():
    t = full_table()
    assert t.filter([True, True, True]) is t  # no copy: the same rows, the same qid array
    kept = t.filter([True, True, False])
    assert kept is not t and kept.qid.tolist() == [0, 1]


@pytest.mark.parametrize(
    "kind_values",
    [
        ("int", [1, 2]),
        ("float", [1.5, 2.5]),
        ("bool", [True, False]),
        ("str", ["a", "b"]),
        ("bytes", [b"a", b"b"]),
        ("null", [None, None]),
        ("tensor", [np.ones(2), np.zeros(2)]),
    ],
)
def test_column_take_minus_one_gives_missing_for_every_kind(kind_values):
    kind, values = kind_values
    ctype, arr, valid = __import__("flow.types", fromlist=["build_column"]).build_column(values, "c")
    col = Column(ctype, arr, valid)
    out = col.take(np.array([1, -1, 0]))
    assert out.type == ctype
    got = out.to_list()
    assert got[1] is None
    assert (got[0] is None) == (kind == "null")
    empty = Column(ctype, arr[:0], None).take(np.array([-1, -1]))
    assert empty.to_list() == [None, None] and empty.type == ctype
    with pytest.raises(IndexError):
        Column(ctype, arr[:0], None).take(np.array([0]))


def test_column_keeps_float_storage_nan_where_missing():
    col = Column(ColumnType("float"), np.array([1.0, 2.0]), np.array([True, False]))
    assert np.isnan(col.values[1]) and col.to_list() == [1.0, None]
    assert Column(ColumnType("float"), np.array([np.nan])).valid.tolist() == [False]
    with pytest.raises(SchemaError, match="validity mask"):
        Column(ColumnType("int"), np.array([1, 2]), np.array([True]))
    as_float = Column(ColumnType("int"), np.array([1, 2]), np.array([True, False])).as_type(ColumnType("float"))
    assert as_float.to_list() == [1.0, None] and np.isnan(as_float.values[1])


def test_concat_unifies_types_and_keeps_order():
    a = Table.from_dict({"x": [1], "t": [None]}, qid=[1])
    b = Table.from_dict({"t": [np.ones(2)], "x": [2.5]}, qid=[0])
    c = Table.concat([a, b])
    assert c.columns == ("x", "t") and c.schema["x"].kind == "float" and c.schema["t"] == T2
    assert c.to_pylist()[0]["t"] is None and c.qid.tolist() == [1, 0]
    with pytest.raises(SchemaError, match="cannot concatenate"):
        Table.concat([a, Table.from_dict({"x": [1]})])
    with pytest.raises(DataTypeError, match="column 'x': cannot combine"):
        Table.concat([a, Table.from_dict({"x": ["s"], "t": [None]})])


def test_one_row_tensor_from_a_frozen_array_is_shared_read_only_and_safe_to_combine():
    # a read-only array backed by bytes, like a KVS cache hit: the Table shares it (no copy)
    value = np.frombuffer(np.arange(6, dtype=np.float32).tobytes(), dtype=np.float32).reshape(2, 3)
    t = Table.from_pylist([{"x": 1, "emb": value}], qid=[5])
    assert t.schema["emb"] == ColumnType.tensor(np.float32, (2, 3))
    assert np.shares_memory(t["emb"], value) and np.shares_memory(t.row(0).emb, value)
    with pytest.raises(ValueError, match="read-only"):
        t["emb"][0, 0, 0] = 99.0  # the Table refuses writes into the shared value
    with pytest.raises(ValueError, match="read-only"):
        t.row(0).emb[0, 0] = 99.0
    other = Table.from_pylist([{"x": 2, "emb": np.ones((2, 3), dtype=np.float32)}], qid=[6])
    both = Table.concat([t, other])
    assert both["emb"].tolist() == [value.tolist(), np.ones((2, 3)).tolist()]
    taken = t.take([0, 0])
    assert taken["emb"].tolist() == [value.tolist()] * 2
    outer = t.column("emb").take(np.array([-1, 0]))  # the missing row is written with zeros
    assert outer.to_list()[0] is None and outer.values[0].tolist() == [[0.0] * 3] * 2
    widened = t.column("emb").as_type(ColumnType.tensor(np.float64, (2, 3)))
    assert widened.values.dtype == np.float64 and widened.values[0].tolist() == value.tolist()
    for arr in (both["emb"], taken["emb"], outer.values, widened.values):  # fresh, writable
        assert not np.shares_memory(arr, value)
        arr[...] = -1.0
    assert value.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]  # the shared value never changed
    assert t == Table.from_pylist([{"x": 1, "emb": value.copy()}], qid=[5])
    assert Table.from_arrow(t.to_arrow(), qid="qid") == t


def test_split_by_qid_and_sort():
    t = Table.from_dict({"x": [1, 2, 3, 4]}, qid=[7, 3, 7, 3])
    parts = t.split_by_qid()
    assert list(parts) == [3, 7]
    assert parts[7]["x"].tolist() == [1, 3] and parts[3]["x"].tolist() == [2, 4]
    assert Table.from_pylist([]).split_by_qid() == {}
    assert t.sort_by_qid().qid.tolist() == [3, 3, 7, 7]


def test_select_with_columns_with_qid_and_equals():
    t = Table.from_dict({"a": [1, 2], "b": ["x", "y"]})
    assert t.select(["b"]).columns == ("b",)
    assert t.with_qid([5, 6]).qid.tolist() == [5, 6]
    assert t.with_columns({"c": t.column("a")}).columns == ("a", "b", "c")
    assert t.with_columns({"c": t.column("a")}, keep=False).columns == ("c",)
    assert t == Table.from_dict({"a": [1, 2], "b": ["x", "y"]})
    assert t != Table.from_dict({"b": ["x", "y"], "a": [1, 2]})  # column order matters
    assert t != t.with_qid([0, 2]) and t != Table.from_dict({"a": [1.0, 2.0], "b": ["x", "y"]})
    assert repr(t).splitlines()[-1] == "[2 rows x 2 columns] a: int, b: str"
    with pytest.raises(TypeError):
        hash(t)


def test_cells_are_python_values_of_their_kind():
    t = Table.from_pylist(
        [
            {"i": 1, "f": 0.5, "b": True, "s": "x", "y": b"\x00", "n": None},
            {"i": 2, "f": None, "b": False, "s": "", "y": b"", "n": None},
        ]
    )
    rows = [r.as_dict() for r in t.rows()]
    assert rows == [
        {"i": 1, "f": 0.5, "b": True, "s": "x", "y": b"\x00", "n": None},
        {"i": 2, "f": None, "b": False, "s": "", "y": b"", "n": None},
    ]
    assert [type(v) for v in rows[0].values()] == [int, float, bool, str, bytes, type(None)]
    row = next(iter(t.rows()))
    assert (type(row.i), type(row.f), type(row.b)) == (int, float, bool)


def test_an_operator_output_column_is_what_the_constructor_makes():

    for values in ([1.0, float("nan"), None], [0.5, 2.0], np.array([1.5, np.nan], dtype=np.float32), [1, 2], ["a"]):
        ctype, arr, valid = build_column(values, "c")
        a, b = built_column(ctype, arr, valid), Column(ctype, arr, valid)
        assert a.type == b.type and a.equals(b) and (a.valid is None) == (b.valid is None)
        assert a.values.dtype == b.values.dtype


def test_repr_shows_the_first_and_last_rows_with_their_values_like_pandas():
    """``print(table)`` shows values: every row up to 10, else the first and last five
    around a line of ``...``; long values cut; the columns that fit; the types at the end."""
    t = Table.from_pylist(
        [
            {
                "cls": i,
                "conf": 0.5 + i / 100 if i != 3 else None,
                "s": "w" * (5 * i),
                "img": np.full((28, 28), i, np.uint8),
            }
            for i in range(25)
        ]
    )
    lines = repr(t).splitlines()
    assert lines[0].split() == ["qid", "cls", "conf", "s", "img"]
    assert lines[1].split()[:3] == ["0", "0", "0.5"] and lines[4].split()[:3] == ["3", "3", "None"]
    assert lines[6].split() == ["..."] * 5  # rows 5..19 left out
    assert lines[11].split()[:3] == ["24", "24", "0.74"] and len(lines) == 13
    assert all(len(line) <= 110 for line in lines[:-1])
    assert "w" * 27 + "..." in lines[-2]  # a long string cut to 30 characters
    assert lines[-1] == "[25 rows x 4 columns] cls: int, conf: float, s: str, img: tensor[uint8, (28, 28)]"
    small = Table.from_pylist([{"x": 1}])
    assert repr(small) == "qid  x\n  0  1\n[1 row x 1 column] x: int"
    wide = Table.from_dict({f"c{i}": [1.5] for i in range(40)})
    head = repr(wide).splitlines()[0]
    assert head.startswith("qid   c0   c1") and head.endswith("  ...") and len(head) <= 115


def _list_cases():
    import pyarrow as pa

    img = [[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10], [11, 12]]]
    yield "uint8 lists of lists", pa.array(img, pa.list_(pa.list_(pa.uint8())))
    yield "int64", pa.array(img, pa.list_(pa.list_(pa.int64())))
    yield "float32", pa.array([[0.5, 1.5], [2.5, -1.0]], pa.list_(pa.float32()))
    yield "int64 beyond a byte", pa.array([[300, -1], [2, 3]], pa.list_(pa.int64()))
    yield "bool", pa.array([[True, False], [False, False]], pa.list_(pa.bool_()))
    yield "large list", pa.array(img, pa.large_list(pa.list_(pa.int16())))
    yield "fixed size inside a list", pa.array(img, pa.list_(pa.list_(pa.int32(), 2)))
    yield "sliced", pa.array(img, pa.list_(pa.list_(pa.uint8()))).slice(1, 2)
    yield "uint64: the Python path", pa.array([[2**64 - 1, 1]], pa.list_(pa.uint64()))
    yield "ragged: the Python path", pa.array([[1, 2], [3]], pa.list_(pa.int64()))
    yield "a null row: the Python path", pa.array([[1, 2], None], pa.list_(pa.int64()))
    yield "a null value: the Python path", pa.array([[1, None]], pa.list_(pa.int64()))
    yield "empty lists: the Python path", pa.array([[], []], pa.list_(pa.int64()))


@pytest.mark.parametrize("case", list(_list_cases()), ids=[c[0] for c in _list_cases()])
def test_list_columns_from_arrow_make_the_rows_their_python_values_make(case):
    """A regular list column is read without making each row's Python lists; the rows, and
    so the column and its errors, are what np.asarray makes of those lists."""
    import pyarrow as pa

    from flow.table import _arrow_column_values

    _name, arr = case
    want = [None if v is None else np.asarray(v) for v in arr.to_pylist()]
    got = _arrow_column_values(pa.chunked_array([arr]), "v")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if w is not None:
            assert g.dtype == w.dtype and g.shape == w.shape and (g == w).all()
    try:
        expected = Table.from_dict({"v": want})
    except DataError as e:
        with pytest.raises(type(e), match=re.escape(str(e))):
            Table.from_arrow(pa.table({"v": arr}))
    else:
        assert Table.from_arrow(pa.table({"v": arr})) == expected


_DECLARED = [
    ColumnType.tensor(np.uint8, (2, 2)),
    ColumnType.tensor(np.float32, (2, 2)),
    ColumnType.tensor(np.int16, (2, 2)),
    ColumnType.tensor(np.bool_, (2, 2)),
    ColumnType.tensor(np.uint8, (2,)),
    ColumnType.tensor(np.float64, (2,)),
    ColumnType.tensor(np.uint8, (4,)),  # the wrong shape for every case
    ColumnType("int"),  # not a tensor: the rows' own type error
]


@pytest.mark.parametrize("declared", _DECLARED, ids=str)
@pytest.mark.parametrize("case", list(_list_cases()), ids=[c[0] for c in _list_cases()])
def test_list_columns_from_arrow_under_a_declared_type_are_what_their_python_values_make(case, declared):
    """Declared a tensor whose dtype holds the list's leaves as they are, a regular list
    column is cast straight to it (no int64 detour); the column, or the error, is the
    one the rows' Python values give under the same schema, and the column is the
    Table's own (writable, not a view of the Arrow buffers)."""
    _name, arr = case
    schema = {"v": declared}
    try:
        expected = Table.from_dict(
            {"v": [None if v is None else np.asarray(v) for v in arr.to_pylist()]}, schema=schema
        )
    except DataError as e:
        with pytest.raises(type(e), match=re.escape(str(e))):
            Table.from_arrow(pa.table({"v": arr}), schema=schema)
        return
    got = Table.from_arrow(pa.table({"v": arr}), schema=schema)
    assert got == expected and got.schema == expected.schema
    values = got["v"]
    if isinstance(values, np.ndarray) and values.dtype != object:
        assert values.flags.writeable and values.flags.c_contiguous
        values[...] = 0  # the Table's own array: writing it leaves the request's buffers be
        assert Table.from_arrow(pa.table({"v": arr}), schema=schema) == expected
