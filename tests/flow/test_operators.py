"""Every operator, run through flow.run (and the bound-operator interface where it matters)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from flow import (
    ColumnType,
    DataTypeError,
    Flow,
    FlowValueError,
    LookupKeyError,
    NoValidResultError,
    OperatorFailedError,
    OperatorOutputError,
    RejectRow,
    RowRejectedError,
    SchemaError,
    Table,
)
from flow.operators import AnyOfOp, MapOp, choose_first_valid, is_valid, join_tables, read_many

ROWS = [{"x": 1, "s": "a"}, {"x": 2, "s": "b"}, {"x": 3, "s": None}]


def run(build, data=ROWS, schema=None, **kw) -> Table:
    flow = Flow("t", schema=schema)
    build(flow)
    return flow.run(data, **kw)


def pylist(table: Table) -> list[dict]:
    return table.to_pylist()


# -- map ------------------------------------------------------------------------------------------


def test_map_function_of_a_row_replaces_columns_and_keeps_qid():
    out = run(lambda f: f.map(lambda r: r.x * 2, names=["y"]))
    assert out.columns == ("y",)
    assert pylist(out) == [{"qid": 0, "y": 2}, {"qid": 1, "y": 4}, {"qid": 2, "y": 6}]


def test_map_tuple_result_and_reemitted_column():
    out = run(lambda f: f.map(lambda r: (r.x, r.s), names=["x", "s"]))
    assert pylist(out)[2] == {"qid": 2, "x": 3, "s": None}
    out = run(lambda f: f.map(lambda r: [r.x, 1.5], names=["x", "w"]))  # a list of len(names) too
    assert out.schema == {"x": ColumnType("int"), "w": ColumnType("float")}


def test_map_names_default_to_function_name_and_accept_a_string():
    def double(r):
        return r.x * 2

    assert run(lambda f: f.map(double)).columns == ("double",)
    assert run(lambda f: f.map(double, names="y")).columns == ("y",)


def test_map_col_passes_one_value():
    out = run(lambda f: f.map(lambda s: None if s is None else s.upper(), names=["S"], col="s"))
    assert out["S"].tolist() == ["A", "B", None]


def test_map_class_is_built_once_per_run():
    built = []

    class Model:
        def __init__(self):
            built.append(1)
            self.k = 10

        def __call__(self, row):
            return row.x + self.k

    out = run(lambda f: f.map(Model, names=["y"]))
    assert out["y"].tolist() == [11, 12, 13] and built == [1]


def test_map_init_result_is_the_first_argument():
    calls = []

    def load():
        calls.append(1)
        return {"bias": 100}

    out = run(lambda f: f.map(lambda state, r: r.x + state["bias"], names=["y"], init=load))
    assert out["y"].tolist() == [101, 102, 103] and calls == [1]


def test_map_returning_arrays_makes_a_tensor_column():
    out = run(lambda f: f.map(lambda r: np.full((2, 2), r.x, dtype=np.float32), names=["img"]))
    assert out.schema["img"] == ColumnType.tensor(np.float32, (2, 2))
    assert out["img"].shape == (3, 2, 2)


def test_map_none_results_are_missing_values():
    out = run(lambda f: f.map(lambda r: None if r.x == 2 else r.x / 2, names=["y"]))
    assert out.to_pylist(qid=False) == [{"y": 0.5}, {"y": None}, {"y": 1.5}]
    assert run(lambda f: f.map(lambda r: None, names=["y"])).schema == {"y": ColumnType("null")}


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda r: (r.x,), r"operator 'lambda' returned 1 values; expected a tuple of 2 values for \['a', 'b'\]"),
        (lambda r: r.x, "operator 'lambda' returned int; expected a tuple of 2 values"),
    ],
)
def test_map_wrong_arity_names_the_operator(fn, match):
    with pytest.raises(OperatorOutputError, match=match) as e:
        run(lambda f: f.map(fn, names=["a", "b"]))
    assert e.value.operator == "lambda" and e.value.qid == 0


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda r: object(), "operator 'lambda': column 'y': unsupported value type object"),
        (lambda r: 1 if r.x == 1 else "a", "operator 'lambda': column 'y': mixed value types"),
        (lambda r: True if r.x == 1 else 1, "operator 'lambda': column 'y': mixed value types"),
        (lambda r: np.ones(r.x), "operator 'lambda': column 'y': ragged tensor column"),
        (lambda r: 2**64, "operator 'lambda': column 'y': .* does not fit in int64"),
    ],
)
def test_map_wrong_output_types_name_the_operator_and_column(fn, match):
    with pytest.raises(OperatorOutputError, match=match):
        run(lambda f: f.map(fn, names=["y"]))


def test_map_exceptions_carry_operator_and_qid():
    def boom(r):
        if r.x == 2:
            raise ZeroDivisionError("nope")
        return r.x

    with pytest.raises(OperatorFailedError, match="operator 'boom' raised ZeroDivisionError: nope") as e:
        run(lambda f: f.map(boom, names=["y"]))
    assert e.value.operator == "boom" and e.value.qid == 1
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    # a flow error caused by the user's code (a missing column) also names the operator
    with pytest.raises(OperatorFailedError, match="operator 'lambda' raised AttributeError: row has no column 'zz'"):
        run(lambda f: f.map(lambda r: r.zz, names=["y"]))


def test_reject_row():
    def check(r):
        if r.x > 2:
            raise RejectRow("x must be <= 2")
        return r.x

    with pytest.raises(RowRejectedError, match="operator 'check' rejected the row: x must be <= 2") as e:
        run(lambda f: f.map(check, names=["y"]))
    assert e.value.qid == 2


def test_class_whose_constructor_fails():
    class Broken:
        def __init__(self):
            raise RuntimeError("no weights")

        def __call__(self, r):
            return 1

    with pytest.raises(OperatorFailedError, match="operator 'Broken': building it failed: RuntimeError: no weights"):
        run(lambda f: f.map(Broken, names=["y"]))


# -- map, batching ----------------------------------------------------------------------------------


def test_batching_map_gets_the_table_and_returns_columns():
    seen = []

    class Net:
        def __call__(self, table):
            seen.append(len(table))
            return table["x"] * 2, np.stack([table["x"], table["x"]], axis=1)

    out = run(lambda f: f.map(Net, names=["y", "v"], batching=True))
    assert seen == [3]
    assert out["y"].tolist() == [2, 4, 6] and out.schema["v"] == ColumnType.tensor(np.int64, (2,))


@pytest.mark.parametrize(
    "result",
    [
        lambda t: {"y": t["x"] + 1},
        lambda t: Table.from_dict({"y": t["x"] + 1, "extra": t["x"]}),
        lambda t: pd.DataFrame({"y": t["x"] + 1}),
        lambda t: [2, 3, 4],
        lambda t: pd.Series([2, 3, 4]),
    ],
)
def test_batching_map_result_forms(result):
    out = run(lambda f: f.map(result, names=["y"], batching=True))
    assert out.to_pylist() == [{"qid": 0, "y": 2}, {"qid": 1, "y": 3}, {"qid": 2, "y": 4}]


def test_batching_map_with_col_gets_the_column_array():
    out = run(lambda f: f.map(lambda xs: xs * 10, names=["y"], col="x", batching=True))
    assert out["y"].tolist() == [10, 20, 30]


@pytest.mark.parametrize(
    "result, match",
    [
        (lambda t: [1], "returned 1 rows for column 'y'; the input had 3"),
        (lambda t: 5, "returned a int for column 'y'; expected one value per input row"),
        (lambda t: {"z": [1, 2, 3]}, r"returned a dict without columns \['y'\]"),
        (lambda t: Table.from_dict({"z": [1, 2, 3]}), r"returned a Table without columns \['y'\]"),
        (lambda t: ([1, 2, 3],), "returned 1 columns; expected 2"),
    ],
)
def test_batching_map_wrong_results_name_the_operator(result, match):
    names = ["y", "w"] if "expected 2" in match else ["y"]
    with pytest.raises(OperatorOutputError, match=f"operator 'lambda'.*{match}"):
        run(lambda f: f.map(result, names=names, batching=True))


def test_batching_map_passing_columns_on_keeps_them_as_they_are():
    from flow.operators import batch_output

    table = Table.from_dict(
        {"i": [1, 2, 3], "f": [0.5, 1.5, 2.5], "t": np.arange(6, dtype=np.float32).reshape(3, 2), "s": ["a", "b", None]}
    )
    out = batch_output("pass", ["i", "f", "t", "renamed"], table, (table["i"], table["f"], table["t"], table["i"]))
    for name, source in (("i", "i"), ("f", "f"), ("t", "t"), ("renamed", "i")):
        assert out.column(name) is table.column(source)  # kept, not built again
    rebuilt = batch_output("copy", ["i", "f", "t"], table, (table["i"].copy(), table["f"].copy(), table["t"].copy()))
    assert out.select(["i", "f", "t"]).equals(rebuilt) and out.schema["t"] == rebuilt.schema["t"]
    assert batch_output("obj", ["s"], table, table["s"]).column("s") is not table.column("s")  # built again


@pytest.mark.parametrize("column, missing", [("f", np.nan), ("s", None)])
def test_batching_map_writing_a_missing_value_into_an_input_column_marks_it_missing(column, missing):
    data = [{"f": 0.5, "s": "a"}, {"f": 1.5, "s": "b"}, {"f": 2.5, "s": "c"}]

    def blank_the_second(t):
        values = t[column]
        values[1] = missing  # in place, into the array the input Table holds
        return values

    out = run(lambda f: f.map(blank_the_second, names=["y"], batching=True), data=data)
    assert out["y"].tolist()[1] is None or np.isnan(out["y"][1])
    assert out.to_pylist()[1]["y"] is None


def test_batching_operators_are_not_called_on_empty_tables():
    def never(t):
        raise AssertionError("called")

    out = run(lambda f: f.map(never, names=["y"], batching=True), data=[], schema={"x": int})
    assert len(out) == 0 and out.columns == ("y",)
    out = run(lambda f: f.filter(never, batching=True), data=[], schema={"x": int})
    assert len(out) == 0 and out.columns == ("x",)


# -- filter ---------------------------------------------------------------------------------------


def test_filter_keeps_rows_columns_types_and_qids():
    out = run(lambda f: f.filter(lambda r: r.x != 2))
    assert pylist(out) == [{"qid": 0, "x": 1, "s": "a"}, {"qid": 2, "x": 3, "s": None}]
    assert run(lambda f: f.filter(lambda r: False)).schema == Table.from_pylist(ROWS).schema


def test_filter_accepts_numpy_bools_and_rejects_truthy_values():
    assert len(run(lambda f: f.filter(lambda r: np.bool_(r.x > 1)))) == 2
    for bad in (lambda r: r.x, lambda r: None, lambda r: "yes"):
        with pytest.raises(OperatorOutputError, match="filter 'lambda' returned .*must return a bool") as e:
            run(lambda f, bad=bad: f.filter(bad))
        assert e.value.qid == 0


def test_batching_filter():
    assert run(lambda f: f.filter(lambda t: t["x"] > 1, batching=True))["x"].tolist() == [2, 3]
    assert run(lambda f: f.filter(lambda t: [True, False, False], batching=True))["x"].tolist() == [1]
    with pytest.raises(OperatorOutputError, match="must return 3 bools"):
        run(lambda f: f.filter(lambda t: [True], batching=True))


# -- groupby / agg ------------------------------------------------------------------------------------

G = [
    {"g": "b", "v": 1.0, "i": 1},
    {"g": "a", "v": None, "i": 2},
    {"g": "b", "v": 3.0, "i": None},
    {"g": None, "v": 10.0, "i": 10},
    {"g": "a", "v": 5.0, "i": 4},
]


@pytest.mark.parametrize(
    "fn, col, expected",
    [
        ("count", None, [2, 2]),
        ("count", "v", [1, 2]),
        ("sum", "v", [5.0, 4.0]),
        ("sum", "i", [6, 1]),
        ("min", "v", [5.0, 1.0]),
        ("max", "i", [4, 1]),
        ("mean", "v", [5.0, 2.0]),
        ("mean", "i", [3.0, 1.0]),
    ],
)
def test_groupby_agg(fn, col, expected):
    out = run(lambda f: f.groupby("g").agg(fn, col), data=G)
    name = fn if col is None else f"{fn}_{col}"
    assert out.columns == ("g", name)
    assert out["g"].tolist() == ["a", "b"]  # sorted by key; the row with no key is dropped
    assert out.qid.tolist() == [1, 0]  # the smallest qid of each group
    assert out[name].tolist() == expected


def test_agg_output_types_do_not_depend_on_the_data():
    def kinds(data):
        return {
            fn: run(lambda f, fn=fn: f.groupby("g").agg(fn, "i", name="out"), data=data, schema={"g": str, "i": int})
            .schema["out"]
            .kind
            for fn in ("count", "sum", "min", "mean")
        }

    full = kinds([{"g": "a", "i": 1}])
    assert full == {"count": "int", "sum": "int", "min": "int", "mean": "float"}
    assert kinds([{"g": "a", "i": None}]) == full  # an all-missing group
    assert kinds([]) == full  # no rows


def test_agg_of_missing_values():
    data = [{"g": 1, "v": None}]
    out = run(lambda f: f.groupby("g").agg("sum", "v"), data=data, schema={"g": int, "v": float})
    assert out["sum_v"].tolist() == [0.0]  # like pandas: the sum of nothing is 0
    for fn in ("min", "max", "mean"):
        out = run(lambda f, fn=fn: f.groupby("g").agg(fn, "v"), data=data, schema={"g": int, "v": float})
        assert out.to_pylist() == [{"qid": 0, "g": 1, f"{fn}_v": None}]


def test_agg_whole_table_and_empty_input():
    out = run(lambda f: f.agg("sum", "x"))
    assert out.to_pylist() == [{"qid": 0, "sum_x": 6}]
    out = run(lambda f: f.agg("count"), data=[], schema={"x": int})
    assert len(out) == 0 and out.schema == {"count": ColumnType("int")}  # no rows: no group
    out = run(lambda f: f.groupby("x").agg("max", "s"), data=[], schema={"x": int, "s": str})
    assert out.schema == {"x": ColumnType("int"), "max_s": ColumnType("str")}


def test_agg_when_every_key_is_missing():
    out = run(lambda f: f.groupby("k").agg("count"), data=[{"k": None}], schema={"k": int})
    assert len(out) == 0 and out.columns == ("k", "count")


def test_agg_name_and_kinds():
    out = run(lambda f: f.groupby("s").agg("max", "x", name="top"))
    assert out.columns == ("s", "top")
    bools = run(lambda f: f.agg("sum", "b"), data=[{"b": True}, {"b": True}, {"b": False}])
    assert bools["sum_b"].tolist() == [2] and bools.schema["sum_b"].kind == "int"
    groups = run(lambda f: f.groupby("b").agg("count"), data=[{"b": True}, {"b": False}])
    assert groups["b"].tolist() == [False, True]
    strs = run(lambda f: f.agg("min", "s"), data=[{"s": "b"}, {"s": "a"}, {"s": None}])
    assert strs["min_s"].tolist() == ["a"]
    raw = run(lambda f: f.agg("max", "y"), data=[{"y": b"a"}, {"y": b"b"}])
    assert raw["max_y"].tolist() == [b"b"]


def test_agg_of_tensors_is_elementwise():
    data = [{"t": np.array([1, 5])}, {"t": np.array([3, 2])}, {"t": None}]
    assert run(lambda f: f.agg("sum", "t"), data=data).row(0).sum_t.tolist() == [4, 7]
    assert run(lambda f: f.agg("min", "t"), data=data).row(0).min_t.tolist() == [1, 2]
    mean = run(lambda f: f.agg("mean", "t"), data=data)
    assert mean.row(0).mean_t.tolist() == [2.0, 3.5] and mean.schema["mean_t"].dtype == np.float64
    with pytest.raises(DataTypeError, match="cannot group by a tensor column"):
        run(lambda f: f.groupby("t").agg("count"), data=data)


def test_agg_errors_name_the_operator():
    with pytest.raises(DataTypeError, match="operator 'sum_s': cannot sum the str column 's'"):
        run(lambda f: f.agg("sum", "s"))
    with pytest.raises(
        DataTypeError,
        match=r"operator 'sum_x': the sum of column 'x' \(18446744073709551614\) "
        "does not fit in int64",
    ):
        run(lambda f: f.agg("sum", "x"), data=[{"x": 2**63 - 1}, {"x": 2**63 - 1}])
    near = run(lambda f: f.agg("sum", "x"), data=[{"x": 2**62}, {"x": 2**62 - 1}, {"x": -5}])
    assert near["sum_x"].tolist() == [2**63 - 6]


# -- join -----------------------------------------------------------------------------------------


def two_sides(left_rows, right_rows, schema=None):
    """A flow whose input has a 'side' column; returns (flow, left node, right node)."""
    flow = Flow("j")
    cols_l = [c for c in left_rows[0] if c != "side"] if left_rows else ["k", "a"]
    cols_r = [c for c in right_rows[0] if c != "side"] if right_rows else ["k", "b"]
    left = flow.filter(lambda r: r.side == 0).map(lambda r: tuple(r[c] for c in cols_l), names=cols_l)
    right = flow.filter(lambda r: r.side == 1).map(lambda r: tuple(r[c] for c in cols_r), names=cols_r)
    every = dict.fromkeys(cols_l + cols_r)
    data = [dict(every, **r, side=0) for r in left_rows] + [dict(every, **r, side=1) for r in right_rows]
    return flow, left, right, data


L = [{"k": 1, "a": "l1"}, {"k": 2, "a": "l2"}, {"k": None, "a": "l3"}, {"k": 1, "a": "l4"}]
R = [{"k": 1, "b": "r1"}, {"k": 3, "b": "r2"}, {"k": 1, "b": "r3"}, {"k": None, "b": "r4"}]


def joined(how, on="k", left=L, right=R, **kw):
    flow, l_node, r_node, data = two_sides(left, right)
    l_node.join(r_node, on=on, how=how, **kw)
    return flow.run(data)


def test_inner_join_on_a_key_with_duplicates():
    out = joined("inner")
    assert out.columns == ("k", "a", "b")
    assert [(r["qid"], r["k"], r["a"], r["b"]) for r in out.to_pylist()] == [
        (0, 1, "l1", "r1"),
        (0, 1, "l1", "r3"),
        (3, 1, "l4", "r1"),
        (3, 1, "l4", "r3"),
    ]


def test_left_join_keeps_unmatched_left_rows_in_order():
    out = joined("left")
    assert [(r["a"], r["b"]) for r in out.to_pylist()] == [
        ("l1", "r1"),
        ("l1", "r3"),
        ("l2", None),
        ("l3", None),
        ("l4", "r1"),
        ("l4", "r3"),
    ]


def test_outer_join_appends_unmatched_right_rows_with_their_key_and_qid():
    out = joined("outer")
    tail = out.to_pylist()[6:]
    assert [(r["qid"], r["k"], r["a"], r["b"]) for r in tail] == [(5, 3, None, "r2"), (7, None, None, "r4")]


def test_missing_keys_never_match():
    out = joined("inner", left=[{"k": None, "a": "x"}], right=[{"k": None, "b": "y"}])
    assert len(out) == 0
    out = joined("inner", left=[{"k": float("nan"), "a": "x"}], right=[{"k": float("nan"), "b": "y"}])
    assert len(out) == 0


def test_join_on_qid_pairs_rows_of_the_same_query_and_suffixes_clashes():
    flow = Flow("q")
    a = flow.map(lambda r: (r.x, r.x * 10), names=["x", "p"])
    b = flow.filter(lambda r: r.x != 2).map(lambda r: (r.x + 100, r.s), names=["x", "s"])
    node = a.join(b, how="left")
    out = flow.run(ROWS)
    assert node.columns == out.columns == ("x", "p", "x_right", "s")
    assert out.to_pylist() == [
        {"qid": 0, "x": 1, "p": 10, "x_right": 101, "s": "a"},
        {"qid": 1, "x": 2, "p": 20, "x_right": None, "s": None},
        {"qid": 2, "x": 3, "p": 30, "x_right": 103, "s": None},
    ]


def test_join_custom_suffixes_and_column_order_matches_build_time():
    flow = Flow("q", schema={"k": int, "v": int})
    a = flow.map(lambda r: (r.v, r.k), names=["v", "k"])
    b = flow.map(lambda r: (r.k, r.v), names=["k", "v"])
    node = a.join(b, on="k", suffixes=("_l", "_r"))
    out = flow.run([{"k": 1, "v": 2}])
    assert node.columns == out.columns == ("v_l", "k", "v_r")
    assert out.to_pylist() == [{"qid": 0, "v_l": 2, "k": 1, "v_r": 2}]


def test_join_on_several_keys():
    flow = Flow("m", schema={"a": int, "b": str})
    flow.map(lambda r: (r.a, r.b, 1), names=["a", "b", "x"]).join(
        flow.filter(lambda r: r.a > 1).map(lambda r: (r.a, r.b, 2), names=["a", "b", "y"]), on=["a", "b"]
    )
    out = flow.run([{"a": 1, "b": "p"}, {"a": 2, "b": "q"}, {"a": 2, "b": None}])
    assert out.to_pylist() == [{"qid": 1, "a": 2, "b": "q", "x": 1, "y": 2}]


def test_join_key_types():
    left = Table.from_pylist([{"k": 1, "a": "x"}])
    right = Table.from_pylist([{"k": 1.0, "b": "y"}, {"k": 2.5, "b": "z"}])
    out = join_tables(left, right, ("k",), "outer", ("", "_right"))
    assert out.schema["k"].kind == "float" and out["k"].tolist() == [1.0, 2.5]  # 2.5 is not truncated
    assert out["b"].tolist() == ["y", "z"]
    nulls = join_tables(left, Table.from_pylist([{"k": None, "b": "n"}]), ("k",), "outer", ("", "_right"))
    assert nulls.schema["k"].kind == "int" and [r["k"] for r in nulls.to_pylist()] == [1, None]
    with pytest.raises(DataTypeError, match="operator 'join': key column 'k' is bool on the left and int"):
        join_tables(Table.from_pylist([{"k": True}]), Table.from_pylist([{"k": 1}]), ("k",), "inner", ("", "_r"))


def test_join_tables_directly_and_its_errors():
    left = Table.from_dict({"k": [1, 2], "t": [np.ones(2), np.ones(2)]})
    right = Table.from_dict({"k": [2], "t": [np.zeros(2)]}, qid=[9])
    out = join_tables(left, right, ("k",), "outer", ("", "_right"))
    assert out.qid.tolist() == [0, 1] and out.row(0).t_right is None
    with pytest.raises(DataTypeError, match="cannot join on the tensor column 't'"):
        join_tables(left, right, ("t",), "inner", ("", "_r"))
    with pytest.raises(SchemaError, match="operator 'join': right input has no column 'k'"):
        join_tables(left, Table.from_dict({"a": [1]}), ("k",), "inner", ("", "_r"))
    with pytest.raises(SchemaError, match="output column 'k_r' appears twice"):
        join_tables(Table.from_dict({"k": [1], "k_r": [1]}), Table.from_dict({"k": [1]}), ("qid",), "inner", ("", "_r"))


def test_join_of_empty_inputs():
    empty = Table.from_dict({"k": np.array([], dtype=np.int64), "a": np.array([], dtype=np.float64)})
    full = Table.from_dict({"k": [1], "b": ["x"]})
    for how in ("inner", "left", "outer"):
        out = join_tables(empty, full, ("k",), how, ("", "_right"))
        assert out.columns == ("k", "a", "b")
        assert len(out) == (1 if how == "outer" else 0)
    out = join_tables(full, empty, ("k",), "left", ("", "_right"))
    assert out.to_pylist() == [{"qid": 0, "k": 1, "b": "x", "a": None}]


# -- union ------------------------------------------------------------------------------------------


def test_union_appends_rows_aligns_columns_and_unifies_types():
    def build(f):
        a = f.map(lambda r: (r.x, r.s), names=["x", "s"])
        b = f.filter(lambda r: r.x > 1).map(lambda r: (r.s, r.x * 0.5), names=["s", "x"])
        a.union(b)

    out = run(build)
    assert out.columns == ("x", "s") and out.schema["x"].kind == "float"
    assert out.qid.tolist() == [0, 1, 2, 1, 2]
    assert out["x"].tolist() == [1.0, 2.0, 3.0, 1.0, 1.5]


def test_union_of_three_and_errors():
    def build(f):
        f.map(lambda r: r.x, names=["y"]).union(f.map(lambda r: 1, names=["y"]), f.map(lambda r: 2, names=["y"]))

    assert len(run(build)) == 9
    with pytest.raises(DataTypeError, match="operator 'union': column 'y': cannot combine int with str"):
        run(lambda f: f.map(lambda r: 1, names=["y"]).union(f.map(lambda r: "a", names=["y"])))
    with pytest.raises(SchemaError, match="operator 'union': cannot concatenate"):
        run(lambda f: f.filter(lambda r: True).union(f.map(lambda r: 1, names=["y"])))


# -- lookup --------------------------------------------------------------------------------------------

STORE = {"cfg": "v1", "u:a": 1.5, "u:b": 2, "vec": np.ones(3)}


def test_lookup_fixed_key_adds_a_column_and_keeps_the_others():
    out = run(lambda f: f.lookup("cfg"), kvs=STORE)
    assert out.columns == ("x", "s", "cfg") and out["cfg"].tolist() == ["v1"] * 3
    out = run(lambda f: f.lookup("vec", name="emb"), kvs=STORE)
    assert out.schema["emb"] == ColumnType.tensor(np.float64, (3,))


def test_lookup_per_row_key_from_a_column():
    data = [{"u": "u:a"}, {"u": "u:b"}, {"u": "u:a"}]
    out = run(lambda f: f.lookup(column="u", name="score"), data=data, kvs=STORE)
    assert out["score"].tolist() == [1.5, 2.0, 1.5]
    assert run(lambda f: f.lookup(column="u"), data=data, kvs=STORE).columns == ("u", "u_value")


def test_lookup_of_one_row_shares_a_read_only_stored_array():
    # a KVS cache hit is a read-only array backed by bytes: a 1-row lookup does not copy it
    vec = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), dtype=np.float32)
    store = {"k": vec, "j": np.ones(4, dtype=np.float32)}
    out = run(lambda f: f.lookup(column="u", name="v"), data=[{"u": "k"}], kvs=store)
    assert out.schema["v"] == ColumnType.tensor(np.float32, (4,)) and np.shares_memory(out["v"], vec)

    def total(f):
        v = f.lookup(column="u", name="v")
        s = v.map(lambda x: float(x.sum()), names=["s"], col="v")
        b = v.map(lambda xs: xs * 2, names=["d"], col="v", batching=True)
        return s.join(b).join(v)

    out = run(total, data=[{"u": "k"}], kvs=store)
    assert out.to_pylist()[0]["s"] == 6.0 and out["d"].tolist() == [[0.0, 2.0, 4.0, 6.0]]
    assert np.shares_memory(out["v"], vec)  # still shared after the joins
    out = run(lambda f: f.lookup(column="u", name="v"), data=[{"u": "k"}, {"u": "j"}, {"u": "k"}], kvs=store)
    assert out["v"].tolist() == [vec.tolist(), [1.0] * 4, vec.tolist()]
    assert not np.shares_memory(out["v"], vec) and out["v"].flags.writeable  # rows: one new array
    assert vec.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_lookup_missing_keys_error_or_none():
    data = [{"u": "u:a"}, {"u": "u:zz"}, {"u": None}]
    with pytest.raises(LookupKeyError, match=r"operator 'lookup\(u\)': key 'u:zz' is not in the store") as e:
        run(lambda f: f.lookup(column="u", name="v"), data=data, kvs=STORE)
    assert e.value.qid == 1 and e.value.operator == "lookup(u)" and isinstance(e.value, KeyError)
    with pytest.raises(LookupKeyError, match="column 'u' is missing"):
        run(lambda f: f.lookup(column="u", name="v"), data=data[2:], kvs=STORE)
    out = run(lambda f: f.lookup(column="u", name="v", missing="null"), data=data, kvs=STORE)
    assert [r["v"] for r in out.to_pylist()] == [1.5, None, None]
    with pytest.raises(LookupKeyError, match="key 'nope' is not in the store"):
        run(lambda f: f.lookup("nope"), kvs=STORE)


def test_lookup_store_forms_and_errors():
    class FakeKVS:  # the kvs client's interface: mget(keys, default=sentinel)
        def __init__(self):
            self.calls = []

        def mget(self, keys, default=None):
            self.calls.append(list(keys))
            return [STORE.get(k, default) for k in keys]

    kvs = FakeKVS()
    data = [{"u": "u:a"}, {"u": "u:a"}, {"u": "u:zz"}]
    out = run(lambda f: f.lookup(column="u", name="v", missing="null"), data=data, kvs=kvs)
    assert [r["v"] for r in out.to_pylist()] == [1.5, 1.5, None]
    assert kvs.calls == [["u:a", "u:zz"]]  # one batched read of the distinct keys
    assert read_many(STORE, []) == []
    with pytest.raises(FlowValueError, match=r"operator 'lookup\(cfg\)' reads the store: pass kvs="):
        run(lambda f: f.lookup("cfg"))
    with pytest.raises(DataTypeError, match="lookup keys must be str or bytes, got int 1"):
        run(lambda f: f.lookup(column="x", name="v"), kvs=STORE)
    with pytest.raises(SchemaError, match="output column 'x' already exists"):
        run(lambda f: f.lookup("cfg", name="x"), kvs=STORE)
    with pytest.raises(OperatorOutputError, match="column 'v': unsupported value type dict"):
        run(lambda f: f.lookup("d", name="v"), kvs={"d": {"a": 1}})


def test_lookup_on_empty_input():
    out = run(lambda f: f.lookup(column="u", name="v"), data=[], schema={"u": str}, kvs=STORE)
    assert len(out) == 0 and out.columns == ("u", "v")


# -- anyof ----------------------------------------------------------------------------------------------


def small(r):
    return r.x * 10, 0.5 if r.x == 1 else 0.95


def medium(r):
    return r.x * 100, 0.9


def large(r):
    return r.x * 1000, 0.99


def test_anyof_takes_the_first_valid_in_argument_order():
    out = run(lambda f: f.anyof(small, medium, large, names=["y", "conf"], valid=lambda r: r.conf > 0.85))
    assert out.to_pylist() == [
        {"qid": 0, "y": 100, "conf": 0.9},
        {"qid": 1, "y": 20, "conf": 0.95},
        {"qid": 2, "y": 30, "conf": 0.95},
    ]
    out = run(lambda f: f.anyof(large, small, names=["y", "conf"]))  # no valid=: the first alternative
    assert out["y"].tolist() == [1000, 2000, 3000]


def test_anyof_runs_all_alternatives_locally():
    calls = []

    def a(r):
        calls.append("a")
        return r.x

    def b(r):
        calls.append("b")
        return r.x

    run(lambda f: f.anyof(a, b, names=["y"]))
    assert calls.count("a") == 3 and calls.count("b") == 3


def test_anyof_failing_alternative_counts_as_invalid():
    def broken(r):
        raise RuntimeError("gpu lost")

    out = run(lambda f: f.anyof(broken, medium, names=["y", "conf"]))
    assert out["y"].tolist() == [100, 200, 300]


def test_anyof_no_valid_result_is_a_clear_error():
    def broken(r):
        raise RuntimeError("gpu lost")

    with pytest.raises(
        NoValidResultError,
        match="no alternative gave a valid result for 1 of 3 rows "
        r"\(small: result not valid; medium: result not valid\)",
    ) as e:
        run(lambda f: f.anyof(small, medium, names=["y", "conf"], valid=lambda r: r.conf > 0.92))
    assert e.value.qid == 0 and e.value.operator == "anyof(small,medium)"
    with pytest.raises(NoValidResultError, match="broken: operator 'broken' raised RuntimeError: gpu lost"):
        run(lambda f: f.anyof(broken, broken, names=["y"]))
    with pytest.raises(NoValidResultError):  # every alternative failed: an error even on no rows
        choose_first_valid(
            AnyOfOp(alternatives=(small, medium), names=("y",)),
            "any",
            Table.empty(),
            [RuntimeError("a"), RuntimeError("b")],
        )


def test_anyof_valid_errors_and_result_types():
    with pytest.raises(OperatorFailedError, match="valid= raised AttributeError"):
        run(lambda f: f.anyof(small, medium, names=["y", "conf"], valid=lambda r: r.zz))
    mixed = run(lambda f: f.anyof(lambda r: r.x, lambda r: r.x * 1.5, names=["y"], valid=lambda r: r.y > 1.4))
    assert mixed.schema["y"].kind == "float" and mixed["y"].tolist() == [1.5, 2.0, 3.0]
    with pytest.raises(OperatorOutputError, match="alternatives' results do not fit together"):
        run(lambda f: f.anyof(lambda r: r.x, lambda r: "s", names=["y"], valid=lambda r: r.y != 1))


def test_anyof_batching_and_empty():
    out = run(
        lambda f: f.anyof(lambda t: t["x"], lambda t: t["x"] * 10, names=["y"], batching=True, valid=lambda r: r.y > 1)
    )
    assert out["y"].tolist() == [10, 2, 3]
    out = run(lambda f: f.anyof(small, medium, names=["y", "conf"]), data=[], schema={"x": int})
    assert len(out) == 0 and out.columns == ("y", "conf")


def test_choose_first_valid_is_vectorised_and_keeps_row_order():
    op = AnyOfOp(alternatives=(small, medium), names=("y",), valid=lambda r: r.y % 2 == 0)
    n = 5000
    table = Table.from_dict({"x": np.arange(n)}, qid=np.arange(n) + 100)
    a = Table.from_dict({"y": np.arange(n)}, qid=table.qid)  # valid on even rows
    b = Table.from_dict({"y": np.arange(n) * 2 + 1000}, qid=table.qid)  # always valid
    start = time.perf_counter()
    out = choose_first_valid(op, "any", table, [a, b])
    assert time.perf_counter() - start < 0.5
    expected = np.where(np.arange(n) % 2 == 0, np.arange(n), np.arange(n) * 2 + 1000)
    assert out["y"].tolist() == expected.tolist() and out.qid.tolist() == table.qid.tolist()
    assert is_valid(op, "any", a, 0) and not is_valid(op, "any", a, 1)
    with pytest.raises(OperatorOutputError, match="gave 1 rows for 5000 input rows"):
        choose_first_valid(op, "any", table, [a.take([0]), b])


# -- the bound-operator interface -------------------------------------------------------------------


def test_operators_instantiate_to_bound_callables():
    op = MapOp(fn=lambda r: r.x + 1, names=("y",))
    bound = op.instantiate()
    out = bound([Table.from_pylist(ROWS)], None)
    assert out["y"].tolist() == [2, 3, 4]
    assert op.describe() == "map lambda -> y" and op.rowwise and not op.batching


# -- performance ------------------------------------------------------------------------------------


def test_map_on_10k_rows_is_fast():
    flow = Flow("fast")
    flow.map(lambda r: r.x * 2 + 1, names=["y"]).filter(lambda r: r.y > 5)
    data = pd.DataFrame({"x": np.arange(10_000), "f": np.random.default_rng(0).random(10_000)})
    flow.run(data.head(10))  # warm up imports
    start = time.perf_counter()
    out = flow.run(data)
    elapsed = time.perf_counter() - start
    assert len(out) == 10_000 - 3
    assert elapsed < 1.0, f"map+filter on 10k rows took {elapsed:.2f}s"
