"""Literal plan in, literal plan out: each rule alone, and the default rule list."""

from __future__ import annotations

import pytest

from flow import Flow
from optimizer import INPUT, BatchConfig, ChooseOp, OptimizerOptions, Plan, optimize
from optimizer.rules import batching, competition, fusion, locality, placement
from tests.optimizer import examples as ex

REQ = INPUT
B = BatchConfig()


def marks(stage) -> dict:
    """A stage's marks that differ from the defaults."""
    out = {}
    if stage.device != "cpu":
        out["device"] = stage.device
    if stage.replicas != 1:
        out["replicas"] = stage.replicas
    if stage.competitive != 1:
        out["competitive"] = stage.competitive
    if stage.batch is not None:
        out["batch"] = stage.batch
    if stage.wait != "all":
        out["wait"] = stage.wait
    if stage.continuation is not None:
        out["continuation"] = stage.continuation
    return out


CHAINS_ONLY = OptimizerOptions(fuse_branches=False)  # the seed's fusion: linear chains only


def layout(plan: Plan) -> list[tuple]:
    """(name, inputs, non-default marks) per stage, in the plan's (topological) order."""
    return [(s.name, s.inputs, marks(s)) for s in plan.stages.values()]


def f(row):
    return row.x + 1


def g(row):
    return row.y * 2


def h(row):
    return row.y - 1


def k(row):
    return row.y + row.y_right


def chain_flow(**flags_of) -> Flow:
    """x -> f -> g -> h (flags per function name)."""
    flow = Flow("chain", schema={"x": int})
    flow.map(f, names=["y"], **flags_of.get("f", {})).map(g, names=["y"], **flags_of.get("g", {})).map(
        h, names=["y"], **flags_of.get("h", {})
    )
    return flow


# -- the baseline ----------------------------------------------------------------------------------


def test_from_flow_is_one_stage_per_operator_in_creation_order():
    plan = Plan.from_flow(ex.cascade())
    assert layout(plan) == [
        ("preprocess", (REQ,), {}),
        ("small_net", ("preprocess",), {}),
        ("low_confidence", ("small_net",), {}),
        ("big_net", ("low_confidence",), {}),
        ("join", ("small_net", "big_net"), {}),
        ("pick", ("join",), {}),
    ]
    assert plan.sink == "pick"
    assert [n.inputs for n in plan.stages["join"].nodes] == [("@0", "@1")]
    assert optimize(ex.cascade(), rules=[]).stages.keys() == plan.stages.keys()
    assert optimize(ex.cascade(), rules=[]).rules == ()


def test_from_flow_keeps_anyof_as_one_stage():
    plan = Plan.from_flow(ex.competition())
    assert layout(plan) == [
        ("preprocess", (REQ,), {}),
        ("anyof(small,medium,large)", ("preprocess",), {}),
        ("label", ("anyof(small,medium,large)",), {}),
    ]
    assert plan.stages["anyof(small,medium,large)"].nodes[0].op.kind == "anyof"


# -- fusion ------------------------------------------------------------------------------------------


def test_fusion_merges_a_linear_chain_with_traceable_names():
    plan = optimize(chain_flow(), rules=["fusion"])
    assert layout(plan) == [("f+g+h", (REQ,), {})]
    stage = plan.stages["f+g+h"]
    assert [(n.name, n.inputs) for n in stage.nodes] == [("f", ("@0",)), ("g", ("f",)), ("h", ("g",))]
    assert plan.sink == "f+g+h"
    assert plan.rules == ("fusion",)


def test_fusion_never_fuses_a_stage_with_several_consumers():
    flow = Flow("diamond", schema={"x": int})
    y = flow.map(f, names=["y"])
    left, right = y.map(g, names=["y"]), y.map(h, names=["y"])
    left.join(right).map(k, names=["z"])
    plan = optimize(flow, rules=["fusion"], options=CHAINS_ONLY)
    assert layout(plan) == [
        ("f", (REQ,), {}),  # read by g and h: both need its output
        ("g", ("f",), {}),
        ("h", ("f",), {}),
        ("join+k", ("g", "h"), {}),  # the join may head a stage; k fuses after it
    ]


