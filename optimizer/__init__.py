"""The optimizer: pure rules Plan -> Plan (fusion, competition, locality, batching, placement).

    from flow import Flow, optimize
    plan = optimize(flow)                       # all rules, default order and options
    plan = optimize(flow, rules=["fusion"])     # only the named rules, in that order
    plan = optimize(flow, rules=[])             # Plan.from_flow(flow): one stage per operator
    print(plan.explain())

The default rule order is ``DEFAULT_RULES`` (competition, locality, placement, fusion,
batching; see optimizer.options for why). ``executors.worker.interpreter`` runs a plan in-process
with the same results as ``flow.run``.
"""

from flow.errors import FlowTypeError
from optimizer.options import DEFAULT_RULES, OptimizerOptions
from optimizer.plan import INPUT, BatchConfig, ChooseOp, Plan, PlanNode, Stage


def optimize(flow, rules=None, options=None) -> Plan:
    """The physical plan of ``flow`` after applying the optimizer's rules.

    ``rules``: rule names applied in the given order (default: ``options.rules``, which
    defaults to ``DEFAULT_RULES``); ``[]`` gives ``Plan.from_flow(flow)``. ``options``: an
    ``OptimizerOptions``. ``flow`` may also be a Plan, to apply further rules to it.
    Unknown rule names and bad option values raise ``FlowValueError`` quoting the value.

        plan = optimize(flow, rules=["locality", "fusion"],
                        options=OptimizerOptions(competitive_replicas=5))
    """
    from optimizer.options import check_rules
    from optimizer.rules import RULES

    if options is None:
        options = OptimizerOptions()
    elif not isinstance(options, OptimizerOptions):
        raise FlowTypeError(f"options must be an OptimizerOptions, got {type(options).__name__} {options!r:.80}")
    names = options.rules if rules is None else check_rules(rules)
    plan = flow if isinstance(flow, Plan) else Plan.from_flow(flow)
    applied = list(plan.rules)
    for name in names:
        plan = RULES[name](plan, options)
        applied.append(name)
    return plan.with_rules(applied)


__all__ = [
    "DEFAULT_RULES",
    "INPUT",
    "BatchConfig",
    "ChooseOp",
    "OptimizerOptions",
    "Plan",
    "PlanNode",
    "Stage",
    "optimize",
]
