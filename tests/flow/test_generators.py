"""Generator maps and first_then through flow.run (what they mean), and the optimizer
keeping that meaning (docs/flow-semantics.md, "Generator maps" and "first_then")."""

from __future__ import annotations

import numpy as np
import pytest

from executors.worker.interpreter import run_plan
from flow import Flow, FlowValueError, OperatorFailedError, OperatorOutputError
from optimizer import optimize


def words(row):
    for i, w in enumerate(row.s.split()):
        yield w, i


def upper(row):
    return row.w.upper()


class Counter:
    """A class whose __call__ is a generator: built once, then called per row."""

    def __init__(self):
        self.base = 100

    def __call__(self, row):
        for k in range(row.n):
            yield self.base + k


def test_a_generator_gives_each_value_as_a_row_with_the_input_rows_qid_in_order():
    f = Flow("g", schema={"s": str})
    f.map(words, names=["w", "i"]).map(upper, names=["u"])
    out = f.run([{"s": "a b"}, {"s": ""}, {"s": "c d e"}])
    assert out.qid.tolist() == [0, 0, 2, 2, 2]  # row 1 yielded nothing: it has no row
    assert out["u"].tolist() == ["A", "B", "C", "D", "E"]


def test_a_class_and_col_and_init_generators():
    f = Flow("c", schema={"n": int})
    f.map(Counter, names=["k"])
    assert f.run([{"n": 2}, {"n": 1}]).to_pylist() == [{"qid": 0, "k": 100}, {"qid": 0, "k": 101}, {"qid": 1, "k": 100}]
    g = Flow("col", schema={"n": int})

    def upto(n):
        yield from range(n)

    g.map(upto, names=["k"], col="n")
    assert g.run([{"n": 3}])["k"].tolist() == [0, 1, 2]


def test_a_generator_downstream_of_filter_and_into_a_groupby():
    f = Flow("gg", schema={"s": str})
    f.filter(lambda r: r.s != "skip").map(words, names=["w", "i"]).groupby("w").agg("count")
    out = f.run([{"s": "a b a"}, {"s": "skip"}, {"s": "b"}])
    assert dict(zip(out["w"].tolist(), out["count"].tolist())) == {"a": 2, "b": 2}


def test_generator_errors_name_the_operator_and_the_row():
    def bad(row):
        yield 1
        raise ValueError("boom")

    f = Flow("e", schema={"x": int})
    f.map(bad, names=["y"])
    with pytest.raises(OperatorFailedError, match="operator 'bad' raised ValueError: boom") as e:
        f.run([{"x": 1}])
    assert e.value.operator == "bad" and e.value.qid == 0

    def wrong(row):
        yield 1

    g = Flow("w", schema={"x": int})
    g.map(wrong, names=["a", "b"])
    with pytest.raises(OperatorOutputError, match="wrong"):
        g.run([{"x": 1}])


def test_a_generator_is_refused_with_batching_or_cache():
    f = Flow("r", schema={"s": str})
    with pytest.raises(FlowValueError, match="generator.*batching=True"):
        f.map(words, names=["w", "i"], batching=True)
    with pytest.raises(FlowValueError, match="generator.*cache="):
        f.map(words, names=["w", "i"], cache=True)


def test_the_optimized_plan_of_a_generator_flow_runs_as_flow_run():
    f = Flow("opt", schema={"s": str})
    f.map(lambda r: r.s.strip(), names=["s"]).map(words, names=["w", "i"]).map(upper, names=["u"])
    rows = [{"s": " x y "}, {"s": "z"}]
    assert run_plan(optimize(f), rows).to_pylist() == f.run(rows).to_pylist()
    assert "[generator]" in f.explain()


def small(row):
    return row.x, 0.5 if row.x % 2 else 0.95


def big(row):
    return row.x * 10, 0.99


def test_first_then_answers_the_slow_row_where_when_holds_else_the_fast_row():
    f = Flow("ft", schema={"x": int})
    f.first_then(small, big, names=["cls", "conf"], when=lambda r: r.conf < 0.9)
    out = f.run([{"x": i} for i in range(4)])
    assert out.qid.tolist() == [0, 1, 2, 3]
    assert out["cls"].tolist() == [0, 10, 2, 30]
    assert out["conf"].tolist() == [0.95, 0.99, 0.95, 0.99]
    always = Flow("always", schema={"x": int})
    always.first_then(small, big, names=["cls", "conf"])  # no when: every row takes the slow branch
    assert always.run([{"x": 2}])["cls"].tolist() == [20]


def test_first_then_with_batching_branches_and_rows_after_it():
    def small_batch(table):
        return table["x"], np.where(table["x"] % 2 == 1, 0.5, 0.95)

    def big_batch(table):
        return table["x"] * 10, np.full(len(table), 0.99)

    f = Flow("ftb", schema={"x": int})
    f.first_then(small_batch, big_batch, names=["cls", "conf"], when=lambda r: r.conf < 0.9, batching=True).map(
        lambda r: r.cls + 1, names=["y"]
    )
    rows = [{"x": i} for i in range(5)]
    assert f.run(rows)["y"].tolist() == [1, 11, 3, 31, 5]
    assert run_plan(optimize(f), rows).to_pylist() == f.run(rows).to_pylist()


def test_first_then_errors():
    f = Flow("fte", schema={"x": int})
    with pytest.raises(FlowValueError, match="cannot be a generator"):
        f.first_then(words, big, names=["cls", "conf"])
    g = Flow("ftw", schema={"x": int})
    g.first_then(small, big, names=["cls", "conf"], when=lambda r: "yes")
    with pytest.raises(OperatorOutputError, match="when= must return True or False, got str"):
        g.run([{"x": 1}])


def test_a_generator_after_a_per_row_lookup_stays_out_of_its_continuation(kvs):
    kvs.mput({"gen-test/0": "a b", "gen-test/1": "c"})
    f = Flow("gl", schema={"x": int})

    def spread(row):
        yield from row.text.split()

    keys = f.map(lambda r: f"gen-test/{r.x % 2}", names=["key"])
    keys.lookup(column="key", name="text").map(spread, names=["w"]).map(upper_w, names=["u"])
    plan = optimize(f)
    for stage in plan.stages.values():
        if stage.continuation is not None:  # runs per key group, merged back by row position
            assert not any(op.generates for op in stage.ops), plan.explain()
    rows = [{"x": i} for i in range(4)]
    expected = f.run(rows, kvs=kvs)
    assert expected["u"].tolist() == ["A", "B", "C", "A", "B", "C"]
    assert run_plan(plan, rows, kvs=kvs).to_pylist() == expected.to_pylist()


def upper_w(row):
    return row.w.upper()