def test_fusion_folds_a_fork_join_region_into_one_stage():
    flow = Flow("diamond", schema={"x": int})
    y = flow.map(f, names=["y"])
    left, right = y.map(g, names=["y"]), y.map(h, names=["y"])
    left.join(right).map(k, names=["z"])
    plan = optimize(flow, rules=["fusion"])
    assert layout(plan) == [("f+g+h+join+k", (REQ,), {})]
    stage = plan.stages["f+g+h+join+k"]
    assert [(n.name, n.inputs) for n in stage.nodes] == [
        ("f", ("@0",)),
        ("g", ("f",)),
        ("h", ("f",)),
        ("join", ("g", "h")),
        ("k", ("join",)),
    ]
    assert not stage.chain and "(reads 2, 3)" in plan.explain()


def test_fork_join_regions_keep_marked_operators_out():
    flow = Flow("marked", schema={"x": int})
    y = flow.map(f, names=["y"])
    left, right = y.map(g, names=["y"], high_variance=True), y.map(h, names=["y"], gpu=True)
    left.join(right).map(k, names=["z"])
    plan = optimize(flow)
    assert layout(plan) == [
        ("f", (REQ,), {}),
        ("g", ("f",), {"competitive": 3, "replicas": 3}),
        ("h", ("f",), {"device": "gpu"}),
        ("join+k", ("g", "h"), {}),
    ]


def test_fusion_fuses_downstream_of_a_multi_input_head_but_not_into_it():
    flow = Flow("u", schema={"x": int})
    a = flow.map(f, names=["y"]).filter(lambda r: r.y > 0)
    b = flow.map(lambda r: r.x, names=["y"])
    a.union(b).map(g, names=["y"])
    assert layout(optimize(flow, rules=["fusion"])) == [("f+lambda+lambda#2+union+g", (REQ,), {})]
    plan = optimize(flow, rules=["fusion"], options=CHAINS_ONLY)
    assert layout(plan) == [
        ("f+lambda", (REQ,), {}),
        ("lambda#2", (REQ,), {}),
        ("union+g", ("f+lambda", "lambda#2"), {}),
    ]


def test_fusion_respects_devices_unless_told_otherwise():
    flow = chain_flow(g={"gpu": True})
    assert layout(optimize(flow, rules=["fusion"])) == [("f", (REQ,), {}), ("g", ("f",), {}), ("h", ("g",), {})]
    across = optimize(flow, rules=["fusion", "placement"], options=OptimizerOptions(fuse_across_devices=True))
    assert layout(across) == [("f+g+h", (REQ,), {"device": "gpu"})]


def test_fusion_merges_neighbouring_gpu_operators():
    flow = chain_flow(g={"gpu": True}, h={"gpu": True})
    assert layout(optimize(flow, rules=["placement", "fusion"])) == [
        ("f", (REQ,), {}),
        ("g+h", ("f",), {"device": "gpu"}),
    ]


def test_fusion_keeps_racing_stages_apart_but_races_neighbours_together():
    flow = chain_flow(g={"high_variance": True}, h={"high_variance": True})
    apart = OptimizerOptions(fuse_into_race=False)
    assert layout(optimize(flow, rules=["competition", "fusion"], options=apart)) == [
        ("f", (REQ,), {}),
        ("g+h", ("f",), {"replicas": 3, "competitive": 3}),
    ]
    # by default the cheap map f runs inside each racing copy: one stage boundary, not two
    assert layout(optimize(flow, rules=["competition", "fusion"])) == [
        ("f+g+h", (REQ,), {"replicas": 3, "competitive": 3}),
    ]
    # without competition marks there is nothing to keep apart
    assert layout(optimize(flow, rules=["fusion"])) == [("f+g+h", (REQ,), {})]


