"""What every rule shares: cutting a stage into pieces, and operator classifications.

Rules that mark boundaries (competition, locality, placement) cut a stage where their
boundary falls inside it, so they give the same plan whether fusion ran before them or not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeGuard

from flow.operators import LookupOp
from optimizer.plan import Plan, PlanNode, Stage, stage_name


def rewrite_each(plan: Plan, matches: Callable[[Stage], bool], rewrite: Callable[[Plan, str], Plan]) -> Plan:
    """Rewrite the first stage ``matches`` accepts, then look again, until none does.

    Looking again from the start after each rewrite, rather than looping over a snapshot,
    because a rewrite replaces the stage with new ones (cut pieces, racing copies); each
    ``rewrite`` must leave stages that no longer match, or this would not end.
    """
    while True:
        todo = next((s.name for s in plan.stages.values() if matches(s)), None)
        if todo is None:
            return plan
        plan = rewrite(plan, todo)


def is_dynamic_lookup(op) -> TypeGuard[LookupOp]:
    """A per-row ``lookup(column=...)``: the start of a continuation stage."""
    return op.kind == "lookup" and getattr(op, "column", None) is not None


def op_device(op) -> str:
    """The device an operator asks for: ``"gpu"`` if it was declared ``gpu=True``."""
    return "gpu" if op.gpu else "cpu"


def wants_batching(nodes_or_stage) -> bool:
    """True if some operator asked for ``batching=True`` and every operator is merge-safe."""
    ops = [n.op for n in (nodes_or_stage.nodes if isinstance(nodes_or_stage, Stage) else nodes_or_stage)]
    return any(op.batching for op in ops) and all(op.rowwise for op in ops)


def cut(plan: Plan, name: str, at: Sequence[int]) -> Plan:
    """Cut stage ``name`` before each node index in ``at`` (0 and duplicates ignored).

    The pieces form a chain: the first keeps the stage's inputs and wait mode, each later
    one reads the piece before it. Marks are kept where they still hold: the device stays
    ``gpu`` only for pieces with a gpu operator, ``competitive`` only for pieces with a
    high-variance operator, ``batch`` only for pieces that may still batch, and the
    continuation only on the first piece (which still starts with the lookup).
    """
    stage = plan.stages[name]
    cuts = sorted({i for i in at if 0 < i < len(stage.nodes)})
    if not cuts:
        return plan
    bounds = [0, *cuts, len(stage.nodes)]
    pieces: list[Stage] = []
    for j in range(len(bounds) - 1):
        nodes = list(stage.nodes[bounds[j] : bounds[j + 1]])
        if j > 0:
            nodes[0] = replace(nodes[0], inputs=("@0",))
        pieces.append(_piece(stage, nodes, first=j == 0, upstream=pieces[-1].name if pieces else None))
    return plan.substitute(name, pieces)


def _piece(stage: Stage, nodes: list[PlanNode], first: bool, upstream: str | None) -> Stage:
    """One piece of ``stage``: the first reads the stage's inputs, each other its ``upstream``."""
    racing = stage.competitive > 1 and any(n.op.high_variance for n in nodes)
    competitive = stage.competitive if racing else 1
    return Stage(
        name=stage_name(nodes),
        nodes=tuple(nodes),
        inputs=stage.inputs if first or upstream is None else (upstream,),  # upstream: None only for the first
        replicas=stage.replicas if (racing or stage.competitive == 1) else 1,
        competitive=competitive,
        device="gpu" if stage.device == "gpu" and any(n.op.gpu for n in nodes) else "cpu",
        batch=stage.batch if stage.batch is not None and wants_batching(nodes) else None,
        wait=stage.wait if first else "all",
        continuation=stage.continuation if first else None,
    )


def cut_between(plan: Plan, name: str, differ) -> Plan:
    """Cut stage ``name`` wherever ``differ(previous_op, op)`` is true for neighbours."""
    nodes = plan.stages[name].nodes
    return cut(plan, name, [i for i in range(1, len(nodes)) if differ(nodes[i - 1].op, nodes[i].op)])
