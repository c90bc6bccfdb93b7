"""The compiled chain of a fused stage (executors/worker/fused.py) gives exactly flow.run's rows and
the generic loop's errors: maps (batching and row-wise), filters dropping rows, joins of
branches, unions, aggregates, NaN and None, errors inside operators, batches of requests."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from executors.worker import fused
from executors.worker.interpreter import Interpreter
from executors.worker.stage_runner import BoundStage
from flow import ColumnType, Flow, Table
from flow.errors import OperatorFailedError, OperatorOutputError
from flow.table import Column
from flow.types import build_column
from optimizer import OptimizerOptions, optimize
from tests.flowgen import assert_same_rows, flows_and_inputs

ONE_STAGE = OptimizerOptions(fuse_branches=True)


# -- operator functions (module level: plans pickle them) ------------------------------------


def scale(t):
    return t["x"].astype(np.float64) * 2.0


def nan_where_odd(t):
    x = t["x"]
    return np.where(x % 2 == 1, np.nan, x * 1.0), x.astype(np.int64) + 1


def plus_one(t):
    return t["x"] + 1, t["x"] * 0.5


def pick(row):
    return (row.a_right if row.a is None else row.a, row.a is None)


def pick_y(row):
    return (row.y if row.a is None else row.a, row.y is None)


def keep_even(row):
    return row.x % 2 == 0


def label(row):
    return "even" if row.x % 2 == 0 else "odd"


def fail_on_three(t):
    if (t["x"] == 3).any():
        raise ValueError("three is poison")
    return t["x"] * 10


def fail_row_three(row):
    if row.x == 3:
        raise ValueError("three is poison")
    return row.x


def scalar(t):
    return 1.0


def too_short(t):
    return t["x"][:-1], t["x"]


def huge(t):
    return np.full(len(t), 2**64 - 1, dtype=np.uint64)


def not_a_pair(row):
    return row.x


def below_100(row):
    return row.x < 100


def not_a_bool(row):
    return row.x  # an int: a filter predicate must return a bool


def pick_left(row):
    return row.b if row.b_right is None else row.b_right


def as_list(t):
    return [float(v) for v in t["x"]]  # a list, not an array: the generic path builds it


# -- helpers --------------------------------------------------------------------------------


def _both(flow, data, options=ONE_STAGE):
    """(compiled chain's result, generic loop's result, flow.run's) for ``data``."""
    plan = optimize(flow, options=options)
    expected = flow.run(data)
    got = Interpreter(plan).run(data)
    fused.ENABLED = False
    try:
        generic = Interpreter(plan).run(data)
    finally:
        fused.ENABLED = True
    return got, generic, expected


def _same(flow, data, options=ONE_STAGE):
    got, generic, expected = _both(flow, data, options)
    assert got.equals(expected), f"fused {got.to_pylist()} != flow.run {expected.to_pylist()}"
    assert generic.equals(expected)
    return got


def _errors(flow, data):
    """The error the compiled chain raises and the generic loop's, for one request."""
    plan = optimize(flow, options=ONE_STAGE)
    raised = []
    for enabled in (True, False):
        fused.ENABLED = enabled
        try:
            Interpreter(plan).run(data)
        except Exception as e:  # noqa: BLE001 - compared below
            raised.append(e)
        else:
            raised.append(None)
        finally:
            fused.ENABLED = True
    return raised


def _ints(n=6):
    return Table.from_dict({"x": list(range(n))})


def _flow():
    return Flow("f", schema={"x": int})


# -- the Ensemble's shape takes the short paths ---------------------------------------------------


def test_ensemble_shape_runs_the_short_paths_and_matches_flow_run():
    flow = _flow()
    a = flow.map(plus_one, names=["x", "b"], batching=True)
    left = a.map(nan_where_odd, names=["a", "b"], batching=True)
    right = a.map(plus_one, names=["a", "b"], batching=True)
    left.join(right).map(pick, names=["a", "missing"])
    plan = optimize(flow, options=ONE_STAGE)
    assert len(plan.stages) == 1
    chain = BoundStage(plan.stages[plan.sink]).chain
    kinds = [type(step).__name__ for _, step, _ in chain.steps]
    assert kinds == ["_BatchMap", "_BatchMap", "_BatchMap", "_SameRowsJoin", "_RowMap"]
    got = _same(flow, _ints())
    # NaN from a batching map is a missing value the row-wise map sees as None
    assert got.to_pylist()[0]["missing"] is True and got.to_pylist()[1]["missing"] is False


def test_a_filter_keeping_every_row_passes_its_input_on_and_the_left_join_is_a_rename():
    # the Cascade's shape: unsure rows (all of them) go to the big model, whose answers are
    # left-joined back; the filter's output is its input, so the join pairs rows i with i
    flow = _flow()
    a = flow.map(plus_one, names=["x", "b"], batching=True)
    big = a.filter(below_100).map(plus_one, names=["x", "b"], batching=True)
    a.join(big, how="left").map(pick_left, names=["out"])
    plan = optimize(flow, options=ONE_STAGE)
    chain = BoundStage(plan.stages[plan.sink]).chain
    assert [type(step).__name__ for _, step, _ in chain.steps] == [
        "_BatchMap",
        "_BoundFilter",
        "_BatchMap",
        "_SameRowsJoin",
        "_RowMap",
    ]
    data = _ints()
    kept = chain.steps[1][1]([a_out := chain.steps[0][1]([data])], None)
    assert kept is a_out  # every row kept: the same Table, the same qid array
    assert _same(flow, data).column("out").to_list() == [(x + 1) * 0.5 for x in range(6)]
    some = Table.from_dict({"x": [5, 150, 7, 99]})  # x + 1 >= 100 drops two: the generic filter and join
    assert _same(flow, some).column("out").to_list() == [3.0, 75.0, 4.0, 49.5]


def test_clashing_join_names_get_suffixes_like_flow_run():
    flow = _flow()
    a = flow.map(plus_one, names=["x", "b"], batching=True)
    a.map(scale, names=["a"], batching=True).join(a.map(plus_one, names=["a", "c"], batching=True))
    got = _same(flow, _ints())
    assert got.columns == ("a", "a_right", "c")


def test_filters_dropping_rows_then_joins_unions_and_aggregates():
    flow = _flow()
    evens = flow.filter(keep_even)
    doubled = flow.map(plus_one, names=["a", "b"], batching=True)
    joined = evens.join(doubled, how="left")  # other rows on each side: the generic join
    tagged = joined.map(label, names=["tag"])
    tagged.union(flow.map(label, names=["tag"])).groupby("tag").agg("count")
    _same(flow, _ints(7))


def test_empty_after_a_filter():
    flow = _flow()
    none = flow.filter(keep_even).filter(keep_even).map(plus_one, names=["x", "b"], batching=True)
    none.join(none.map(scale, names=["s"], batching=True))
    _same(flow, Table.from_dict({"x": [1, 3, 5]}))


def test_nan_and_none_pass_between_operators_as_missing():
    flow = Flow("f", schema={"x": int, "y": ColumnType("float")})
    a = flow.map(nan_where_odd, names=["a", "b"], batching=True)
    a.join(flow).map(pick_y, names=["a", "missing"])
    _same(flow, Table.from_dict({"x": [1, 2, 3], "y": [None, 1.5, float("nan")]}))


def test_results_that_are_not_arrays_take_the_generic_path():
    flow = _flow()
    flow.map(as_list, names=["f"], batching=True).join(flow.map(plus_one, names=["a", "b"], batching=True))
    got = _same(flow, _ints(4))
    assert got.column("f").type.kind == "float"


# -- errors name the operator (and the row's qid) as the generic loop does ----------------------


@pytest.mark.parametrize(
    "build, error, words",
    [
        (lambda f: f.map(fail_on_three, names=["y"], batching=True), OperatorFailedError, "fail_on_three"),
        (lambda f: f.map(fail_row_three, names=["y"]), OperatorFailedError, "fail_row_three"),
        (lambda f: f.map(too_short, names=["y", "z"], batching=True), OperatorOutputError, "column 'y'"),
        (lambda f: f.map(huge, names=["y"], batching=True), OperatorOutputError, "does not fit in int64"),
        (lambda f: f.map(not_a_pair, names=["y", "z"]), OperatorOutputError, "expected a tuple of 2"),
        (lambda f: f.map(scalar, names=["s"], batching=True), OperatorOutputError, "returned a float"),
        (lambda f: f.filter(not_a_bool), OperatorOutputError, "must return a bool"),
    ],
)
def test_errors_inside_operators_match_the_generic_loop(build, error, words):
    flow = _flow()
    build(flow.map(plus_one, names=["x", "b"], batching=True))
    compiled, generic = _errors(flow, _ints())
    assert type(compiled) is type(generic) and str(compiled) == str(generic)
    assert isinstance(compiled, error)
    assert compiled.operator is not None and compiled.operator in str(compiled)
    assert words in str(compiled)
    if isinstance(compiled, OperatorFailedError) and "row" in compiled.operator:
        assert compiled.qid == 2  # x == 3 after plus_one: the row with qid 2


# -- batches: several requests in one run never mix rows; a poison request fails alone -----------


def test_batched_requests_keep_their_own_rows_and_a_poison_fails_alone():
    flow = _flow()
    a = flow.map(plus_one, names=["x", "b"], batching=True)
    a.join(a.map(nan_where_odd, names=["c", "d"], batching=True)).map(fail_row_three, names=["z"])
    plan = optimize(flow)
    assert len(plan.stages) == 1
    interp = Interpreter(plan)
    good = [
        Table.from_dict({"x": [0, 1]}, qid=[10, 11]),
        Table.from_dict({"x": [5]}, qid=[12]),
        Table.from_dict({"x": [7, 4]}, qid=[13, 14]),
    ]
    result = interp.run_many(good)
    assert result.stats.batches.get(plan.sink, 0) >= 1  # they really ran as one batch
    for req, got in zip(good, result.tables()):
        assert_same_rows(got, flow.run(req), ordered=True)
        assert got.qid.tolist() == req.qid.tolist()
    poison = Table.from_dict({"x": [2]}, qid=[15])  # x == 3 after plus_one
    mixed = interp.run_many([good[0], poison, good[2]])
    assert isinstance(mixed.results[1], OperatorFailedError) and mixed.results[1].operator == "fail_row_three"
    assert mixed.results[1].qid == 15
    for k in (0, 2):
        assert_same_rows(mixed.results[k], flow.run(good[k]), ordered=True)


# -- generated flows: the chain against the generic loop and flow.run ----------------------------


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=flows_and_inputs())
def test_generated_flows_fused_into_stages_match_the_generic_loop(case):
    for options in (OptimizerOptions(), ONE_STAGE):
        plan = optimize(case.flow, options=options)
        expected = case.flow.run(case.table, kvs=case.store)
        got = Interpreter(plan).run(case.table, kvs=case.store)
        fused.ENABLED = False
        try:
            generic = Interpreter(plan).run(case.table, kvs=case.store)
        finally:
            fused.ENABLED = True
        assert got.equals(expected), f"{got.to_pylist()} != {expected.to_pylist()}"
        assert generic.equals(got)
        many = Interpreter(plan).run_many(list(case.requests), kvs=case.store)
        for req, got_i in zip(case.requests, many.tables()):
            assert_same_rows(got_i, case.flow.run(req, kvs=case.store))