def test_racing_stage_takes_in_cheap_neighbours_on_both_sides():
    flow = chain_flow(g={"high_variance": True})
    assert layout(optimize(flow)) == [("f+g+h", (REQ,), {"replicas": 3, "competitive": 3})]
    off = optimize(flow, options=OptimizerOptions(fuse_into_race=False))
    assert layout(off) == [("f", (REQ,), {}), ("g", ("f",), {"replicas": 3, "competitive": 3}), ("h", ("g",), {})]
    # no racing (k=1): the three maps fuse into one stage
    assert layout(optimize(flow, options=OptimizerOptions(competitive_replicas=1))) == [("f+g+h", (REQ,), {})]


@pytest.mark.parametrize(
    "flags, expected",
    [
        # a gpu neighbour would hold k GPUs; a batching one cannot batch racing copies
        ({"gpu": True}, [("f", (REQ,), {"device": "gpu"}), ("g+h", ("f",), {"replicas": 3, "competitive": 3})]),
        ({"batching": True}, [("f", (REQ,), {"batch": B}), ("g+h", ("f",), {"replicas": 3, "competitive": 3})]),
    ],
)
def test_racing_stage_keeps_costly_neighbours_out(flags, expected):
    flow = chain_flow(f=flags, g={"high_variance": True})
    assert layout(optimize(flow)) == expected


def test_racing_stage_keeps_a_lookup_out():
    flow = Flow("lk", schema={"y": int})
    flow.lookup(key="weights", name="w").map(g, names=["y"], high_variance=True).map(h, names=["y"])
    stages = list(optimize(flow).stages.values())
    assert [s.competitive for s in stages] == [1, 3]
    assert all(n.op.kind != "lookup" for n in stages[1].nodes)


def test_fusion_does_not_take_batching_away():
    flow = Flow("b", schema={"x": int})
    flow.map(f, names=["y"]).map(lambda t: t["y"] * 2, names=["y"], batching=True).agg("sum", "y").map(
        lambda r: r.sum_y, names=["total"]
    )
    plan = optimize(flow, rules=["fusion", "batching"])
    assert layout(plan) == [
        ("f+lambda", (REQ,), {"batch": B}),  # f rides along in the batch
        ("sum_y+lambda#2", ("f+lambda",), {}),  # the agg mixes queries: a stage of its own
    ]
    fused = optimize(flow, rules=["fusion"])
    a, b = fused.stages.values()
    assert "batching" in fusion.why_not_fuse(fused, a, b, OptimizerOptions())


def test_fusion_alone_fuses_lookups_both_ways_the_seeds_fusion_only():
    plan = optimize(ex.recommender(), rules=["fusion"])
    assert layout(plan) == [("parse_user+lookup(user)+top_item+lookup(item)+lookup(bias)+rank", (REQ,), {})]


def test_fusion_after_locality_starts_a_stage_at_each_per_row_lookup():
    plan = optimize(ex.recommender(), rules=["locality", "fusion"])
    assert layout(plan) == [
        ("parse_user", (REQ,), {}),
        ("lookup(user)+top_item", ("parse_user",), {"continuation": "user"}),
        # the fixed-key lookup needs no routing: it fuses like any operator
        ("lookup(item)+lookup(bias)+rank", ("lookup(user)+top_item",), {"continuation": "item"}),
    ]


def test_fusion_keeps_mixing_operators_out_of_continuation_stages():
    flow = Flow("l", schema={"k": str})
    flow.lookup(column="k", name="v").map(lambda r: r.v + 1, names=["v"]).groupby("v").agg("count").map(
        lambda r: r.count, names=["n"]
    )
    plan = optimize(flow, rules=["locality", "fusion"])
    assert layout(plan) == [
        ("lookup(k)+lambda", (REQ,), {"continuation": "k"}),
        ("count_by_v+lambda#2", ("lookup(k)+lambda",), {}),
    ]


