"""Competitive execution: race replicas of high-variance stages; expand ``anyof``.

- A ``high_variance=True`` operator gets a stage of its own (cut from any neighbours) with
  ``competitive=k`` (``OptimizerOptions.competitive_replicas``, default 3) and at least k
  replicas: all k run each input and the consumer goes on with the first result (the
  seed's wait-for-one; 1 -> 3 replicas cut p99 by 71-94%). Racing a whole fused stage
  would run its deterministic operators k times too, so they are cut out of it here;
  consecutive high-variance operators race together. Fusion then takes cheap neighbouring
  maps and filters back into the racing stage (``OptimizerOptions.fuse_into_race``,
  ``fusion.cheap_to_race``): each copy runs them, at the cost of one boundary instead of three.
- A hedged operator (``map(..., hedge="p95")``) gets a stage of its own: one replica runs
  each input, a second gets a backup copy only when the first has not
  answered by the stage's observed percentile (reactive redundancy, cheaper than racing).
- ``anyof(f1, ..., fn)`` runs, unoptimized, as one stage that calls every alternative and
  keeps the first valid result in argument order. Here it becomes n alternative stages
  ``<anyof>[i]`` (each ``AnyOfOp.alternative(i)``, a plain map) reading the anyof's input,
  feeding one stage named like the anyof whose head is ``ChooseOp`` with
  ``wait="first_valid"``; fusion may later pull the downstream chain into that stage.

    plan = competition.apply(Plan.from_flow(flow))
"""

from __future__ import annotations

from flow.errors import FlowValueError
from flow.operators import AnyOfOp
from optimizer.options import OptimizerOptions
from optimizer.plan import ChooseOp, Plan, PlanNode, Stage
from optimizer.rules.base import cut, cut_between, rewrite_each, wants_batching

NAME = "competition"


def _anyof_index(stage: Stage) -> int | None:
    return next((i for i, n in enumerate(stage.nodes) if n.op.kind == "anyof"), None)


def _hedge(op):
    return getattr(op, "hedge", None)


def _needs_hedge_cut(stage: Stage) -> bool:
    """A hedged operator shares its stage with operators hedged otherwise (or not at all)."""
    hedges = [_hedge(n.op) for n in stage.nodes]
    return any(h is not None for h in hedges) and len(set(hedges)) > 1


def can_compete(stage: Stage, options) -> bool:
    """May apply: the stage holds an anyof to expand, a hedged operator not yet in a stage
    of its own with two replicas, or a high-variance operator that is not yet racing alone
    with ``competitive=k``."""
    if _anyof_index(stage) is not None:
        return True
    if _needs_hedge_cut(stage):
        return True
    hv = [n.op.high_variance for n in stage.nodes]
    if not any(hv) or options.competitive_replicas == 1:
        return False
    return not all(hv) or stage.competitive != options.competitive_replicas


def compete(plan: Plan, name: str, options) -> Plan:
    """Apply to stage ``name``: expand its first anyof, or isolate and race its
    high-variance operators. Call only where ``can_compete`` holds."""
    stage = plan.stages[name]
    i = _anyof_index(stage)
    if i is not None:
        plan = cut(plan, name, [i, i + 1])
        return expand_anyof(plan, stage.nodes[i].name)
    if _needs_hedge_cut(stage):
        # hedged operators get a stage of their own: a backup replays only them (the stage
        # is placed on every executor by default; the dispatcher names a second for the backup)
        return cut_between(plan, name, lambda a, b: _hedge(a) != _hedge(b))
    k = options.competitive_replicas
    plan = cut_between(plan, name, lambda a, b: a.high_variance != b.high_variance)
    for s in list(plan.stages.values()):
        if (
            all(n.op.high_variance for n in s.nodes)
            and s.competitive != k
            and any(n.name == s.nodes[0].name for n in stage.nodes)
        ):
            plan = plan.substitute(s.name, [s.with_(competitive=k, replicas=max(s.replicas, k))])
    return plan


def expand_anyof(plan: Plan, name: str) -> Plan:
    """Replace the one-node anyof stage ``name`` by its alternatives and a choose stage."""
    stage = plan.stages[name]
    (node,) = stage.nodes
    op = node.op
    if not isinstance(op, AnyOfOp):  # callers pass the stages _anyof_index found
        raise FlowValueError(f"stage {name!r}: expand_anyof needs an anyof operator, got {op.kind}")
    alts = []
    for i in range(len(op.alternatives)):
        alt_name = f"{node.name}[{i}]"
        alt_node = PlanNode(alt_name, op.alternative(i), ("@0",))
        alts.append(
            Stage(
                name=alt_name,
                nodes=(alt_node,),
                inputs=stage.inputs,
                device="gpu" if stage.device == "gpu" and alt_node.op.gpu else "cpu",
                batch=stage.batch if stage.batch is not None and wants_batching([alt_node]) else None,
            )
        )
    choose = Stage(
        name=node.name,
        nodes=(PlanNode(node.name, ChooseOp(anyof=op), tuple(f"@{j}" for j in range(len(alts)))),),
        inputs=tuple(a.name for a in alts),
        wait="first_valid",
    )
    return plan.substitute(name, [*alts, choose])


def apply(plan: Plan, options=None) -> Plan:
    """Expand every anyof and race every high-variance operator (see module docs)."""
    options = options or OptimizerOptions()
    return rewrite_each(plan, lambda s: can_compete(s, options), lambda p, name: compete(p, name, options))