# -- the columns the short paths build are the ones build_column builds ----------------------------


class Returns:
    """A batching map returning ``make(x)`` for the input column x (an int array)."""

    def __init__(self, make):
        self.make = make

    def __call__(self, t):
        return self.make(t["x"])


ARRAYS = {
    "int64": lambda x: x.astype(np.int64),
    "int32": lambda x: x.astype(np.int32),
    "float64 with NaN": lambda x: np.where(x % 2 == 0, np.nan, x * 0.5),
    "float32": lambda x: x.astype(np.float32) / 3,
    "bool": lambda x: x % 2 == 0,
    "not contiguous": lambda x: np.repeat(x * 1.5, 2)[::2],
    "big-endian": lambda x: x.astype(">i8"),
    "uint64": lambda x: x.astype(np.uint64),
    "tensor": lambda x: np.stack([x, x * 2], axis=1).astype(np.float32),
    "strings": lambda x: x.astype(str),
}


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("kind", list(ARRAYS))
def test_batching_map_arrays_make_the_same_columns(kind, rows):
    flow = _flow()
    flow.map(Returns(ARRAYS[kind]), names=["y"], batching=True).join(flow).map(pick_row, names=["p"])
    got = _same(flow, _ints(rows))
    assert got.num_rows == rows


def pick_row(row):
    return row.y if not isinstance(row.y, np.ndarray) else float(row.y.sum())