def test_can_fuse_separates_may_from_does():
    plan = Plan.from_flow(chain_flow())
    a, b = plan.stages["f"], plan.stages["g"]
    assert fusion.can_fuse(plan, a, b, OptimizerOptions())
    assert not fusion.can_fuse(plan, b, a, OptimizerOptions())  # f does not read g
    fused = fusion.fuse(plan, a, b)
    assert layout(fused) == [("f+g", (REQ,), {}), ("h", ("f+g",), {})]
    assert layout(plan) == [("f", (REQ,), {}), ("g", ("f",), {}), ("h", ("g",), {})]  # unchanged


# -- competition --------------------------------------------------------------------------------------


def test_competition_races_high_variance_stages():
    plan = optimize(ex.cascade(), rules=["competition"])
    assert layout(plan) == [
        ("preprocess", (REQ,), {}),
        ("small_net", ("preprocess",), {}),
        ("low_confidence", ("small_net",), {}),
        ("big_net", ("low_confidence",), {"replicas": 3, "competitive": 3}),
        ("join", ("small_net", "big_net"), {}),
        ("pick", ("join",), {}),
    ]
    five = optimize(ex.cascade(), rules=["competition"], options=OptimizerOptions(competitive_replicas=5))
    assert marks(five.stages["big_net"]) == {"replicas": 5, "competitive": 5}
    off = optimize(ex.cascade(), rules=["competition"], options=OptimizerOptions(competitive_replicas=1))
    assert marks(off.stages["big_net"]) == {}


def test_competition_expands_anyof_into_alternatives_and_a_choose_stage():
    plan = optimize(ex.competition(), rules=["competition"])
    A = "anyof(small,medium,large)"
    assert layout(plan) == [
        ("preprocess", (REQ,), {}),
        (f"{A}[0]", ("preprocess",), {}),
        (f"{A}[1]", ("preprocess",), {}),
        (f"{A}[2]", ("preprocess",), {}),
        (A, (f"{A}[0]", f"{A}[1]", f"{A}[2]"), {"wait": "first_valid"}),
        ("label", (A,), {}),
    ]
    anyof = Plan.from_flow(ex.competition()).stages[A].nodes[0].op
    for i, fn in enumerate((ex.small, ex.medium, ex.large)):
        (node,) = plan.stages[f"{A}[{i}]"].nodes
        assert node.op == anyof.alternative(i) and node.op.fn is fn
    head = plan.stages[A].nodes[0]
    assert isinstance(head.op, ChooseOp) and head.op.anyof == anyof
    assert head.inputs == ("@0", "@1", "@2")


def test_competition_cuts_a_fused_stage_around_the_racing_operator():
    flow = chain_flow(g={"high_variance": True})
    fused = optimize(flow, rules=["fusion"])
    assert list(fused.stages) == ["f+g+h"]
    plan = optimize(fused, rules=["competition"])
    assert layout(plan) == [
        ("f", (REQ,), {}),
        ("g", ("f",), {"replicas": 3, "competitive": 3}),
        ("h", ("g",), {}),
    ]
    assert plan.rules == ("fusion", "competition")


def test_competition_cuts_an_anyof_out_of_a_fused_stage():
    plan = optimize(ex.competition(), rules=["fusion", "competition"])
    A = "anyof(small,medium,large)"
    assert layout(plan) == [
        ("preprocess", (REQ,), {}),
        (f"{A}[0]", ("preprocess",), {}),
        (f"{A}[1]", ("preprocess",), {}),
        (f"{A}[2]", ("preprocess",), {}),
        (A, (f"{A}[0]", f"{A}[1]", f"{A}[2]"), {"wait": "first_valid"}),
        ("label", (A,), {}),
    ]


def test_can_compete():
    plan = Plan.from_flow(ex.cascade())
    opts = OptimizerOptions()
    assert competition.can_compete(plan.stages["big_net"], opts)
    assert not competition.can_compete(plan.stages["small_net"], opts)
    raced = competition.compete(plan, "big_net", opts)
    assert not competition.can_compete(raced.stages["big_net"], opts)


