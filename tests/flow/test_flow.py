"""The Flow builder: node handles, build-time validation, sinks, and flow.run's inputs."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from flow import ColumnType, Flow, GroupedNode, Node, Table
from flow.errors import (
    DataTypeError,
    FlowDefinitionError,
    FlowTypeError,
    FlowValueError,
    LookupKeyError,
    SchemaError,
)
from flow.operators import AggOp, FilterOp, JoinOp, LookupOp, MapOp, SourceOp, UnionOp
from flow.reference import ancestors, run_nodes

SCHEMA = {"x": int, "s": str}


def ident(r):
    return r.x


# -- building -----------------------------------------------------------------------------------


def test_each_operator_returns_a_new_node_and_branches_share_parents():
    flow = Flow("b", schema=SCHEMA)
    a = flow.map(ident, names=["y"])
    b = a.filter(lambda r: r.y > 0)
    c = a.map(lambda r: r.y * 2, names=["z"])
    assert isinstance(a, Node) and a is not b and b.inputs == (a,) and c.inputs == (a,)
    assert flow.nodes[0] is flow.source and isinstance(flow.source.op, SourceOp)
    assert [n.id for n in flow.nodes] == [0, 1, 2, 3]
    assert isinstance(a.op, MapOp) and isinstance(b.op, FilterOp)
    assert a.name == "ident" and b.name == "lambda" and c.name == "lambda#2"  # unique names
    assert "ident" in repr(a) and repr(flow) == "Flow('b', 3 operators)"


def test_known_columns_propagate():
    flow = Flow("c", schema=SCHEMA)
    assert flow.source.columns == ("x", "s")
    assert flow.filter(lambda r: True).columns == ("x", "s")
    assert flow.map(ident, names=["a", "b"]).columns == ("a", "b")
    assert flow.lookup("k").columns == ("x", "s", "k")
    assert flow.groupby("s").agg("sum", "x").columns == ("s", "sum_x")
    assert flow.agg("count").columns == ("count",)
    assert flow.anyof(ident, ident, names=["p"]).columns == ("p",)
    no_schema = Flow("d")
    assert no_schema.source.columns is None and no_schema.filter(lambda r: True).columns is None
    assert no_schema.map(ident, names=["y"]).columns == ("y",)  # a map's output is always known


def test_operator_objects_record_their_arguments():
    flow = Flow("o", schema={"k": int, "v": float})
    assert flow.groupby("k").agg("mean", "v").op == AggOp(fn="mean", col="v", by="k", name="mean_v")
    assert isinstance(flow.groupby("k"), GroupedNode)
    j = flow.join(flow.map(lambda r: r.k, names=["k"]), on="k", how="left")
    assert j.op == JoinOp(on=("k",), how="left", suffixes=("", "_right"))
    assert flow.lookup(column="k", name="kv", missing="null").op == LookupOp(
        key=None, column="k", name="kv", missing="null"
    )
    assert flow.union(flow.filter(lambda r: True)).op == UnionOp(arity=2)


def test_map_flags_are_recorded():
    node = Flow("f").map(ident, names=["y"], batching=True, gpu=True, high_variance=True)
    assert node.op.batching and node.op.gpu and node.op.high_variance
    assert "[batching, gpu, high_variance]" in node.op.describe()


def test_map_timeout_is_recorded_and_checked():
    node = Flow("f").map(ident, names=["y"], timeout_s=2)
    assert node.op.timeout_s == 2.0 and "timeout 2s" in node.op.describe()
    assert Flow("f").map(ident, names=["y"]).op.timeout_s is None
    with pytest.raises(FlowTypeError, match="timeout_s must be a number"):
        Flow("f").map(ident, names=["y"], timeout_s="2")
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(FlowValueError, match=r"map 'ident': timeout_s must be > 0"):
            Flow("f").map(ident, names=["y"], timeout_s=bad)


def test_building_is_thread_safe():
    flow = Flow("threads")

    def add():
        for _ in range(50):
            flow.map(ident, names=["y"])

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [n.name for n in flow.nodes]
    assert len(names) == 201 and len(set(names)) == 201


# -- build-time validation: each error is a FlowError naming the operator -----------------------------


def schema_flow():
    return Flow("v", schema={"x": int, "s": str, "t": ColumnType.tensor(np.float32, (2,))})


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda f: f.join(f.map(ident, names=["x"]), on="zz"), "operator join: on 'zz' is not a column of 'source'"),
        (lambda f: f.join(f.map(ident, names=["y"]), on="x"), r"operator join: on \(right side\) 'x' is not a column"),
        (lambda f: f.groupby("zz"), "operator groupby: column 'zz' is not a column of 'source'"),
        (lambda f: f.agg("sum", "zz"), "operator agg sum: column 'zz' is not a column"),
        (lambda f: f.groupby("x").agg("max", "zz"), "operator agg max by x: column 'zz'"),
        (lambda f: f.lookup(column="zz"), r"operator lookup\(zz\): column 'zz' is not a column"),
        (lambda f: f.map(ident, names=["y"], col="zz"), "operator map 'ident': col 'zz' is not a column"),
        (lambda f: f.map(ident, names=["y"]).groupby("x"), "operator groupby: column 'x' is not a column of 'ident'"),
    ],
)
def test_unknown_columns_are_errors_when_the_schema_is_known(build, match):
    with pytest.raises(FlowValueError, match=match) as e:
        build(schema_flow())
    assert isinstance(e.value, FlowValueError) and isinstance(e.value, ValueError)
    assert "its columns are" in str(e.value)


def test_unknown_columns_are_run_time_errors_without_a_schema():
    flow = Flow("late")
    flow.groupby("zz").agg("count")
    with pytest.raises(SchemaError, match="operator 'count_by_zz': input has no column 'zz'"):
        flow.run([{"x": 1}])
    flow = Flow("late2")
    flow.map(ident, names=["y"], col="zz")
    with pytest.raises(SchemaError, match="operator 'ident': input has no column 'zz'"):
        flow.run([{"x": 1}])


@pytest.mark.parametrize(
    "build, exc, match",
    [
        (lambda f: f.map(3, names=["y"]), FlowTypeError, "operator map: expected a function or class, got int 3"),
        (lambda f: f.filter("x > 1"), FlowTypeError, "operator filter: expected a function or class, got str"),
        (lambda f: f.anyof(ident, None, names=["y"]), FlowTypeError, "operator anyof: expected a function"),
        (lambda f: f.anyof(ident, ident, names=["y"], valid=1), FlowTypeError, r"operator anyof\(ident,ident\) valid"),
        (lambda f: f.map(ident, names=["y"], init=3), FlowTypeError, "operator map 'ident' init: expected a function"),
        (
            lambda f: f.map(lambda a, b: a, names=["y"]),
            FlowTypeError,
            "operator map 'lambda': fn 'lambda' must take 1 positional argument",
        ),
        (lambda f: f.map(ident, names=["y"], init=lambda: 1), FlowTypeError, "fn 'ident' must take 2 positional"),
        (lambda f: f.map(lambda s, r: 1, names=["y"], init=lambda cfg: 1), FlowTypeError, "init 'lambda' must take 0"),
        (lambda f: f.map(type("NoCall", (), {}), names=["y"]), FlowTypeError, "class 'NoCall' has no __call__"),
        (
            lambda f: f.map(
                type("NeedsArg", (), {"__init__": lambda self, w: None, "__call__": lambda self, r: 1}), names=["y"]
            ),
            FlowTypeError,
            "class 'NeedsArg' must be constructible without arguments",
        ),
        (
            lambda f: f.map(type("TwoArgs", (), {"__call__": lambda self, a, b: 1}), names=["y"]),
            FlowTypeError,
            r"TwoArgs.__call__ must take 1 argument",
        ),
        (lambda f: f.filter(lambda: True), FlowTypeError, "operator filter 'lambda': pred 'lambda' must take 1"),
        (
            lambda f: f.map(type("C", (), {"__call__": lambda self, r: 1}), names=["y"], init=lambda: 1),
            FlowTypeError,
            "init= goes with a function, not a class",
        ),
        (lambda f: f.map(ident, names=["y"], gpu="yes"), FlowTypeError, "operator map 'ident': gpu= must be a bool"),
        (lambda f: f.filter(ident, batching=1), FlowTypeError, "operator filter 'ident': batching= must be a bool"),
        (lambda f: f.anyof(ident, ident, names=["y"], gpu=None), FlowTypeError, "gpu= must be a bool"),
        (lambda f: f.map(ident, names=["y"], col=1), FlowTypeError, "col= must be a column name"),
        (lambda f: f.map(lambda r: 1), FlowValueError, "operator map 'lambda': pass names="),
        (lambda f: f.map(ident, names=[]), FlowValueError, "operator map 'ident': names= is empty"),
        (lambda f: f.map(ident, names=["a", "a"]), FlowValueError, "duplicate column name 'a'"),
        (lambda f: f.map(ident, names=["qid"]), FlowValueError, "'qid' is reserved"),
        (
            lambda f: f.map(ident, names=["not valid"]),
            FlowValueError,
            "column name 'not valid' is not a valid identifier",
        ),
        (lambda f: f.map(ident, names=["class"]), FlowValueError, "is not a valid identifier"),
        (lambda f: f.agg("median", "x"), FlowValueError, "operator agg median: unknown aggregate 'median'"),
        (lambda f: f.agg("sum"), FlowValueError, "operator agg sum: sum needs a column"),
        (lambda f: f.agg("sum", 3), FlowTypeError, "operator agg sum: column must be a str"),
        (lambda f: f.groupby(["x"]), FlowTypeError, "operator groupby: column must be a str"),
        (lambda f: f.groupby("x").agg("count", name="x"), FlowValueError, "output name 'x' is the group column"),
        (lambda f: f.join(f, how="cross"), FlowValueError, "operator join: how='cross'"),
        (lambda f: f.join(f, on=3), FlowTypeError, "operator join: on= must be a column name"),
        (lambda f: f.join(f, on=["qid", "x"]), FlowValueError, "operator join: join on qid alone"),
        (lambda f: f.join(f, suffixes=("_a", "_a")), FlowValueError, "operator join: suffixes must be two different"),
        (
            lambda f: f.join(f.map(lambda r: (1, 2), names=["x_right", "x"])),
            FlowValueError,
            "operator join: suffixes .* give duplicate columns",
        ),
        (lambda f: f.join(3), FlowTypeError, "operator join: expected a node of flow 'v', got int"),
        (lambda f: f.union(), FlowValueError, "operator union: needs at least one other node"),
        (lambda f: f.union(f.map(ident, names=["y"])), FlowValueError, "operator union: columns differ"),
        (lambda f: f.lookup(), FlowValueError, "operator lookup: pass either key="),
        (lambda f: f.lookup("k", column="x"), FlowValueError, "operator lookup: pass either key="),
        (lambda f: f.lookup(3), FlowTypeError, "operator lookup: key must be a str"),
        (lambda f: f.lookup("k", missing="skip"), FlowValueError, "operator lookup: missing='skip'"),
        (lambda f: f.lookup("k", name="x"), FlowValueError, r"operator lookup\(k\): output column 'x' already exists"),
        (lambda f: f.anyof(ident, names=["y"]), FlowValueError, "operator anyof: needs at least two alternatives"),
    ],
)
def test_bad_definitions_raise_flow_errors_naming_the_operator(build, exc, match):
    with pytest.raises(exc, match=match) as e:
        build(schema_flow())
    assert isinstance(e.value, FlowDefinitionError)
    assert "operator" in str(e.value)
    assert isinstance(e.value, TypeError if exc is FlowTypeError else ValueError)


def test_builtins_without_signatures_are_accepted():
    Flow("b").map(len, names=["n"])
    Flow("b2").map(repr, names=["n"])
    with pytest.raises(FlowTypeError, match="has no __call__"):  # a class is built, then its instances called
        Flow("b3").map(np.float64, names=["n"])


def test_nodes_of_another_flow_are_rejected():
    mine, other = Flow("mine"), Flow("other")
    theirs = other.map(ident, names=["y"])
    with pytest.raises(FlowValueError, match="operator join: node 'ident' belongs to flow 'other', not 'mine'"):
        mine.map(ident, names=["y"]).join(theirs)
    with pytest.raises(FlowValueError, match="operator union"):
        mine.union(theirs)
    with pytest.raises(FlowValueError):
        mine.join(other)  # a Flow stands for its input node
    assert issubclass(FlowValueError, FlowDefinitionError)  # fix the script


def test_a_flow_stands_for_its_input_node():
    flow = Flow("self", schema={"x": int})
    flow.map(lambda r: r.x * 2, names=["y"]).join(flow)
    assert flow.run([{"x": 2}]).to_pylist() == [{"qid": 0, "y": 4, "x": 2}]


def test_flow_name_and_schema_are_checked():
    for bad in ("", "a b", 3, "x/y"):
        with pytest.raises(FlowValueError, match="Flow name must be"):
            Flow(bad)
    with pytest.raises(FlowTypeError, match="schema must be a mapping"):
        Flow("f", schema=[("x", int)])
    with pytest.raises(FlowValueError, match="Flow 'f': schema column 'qid' is reserved"):
        Flow("f", schema={"qid": int})
    with pytest.raises(DataTypeError, match="column 'x': cannot understand type"):
        Flow("f", schema={"x": object})
    assert Flow("f-1.v2", schema={"x": "float"}).schema == {"x": ColumnType("float")}


# -- sinks ----------------------------------------------------------------------------------------------


def test_sink_rules():
    flow = Flow("s")
    with pytest.raises(FlowValueError, match="flow 's' has no operators"):
        flow.sink()
    with pytest.raises(FlowValueError):
        flow.run([{"x": 1}])
    a = flow.map(ident, names=["y"])
    assert flow.sink() is a and flow.validate() is a
    b = flow.map(ident, names=["z"])
    with pytest.raises(FlowValueError, match=r"flow 's' has 2 unmerged sinks \('ident', 'ident#2'\); join or union"):
        flow.validate()
    c = a.join(b)
    assert flow.sink() is c
    a.filter(lambda r: True)  # a dangling branch is another sink
    with pytest.raises(FlowValueError, match="2 unmerged sinks"):
        flow.run([{"x": 1}])


# -- run inputs -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        [{"x": 1, "s": "a"}, {"x": 2, "s": "b"}],
        {"x": [1, 2], "s": ["a", "b"]},
        pd.DataFrame({"x": [1, 2], "s": ["a", "b"]}),
        pa.table({"x": [1, 2], "s": ["a", "b"]}),
        Table.from_pylist([{"x": 1, "s": "a"}, {"x": 2, "s": "b"}]),
    ],
)
def test_run_accepts_every_input_form_and_returns_a_table(data):
    flow = Flow("in", schema=SCHEMA)
    flow.map(lambda r: f"{r.s}{r.x}", names=["y"])
    out = flow.run(data)
    assert isinstance(out, Table) and out.to_pylist() == [{"qid": 0, "y": "a1"}, {"qid": 1, "y": "b2"}]


def test_run_with_explicit_qids():
    flow = Flow("q")
    flow.map(ident, names=["y"])
    df = pd.DataFrame({"qid": [10, 20], "x": [1, 2]})
    assert flow.run(df, qid="qid").qid.tolist() == [10, 20]
    assert flow.run([{"x": 1}], qid=[7]).qid.tolist() == [7]
    assert flow.run(Table.from_pylist([{"x": 1}]), qid=[8]).qid.tolist() == [8]
    with pytest.raises(SchemaError, match="column 'qid' is reserved.*pass qid='qid'"):
        flow.run(df)
    with pytest.raises(SchemaError, match="query ids must be unique in a request"):
        flow.run([{"x": 1}, {"x": 2}], qid=[3, 3])


def test_input_schema_is_enforced():
    flow = Flow("sch", schema={"x": float, "s": str})
    flow.map(lambda r: r.x, names=["y"])
    t = flow.input_table([{"s": "a", "x": 1}])  # ints widen to float; columns in schema order
    assert t.schema == {"x": ColumnType("float"), "s": ColumnType("str")}
    assert flow.input_table(Table.from_pylist([{"x": 1, "s": None}])).schema["s"].kind == "str"
    with pytest.raises(SchemaError, match=r"flow 'sch': input is missing column\(s\) \['s'\]"):
        flow.run([{"x": 1.0}])
    with pytest.raises(SchemaError, match=r"flow 'sch': unexpected input column\(s\) \['z'\]"):
        flow.run([{"x": 1.0, "s": "a", "z": 1}])
    with pytest.raises(DataTypeError, match="column 's': expected str, got int"):
        flow.run([{"x": 1.0, "s": 1}])
    with pytest.raises(DataTypeError, match="flow 'sch': column 's' should be str, got int"):
        flow.run(Table.from_pylist([{"x": 1.0, "s": 1}]))
    assert len(flow.run([])) == 0


# -- the reference runner ------------------------------------------------------------------------------------


def test_reference_runs_only_the_sinks_ancestors_in_creation_order():
    flow = Flow("r")
    order = []

    def tag(name):
        def fn(r):
            order.append(name)
            return r.x

        fn.__name__ = name
        return fn

    a = flow.map(tag("a"), names=["x"])
    b = a.map(tag("b"), names=["x"])
    c = a.map(tag("c"), names=["x"])
    d = b.union(c)
    unused = flow.map(tag("unused"), names=["x"])
    assert ancestors(d) == {0, a.id, b.id, c.id, d.id}
    out = run_nodes(flow, flow.input_table([{"x": 1}]), d)
    assert order == ["a", "b", "c"] and len(out) == 2
    assert unused.id not in ancestors(d)


def test_key_prefixes_bound_what_lookups_read():
    store = {"emb/1": 1, "other/1": 2, "flowserve:deployed": 3}
    f = Flow("ns", schema={"k": str}, key_prefixes=["emb/"])
    f.lookup(column="k", name="v")
    assert f.run([{"k": "emb/1"}], kvs=store)["v"].tolist() == [1]
    with pytest.raises(LookupKeyError, match="outside this flow's key namespace"):
        f.run([{"k": "other/1"}], kvs=store)
    g = Flow("any", schema={"k": str})
    g.lookup(column="k", name="v")
    assert g.run([{"k": "other/1"}], kvs=store)["v"].tolist() == [2]
    with pytest.raises(LookupKeyError, match="runtime's namespace"):
        g.run([{"k": "flowserve:deployed"}], kvs=store)
    with pytest.raises(FlowValueError, match="outside this flow's key namespace"):
        Flow("x", key_prefixes=["emb/"]).lookup("other/2", name="v")
    with pytest.raises(FlowValueError, match="runtime's namespace"):
        Flow("x").lookup("flowserve:plan:x:1", name="v")
    with pytest.raises(FlowValueError, match="reaches the runtime's own keys"):
        Flow("x", key_prefixes=["flowserve:"])
    with pytest.raises(FlowTypeError, match="key_prefixes must be a list"):
        Flow("x", key_prefixes="emb/")
