"""Bad rule names, option values and inconsistent plans fail early with clear messages."""

from __future__ import annotations

import dataclasses

import pytest

import flow as flow_pkg
from flow import Flow
from flow.configuration import ConfigTypeError
from flow.errors import FlowDefinitionError, FlowTypeError, FlowValueError
from flow.operators import AggOp, LookupOp, MapOp, UnionOp
from optimizer import DEFAULT_RULES, INPUT, BatchConfig, OptimizerOptions, Plan, PlanNode, Stage, optimize
from tests.optimizer import examples as ex


def test_optimize_is_exported_from_flow():
    plan = flow_pkg.optimize(ex.cascade(), rules=["fusion"])
    assert isinstance(plan, Plan) and plan.rules == ("fusion",)


def test_plan_errors_are_the_flows_definition_errors():
    """A bad plan, rule or option is fixed where the flow is written: the same branch."""
    with pytest.raises(FlowValueError) as e:
        optimize(ex.cascade(), rules=["nope"])
    assert isinstance(e.value, FlowDefinitionError) and isinstance(e.value, ValueError)
    with pytest.raises(ConfigTypeError) as e:  # rules are an option
        optimize(ex.cascade(), rules="fusion")
    assert isinstance(e.value, FlowDefinitionError) and isinstance(e.value, TypeError)


def test_unknown_rule_is_quoted_with_the_known_ones():
    with pytest.raises(FlowValueError, match=r"unknown optimizer rule 'fusoin'; known rules are \['batching', "):
        optimize(ex.cascade(), rules=["fusion", "fusoin"])
    with pytest.raises(FlowValueError, match="unknown optimizer rule 'cull'"):
        OptimizerOptions(rules=("cull",))


@pytest.mark.parametrize(
    "rules, message",
    [
        ("fusion", "rules must be a list of rule names such as .*, got 'fusion'"),
        ({"fusion"}, "rules must be a list of rule names"),
        (["fusion", 3], r"rules must be rule names \(str\), got 3"),
    ],
)
def test_rules_of_the_wrong_type(rules, message):
    with pytest.raises(ConfigTypeError, match=message):
        optimize(ex.cascade(), rules=rules)


def test_a_rule_listed_twice():
    with pytest.raises(FlowValueError, match="optimizer rule 'fusion' is listed twice"):
        optimize(ex.cascade(), rules=["fusion", "batching", "fusion"])


@pytest.mark.parametrize("value", [0, -2, True, 2.5, "3", None])
def test_bad_competitive_replicas(value):
    with pytest.raises(FlowValueError, match=f"competitive_replicas must be an int >= 1, got {value!r}"):
        OptimizerOptions(competitive_replicas=value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_batch_size": 0}, "max_batch_size must be an int >= 1, got 0"),
        ({"max_batch_size": 8.0}, "max_batch_size must be an int >= 1, got 8.0"),
        ({"max_batch_size": False}, "max_batch_size must be an int >= 1, got False"),
        ({"max_wait_ms": -1}, "max_wait_ms must be a finite number >= 0, got -1"),
        ({"max_wait_ms": float("nan")}, "max_wait_ms must be a finite number >= 0, got nan"),
        ({"max_wait_ms": float("inf")}, "max_wait_ms must be a finite number >= 0, got inf"),
        ({"max_wait_ms": "2"}, "max_wait_ms must be a finite number >= 0, got '2'"),
    ],
)
def test_bad_batch_config(kwargs, message):
    with pytest.raises(FlowValueError, match=message):
        BatchConfig(**kwargs)


def test_bad_options_of_the_wrong_type():
    with pytest.raises(ConfigTypeError, match="batch must be a BatchConfig, got 20"):
        OptimizerOptions(batch=20)
    with pytest.raises(ConfigTypeError, match="fuse_across_devices must be a bool, got 'yes'"):
        OptimizerOptions(fuse_across_devices="yes")
    with pytest.raises(FlowTypeError, match="options must be an OptimizerOptions, got dict"):
        optimize(ex.cascade(), options={"competitive_replicas": 3})