# -- locality ---------------------------------------------------------------------------------------------


def test_locality_marks_per_row_lookups_only():
    plan = optimize(ex.recommender(), rules=["locality"])
    assert layout(plan) == [
        ("parse_user", (REQ,), {}),
        ("lookup(user)", ("parse_user",), {"continuation": "user"}),
        ("top_item", ("lookup(user)",), {}),
        ("lookup(item)", ("top_item",), {"continuation": "item"}),
        ("lookup(bias)", ("lookup(item)",), {}),
        ("rank", ("lookup(bias)",), {}),
    ]


def test_locality_cuts_a_fused_stage_at_each_per_row_lookup():
    fused = optimize(ex.recommender(), rules=["fusion"])
    plan = optimize(fused, rules=["locality"])
    assert layout(plan) == [
        ("parse_user", (REQ,), {}),
        ("lookup(user)+top_item", ("parse_user",), {"continuation": "user"}),
        ("lookup(item)+lookup(bias)+rank", ("lookup(user)+top_item",), {"continuation": "item"}),
    ]
    assert locality.can_continue(fused.stages[fused.sink])
    assert not any(locality.can_continue(s) for s in plan.stages.values())


def test_locality_cuts_mixing_operators_out_of_a_fused_continuation():
    flow = Flow("l", schema={"k": str})
    flow.lookup(column="k", name="v").map(lambda r: r.v + 1, names=["v"]).groupby("v").agg("count")
    fused = optimize(flow, rules=["fusion"])
    assert list(fused.stages) == ["lookup(k)+lambda+count_by_v"]
    assert layout(optimize(fused, rules=["locality"])) == [
        ("lookup(k)+lambda", (REQ,), {"continuation": "k"}),
        ("count_by_v", ("lookup(k)+lambda",), {}),
    ]


# -- placement --------------------------------------------------------------------------------------------


def test_placement_puts_gpu_operators_on_gpu():
    plan = optimize(ex.cascade(), rules=["placement"])
    assert {n: s.device for n, s in plan.stages.items()} == {
        "preprocess": "cpu",
        "small_net": "gpu",
        "low_confidence": "cpu",
        "big_net": "gpu",
        "join": "cpu",
        "pick": "cpu",
    }


def test_placement_cuts_cpu_operators_out_of_a_gpu_stage():
    flow = chain_flow(g={"gpu": True})
    mixed = optimize(flow, rules=["fusion"], options=OptimizerOptions(fuse_across_devices=True))
    assert layout(mixed) == [("f+g+h", (REQ,), {})]
    assert placement.can_place(mixed.stages["f+g+h"], OptimizerOptions())
    assert layout(optimize(mixed, rules=["placement"])) == [
        ("f", (REQ,), {}),
        ("g", ("f",), {"device": "gpu"}),
        ("h", ("g",), {}),
    ]
    allowed = optimize(mixed, rules=["placement"], options=OptimizerOptions(fuse_across_devices=True))
    assert layout(allowed) == [("f+g+h", (REQ,), {"device": "gpu"})]


def test_placement_of_gpu_anyof_alternatives():
    flow = Flow("a", schema={"x": int})
    flow.anyof(lambda r: r.x, lambda r: -r.x, names=["y"], gpu=True)
    plan = optimize(flow, rules=["competition", "placement"])
    A = "anyof(lambda,lambda)"
    assert layout(plan) == [
        (f"{A}[0]", (REQ,), {"device": "gpu"}),
        (f"{A}[1]", (REQ,), {"device": "gpu"}),
        (A, (f"{A}[0]", f"{A}[1]"), {"wait": "first_valid"}),  # choosing needs no GPU
    ]


# -- batching ---------------------------------------------------------------------------------------------