class RowReturns:
    def __init__(self, values):
        self.values = values

    def __call__(self, row):
        return self.values[row.x % len(self.values)]


VALUES = {
    "ints": [1, -2, 3],
    "floats with NaN": [1.5, float("nan"), 2.0],
    "all NaN": [float("nan")],
    "ints and floats": [1, 2.5],
    "bools": [True, False],
    "None": [None, 1.0],
    "strings": ["a", "b"],
}


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("kind", list(VALUES))
def test_row_map_values_make_the_same_columns(kind, rows):
    flow = _flow()
    flow.map(RowReturns(VALUES[kind]), names=["y"]).join(flow.map(plus_one, names=["a", "b"], batching=True))
    _same(flow, _ints(rows))


MIXED = {
    # (first column, second column): each row's pair; the first takes the short way, the second not
    "str and array": [("a", np.arange(3.0)), ("b", np.ones(3))],
    "int and None": [(1, None), (2, 2.5)],
    "float and list": [(0.5, [1, 2]), (1.5, [3, 4])],
    "str and frozen array": [("a", np.arange(2.0)), ("b", np.arange(2.0))],
}


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("kind", list(MIXED))
def test_a_row_maps_columns_each_take_their_own_path_to_the_same_columns(kind, rows):
    values = MIXED[kind]
    if kind == "str and frozen array":  # an array nobody can change (a KVS cache hit): shared
        for _, a in values:
            a.flags.writeable = False
    flow = _flow()
    flow.map(RowReturns(values), names=["y", "z"]).join(flow.map(plus_one, names=["a", "b"], batching=True))
    _same(flow, _ints(rows))