def test_options_are_frozen_with_documented_defaults():
    opts = OptimizerOptions()
    assert opts.rules == DEFAULT_RULES == ("competition", "locality", "placement", "fusion", "batching")
    assert opts.competitive_replicas == 3 and opts.fuse_across_devices is False
    assert opts.batch == BatchConfig(max_batch_size=20, max_wait_ms=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.competitive_replicas = 5
    assert OptimizerOptions(rules=["fusion"]).rules == ("fusion",)  # a list is taken as a tuple


def test_options_rules_are_used_unless_rules_is_given():
    opts = OptimizerOptions(rules=("placement",))
    assert optimize(ex.cascade(), options=opts).rules == ("placement",)
    assert optimize(ex.cascade(), rules=["fusion"], options=opts).rules == ("fusion",)


def test_flow_errors_pass_through():
    flow = Flow("two_sinks", schema={"x": int})
    flow.map(lambda r: r.x, names=["a"])
    flow.map(lambda r: r.x, names=["b"])
    with pytest.raises(FlowValueError, match="2 unmerged sinks"):
        optimize(flow)
    with pytest.raises(FlowTypeError, match="expects a Flow, got str"):
        optimize("not a flow")


# -- plans and stages check themselves -------------------------------------------------------------------


def node(name, op=None, inputs=("@0",)):
    return PlanNode(name, op or MapOp(fn=len, names=("y",)), inputs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"wait": "any"}, "wait='any'; expected one of"),
        ({"device": "tpu"}, "device='tpu'; expected one of"),
        ({"replicas": 0}, "replicas must be an int >= 1, got 0"),
        ({"competitive": 3}, "competitive=3 needs at least as many replicas, got replicas=1"),
        ({"batch": 5}, "batch must be a BatchConfig or None, got 5"),
        ({"wait": "first_valid"}, "wait='first_valid' needs a ChooseOp head"),
        ({"continuation": "k"}, r"continuation='k' needs a head lookup\(column='k'\)"),
    ],
)
def test_bad_stage_marks(kwargs, message):
    with pytest.raises(FlowValueError, match=message):
        Stage("s", (node("s"),), (INPUT,), **kwargs)


def test_stage_node_wiring_is_checked():
    with pytest.raises(FlowValueError, match="has no operators"):
        Stage("s", (), (INPUT,))
    with pytest.raises(FlowValueError, match=r"node 'a' reads '@1', which is neither an earlier node"):
        Stage("a", (node("a", inputs=("@1",)),), (INPUT,))
    with pytest.raises(FlowValueError, match=r"node 'b' reads 'x', which is neither an earlier node"):
        Stage("a+b", (node("a"), node("b", inputs=("x",))), (INPUT,))
    with pytest.raises(FlowValueError, match=r"node 'a' reads 'b', which is neither an earlier node"):
        Stage("a+b", (node("a", inputs=("b",)), node("b")), (INPUT,))  # not in topological order
    with pytest.raises(FlowValueError, match=r"nodes \['a'\] feed nothing"):
        Stage("a+b", (node("a"), node("b")), (INPUT,))
    with pytest.raises(FlowValueError, match=r"inputs \['@1'\] are read by no node"):
        Stage("a", (node("a"),), (INPUT, INPUT))
    with pytest.raises(FlowValueError, match=r"takes 2 input\(s\)"):
        from flow.operators import JoinOp

        Stage("j", (node("j", JoinOp()),), (INPUT,))


def test_batching_a_mixing_stage_is_refused():
    agg = AggOp(fn="count", name="n")
    with pytest.raises(FlowValueError, match="cannot batch, operator 'n' mixes rows of different queries"):
        Stage("n", (node("n", agg),), (INPUT,), batch=BatchConfig())


def test_a_continuation_stage_must_stay_rowwise():
    lookup = LookupOp(column="k", name="v")
    with pytest.raises(FlowValueError, match="runs per key group; operator 'n' mixes rows"):
        Stage("l+n", (node("l", lookup), node("n", AggOp(name="n"), ("l",))), (INPUT,), continuation="k")


def test_a_continuation_stage_must_be_a_chain():
    """Its key groups' outputs merge back by row position, which a fork-join cannot keep."""
    lookup = LookupOp(column="k", name="v")
    with pytest.raises(FlowValueError, match="runs per key group and must be a chain"):
        Stage("l+u", (node("l", lookup), node("u", UnionOp(), ("l", "l"))), (INPUT,), continuation="k")


def test_plan_wiring_is_checked():
    a = Stage("a", (node("a"),), (INPUT,))
    b = Stage("b", (node("b"),), ("a",))
    with pytest.raises(FlowValueError, match="stage 'b' reads 'a', which is not an earlier stage"):
        Plan("p", {"b": b, "a": a}, "b")
    with pytest.raises(FlowValueError, match="sink 'c' is not a stage"):
        Plan("p", {"a": a, "b": b}, "c")
    with pytest.raises(FlowValueError, match="stage 'a' is listed under 'x'"):
        Plan("p", {"x": a}, "x")
    with pytest.raises(FlowValueError, match="stage 'a' is not the sink and nothing reads it"):
        Plan("p", {"a": a, "c": Stage("c", (node("c"),), (INPUT,))}, "c")
    with pytest.raises(FlowValueError, match="operator 'a' appears in two places"):
        Plan("p", {"a": a, "a2": Stage("a2", (node("a"),), ("a",))}, "a2")


def test_plans_are_immutable_and_rules_do_not_change_their_input():
    base = Plan.from_flow(ex.cascade())
    before = list(base.stages.values())
    optimize(base)
    assert list(base.stages.values()) == before and base.rules == ()
    with pytest.raises(TypeError):
        base.stages["pick"] = before[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.sink = "x"


@pytest.mark.parametrize("name", sorted(ex.EXAMPLES))
def test_plans_pickle_for_shipping_to_executors(name):
    import pickle

    import cloudpickle

    plan = optimize(ex.EXAMPLES[name]())
    for dumps in (pickle.dumps, cloudpickle.dumps):
        copy = pickle.loads(dumps(plan))
        assert copy == plan and copy.explain() == plan.explain()