def test_batching_marks_stages_that_asked_and_are_merge_safe():
    plan = optimize(ex.ensemble(), rules=["batching"])
    assert layout(plan) == [
        ("preprocess", (REQ,), {}),
        ("resnet", ("preprocess",), {"batch": B}),
        ("inception", ("preprocess",), {"batch": B}),
        ("join", ("resnet", "inception"), {}),
        ("pick_best", ("join",), {}),
    ]
    small = BatchConfig(max_batch_size=4, max_wait_ms=0.5)
    custom = optimize(ex.ensemble(), rules=["batching"], options=OptimizerOptions(batch=small))
    assert custom.stages["resnet"].batch == small


def test_batching_never_marks_mixing_stages():
    flow = Flow("m", schema={"x": int, "k": int})
    other = flow.map(lambda r: (r.k, r.x), names=["k", "z"])
    joined = flow.join(other, on="k")  # a join on a data column mixes queries
    joined.groupby("k").agg("sum", "z")
    fused = optimize(flow, rules=["fusion"])
    stage = Plan.from_flow(flow).stages["join"]
    assert not batching.can_batch(stage)
    assert all(s.batch is None for s in optimize(fused, rules=["batching"]).stages.values())


def test_batching_a_batching_filter_and_a_qid_join():
    flow = Flow("q", schema={"x": int})
    a = flow.filter(lambda t: t["x"] > 0, batching=True)
    a.join(flow.map(f, names=["y"])).map(g, names=["y"], batching=True)
    assert layout(optimize(flow, rules=["fusion", "batching"])) == [("lambda+f+join+g", (REQ,), {"batch": B})]
    plan = optimize(flow, rules=["fusion", "batching"], options=CHAINS_ONLY)
    assert layout(plan) == [
        ("lambda", (REQ,), {"batch": B}),
        ("f", (REQ,), {}),
        ("join+g", ("lambda", "f"), {"batch": B}),  # a join on qid pairs rows of one query
    ]


# -- the default list -----------------------------------------------------------------------------------------


def test_default_rules_on_the_ensemble():
    assert layout(optimize(ex.ensemble())) == [
        ("preprocess", (REQ,), {}),
        ("resnet", ("preprocess",), {"device": "gpu", "batch": B}),
        ("inception", ("preprocess",), {"device": "gpu", "batch": B}),
        ("join+pick_best", ("resnet", "inception"), {}),
    ]


def test_default_rules_on_the_cascade():
    plan = optimize(ex.cascade())
    assert plan.rules == ("competition", "locality", "placement", "fusion", "batching")
    assert layout(plan) == [
        ("preprocess", (REQ,), {}),
        ("small_net", ("preprocess",), {"device": "gpu", "batch": B}),
        ("low_confidence", ("small_net",), {}),
        ("big_net", ("low_confidence",), {"device": "gpu", "replicas": 3, "competitive": 3}),
        ("join+pick", ("small_net", "big_net"), {}),
    ]


def test_default_rules_on_the_competition():
    A = "anyof(small,medium,large)"
    assert layout(optimize(ex.competition())) == [
        ("preprocess", (REQ,), {}),
        (f"{A}[0]", ("preprocess",), {}),
        (f"{A}[1]", ("preprocess",), {}),
        (f"{A}[2]", ("preprocess",), {}),
        (f"{A}+label", (f"{A}[0]", f"{A}[1]", f"{A}[2]"), {"wait": "first_valid"}),
    ]


def test_default_rules_on_the_recommender():
    assert layout(optimize(ex.recommender())) == [
        ("parse_user", (REQ,), {}),
        ("lookup(user)+top_item", ("parse_user",), {"continuation": "user"}),
        ("lookup(item)+lookup(bias)+rank", ("lookup(user)+top_item",), {"continuation": "item"}),
    ]


@pytest.mark.parametrize("name", sorted(ex.EXAMPLES))
def test_default_rules_reach_a_fixed_point(name):
    once = optimize(ex.EXAMPLES[name]())
    twice = optimize(once)
    assert layout(twice) == layout(once)