@pytest.mark.parametrize(
    "values",
    [[("a", object())], [("a", [[1], [2, 3]])], [(object(), np.arange(2.0))], [("a", "b")] * 1 + [("a", 1)]],
    ids=["str then object", "str then ragged", "object then array", "mixed in the second column"],
)
@pytest.mark.parametrize("rows", [1, 2])
def test_a_row_maps_bad_column_fails_as_the_generic_loop_does(values, rows):
    flow = _flow()
    flow.map(RowReturns(values), names=["y", "z"]).join(flow)
    compiled, generic = _errors(flow, _ints(rows))
    assert type(compiled) is type(generic) and str(compiled) == str(generic), (compiled, generic)
    # one row sees the first pair alone: the second column mixes types only over two
    assert isinstance(compiled, OperatorOutputError) or (rows == 1 and len(values) > 1)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("returns", [7, (1, 2, 3), [1], "ab"], ids=["not a pair", "three", "a list of one", "str"])
def test_a_row_map_of_the_wrong_arity_fails_as_the_generic_loop_does(returns, rows):
    flow = _flow()
    flow.map(RowReturns([returns]), names=["y", "z"]).join(flow)
    compiled, generic = _errors(flow, _ints(rows))
    assert isinstance(compiled, OperatorOutputError) and str(compiled) == str(generic), (compiled, generic)


@pytest.mark.parametrize("rows", [1, 3])
def test_a_row_map_may_return_its_columns_as_a_list(rows):
    flow = _flow()
    flow.map(RowReturns([[1, "a"], (2, "b")]), names=["y", "z"]).join(
        flow.map(plus_one, names=["a", "b"], batching=True)
    )
    _same(flow, _ints(rows))


@pytest.mark.parametrize("rows", [1, 2])
def test_row_map_int_beyond_int64_fails_as_the_generic_loop_does(rows):
    flow = _flow()
    flow.map(RowReturns([2**70]), names=["y"]).join(flow)
    compiled, generic = _errors(flow, _ints(rows))
    assert isinstance(compiled, OperatorOutputError) and str(compiled) == str(generic)
    assert "RowReturns" in str(compiled) and "int64" in str(compiled)


@pytest.mark.parametrize(
    "values",
    [["a", "b"], ["é"], [1, 2**62], [0.5, float("nan")], ["a", 1], ["a", None], [True, False], [1, 2.0]],
    ids=["str", "unicode", "int", "float-nan", "mixed", "missing", "bool", "int-float"],
)
def test_a_row_maps_values_make_the_column_build_column_makes(values):
    column = fused._values_column(values)
    if column is None:  # not the short way's shape: the general path builds it
        assert type(values[0]) not in (str, int, float) or len({type(v) for v in values}) > 1
        return
    ctype, arr, valid = build_column(values, "c")
    assert column.type == ctype and arr.dtype == column.values.dtype
    assert column.to_list() == Column(ctype, arr, valid).to_list()


def test_one_rows_value_makes_the_column_of_a_list_of_it():
    """``_value_column(x)`` (a one-row map's value) is ``_values_column([x])``: the same
    type, storage, mask and values, or None for the same values (the general path's)."""
    odd = [float("nan"), -0.0, float("inf"), 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, True, False, None, "", "é",
           b"x", np.float64(1.5), np.int64(3), np.arange(2.0), [1, 2], (1,), {"a": 1}, 1e308]  # fmt: skip
    rng = np.random.default_rng(11)
    values = (
        odd
        + [float(rng.standard_normal()) for _ in range(20)]
        + [int(rng.integers(-(2**62), 2**62)) for _ in range(20)]
    )
    for x in values:
        one, many = fused._value_column(x), fused._values_column([x])
        if many is None:
            assert one is None, x
            continue
        assert one is not None and one.type == many.type and one.values.dtype == many.values.dtype, x
        assert (one.valid is None) == (many.valid is None) and one.to_list() == many.to_list() or x != x, x
        assert np.array_equal(one.values, many.values, equal_nan=one.values.dtype.kind == "f"), x
        if many.valid is not None:
            assert one.valid.tolist() == many.valid.tolist(), x
