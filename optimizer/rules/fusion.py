"""Operator fusion: merge linear chains of stages into one stage (Beam's fusion, Dask's fuse).

A fused stage runs as one function on one executor, so its operators' Tables never cross
the network (the seed: 3-5x faster on a chain of 10 functions). Stage ``b`` fuses into
its upstream stage ``a`` (giving ``a+b``) when ``why_not_fuse`` finds no reason against:

1. ``b`` reads only ``a`` (a stage's later operators take exactly one input), and
2. ``a`` is read only by ``b``: a stage with several consumers is never fused into one of
   them, since the others still need its output (duplicating it would run it twice);
3. ``b`` does not start a continuation (a per-row lookup: its rows must go where the key
   is cached), and if ``a`` is a continuation stage, ``b`` is row-wise (a continuation
   stage runs per key group, which only row-wise operators tolerate);
4. both race with the same number of replicas (``competitive``): racing a merged stage
   would run the other's deterministic operators k times -- except that a racing stage
   takes in a cheap neighbour (``OptimizerOptions.fuse_into_race``, see ``cheap_to_race``):
   each copy then runs it too, one stage boundary instead of three, as without racing;
5. both need the same device, or ``OptimizerOptions.fuse_across_devices`` is set. This
   is the rule's cost check: without profiles it assumes the GPU time a CPU operator
   would hold costs more than the hop it saves (see optimizer.rules.placement);
6. fusing does not take batching away: if either stage could batch (an operator asked
   for it and all are merge-safe), the other is merge-safe too.

Fusion reads the marks that competition, locality and placement set (and the operators'
gpu/batching flags directly), so those rules run before it by default. Run alone
(``rules=["fusion"]``) it fuses per-row lookups with their upstream like any operator: the
seed's "fusion only" configuration.

    plan = fusion.apply(Plan.from_flow(flow))
    list(plan.stages)        # e.g. ["preprocess+SmallNet"]
"""

from __future__ import annotations

from dataclasses import replace

from optimizer.options import OptimizerOptions
from optimizer.plan import INPUT, Plan, Stage, stage_name
from optimizer.rules.base import wants_batching

NAME = "fusion"


def _device(stage: Stage) -> str:
    return "gpu" if stage.device == "gpu" or any(n.op.gpu for n in stage.nodes) else "cpu"


def why_not_fuse(plan: Plan, a: Stage, b: Stage, options) -> str | None:
    """The reason stage ``b`` may not fuse into its upstream ``a``, or None if it may."""
    if a.name == INPUT or b.inputs != (a.name,):
        return f"{b.name!r} does not read only {a.name!r}"
    if plan.consumers()[a.name] != [b.name]:
        return f"{a.name!r} has other consumers, which need its output"
    if b.continuation is not None:
        return f"{b.name!r} starts a continuation (rows are routed by {b.continuation!r})"
    if a.continuation is not None and not b.rowwise:
        return f"{a.name!r} runs per key group and {b.name!r} mixes rows"
    if a.continuation is not None and any(op.generates for op in b.ops):
        return f"{a.name!r} runs per key group and {b.name!r} yields several rows per row"
    if b.wait != "all":
        return f"{b.name!r} waits for the first valid of several inputs"
    if a.competitive != b.competitive and not _joins_race(a, b, options):
        return f"{a.name!r} and {b.name!r} race different numbers of replicas"
    if a.hedge != b.hedge:
        return f"{a.name!r} and {b.name!r} are hedged differently (a backup replays only its stage)"
    if _device(a) != _device(b) and not options.fuse_across_devices:
        return f"{a.name!r} runs on {_device(a)}, {b.name!r} on {_device(b)}"
    if (wants_batching(a) or wants_batching(b)) and not (a.rowwise and b.rowwise):
        return f"fusing {a.name!r} and {b.name!r} would stop a batching stage from batching"
    if not (a.chain and b.chain) and not (_plain(a) and _plain(b)):
        # a fused fork-join region holds only plain operators, so no later rule cuts it
        return f"{a.name!r} and {b.name!r} would put a marked operator into a fork-join region"
    return None


# -- racing copies take in their cheap neighbours ------------------------------------------

#: Operator kinds that may run in every racing copy: row-wise Python over the request's own
#: rows, no store, no model state of their own that racing would multiply.
CHEAP_KINDS = frozenset({"map", "filter"})


def cheap_to_race(stage: Stage) -> bool:
    """True if ``stage`` may run inside each copy of a neighbouring racing stage.

    The optimizer has no profiles, so "cheap relative to the raced operator" is read off
    the flags the user gave: the raced operator is the one declared ``high_variance``
    (slow, or slow at times); a neighbour is cheap when nothing says otherwise -- a plain
    row-wise map or filter that is not itself high-variance, not on the GPU (k copies
    would hold k GPUs), not batching (racing copies of one request never batch together),
    not hedged or cached (their runtime state is per stage), and reading no store (a lookup
    would read k times). Such an operator costs each copy its own run, which a stage
    boundary (a message, a wake-up, ~0.2 ms here) costs anyway. A user who knows better
    turns it off: ``OptimizerOptions(fuse_into_race=False)``.
    """
    return (
        stage.competitive == 1
        and stage.hedge is None
        and stage.continuation is None
        and stage.wait == "all"
        and stage.batch is None
        and all(
            n.op.kind in CHEAP_KINDS
            and not n.op.high_variance
            and not n.op.gpu
            and not n.op.batching
            and getattr(n.op, "hedge", None) is None
            and getattr(n.op, "cache", None) is None
            for n in stage.nodes
        )
    )


def _joins_race(a: Stage, b: Stage, options) -> bool:
    """``a`` and ``b`` race differently, but one races and the other is cheap to race."""
    if not options.fuse_into_race or a.continuation is not None or b.continuation is not None:
        return False
    racing, other = (a, b) if a.competitive > 1 else (b, a)
    return racing.competitive > 1 and racing.hedge is None and cheap_to_race(other)


def can_fuse(plan: Plan, a: Stage, b: Stage, options) -> bool:
    """May apply: stage ``b`` may fuse into its only upstream ``a``."""
    return why_not_fuse(plan, a, b, options) is None


def fuse(plan: Plan, a: Stage, b: Stage) -> Plan:
    """Apply: one stage ``a+b`` running a's operators then b's, where b was."""
    # b reads only a ("@0"): wherever b's operators read it, they now read a's last operator
    out = a.nodes[-1].name
    nodes = (*a.nodes, *(replace(n, inputs=tuple(out if i == "@0" else i for i in n.inputs)) for n in b.nodes))
    merged = Stage(
        name=stage_name(nodes),
        nodes=nodes,
        inputs=a.inputs,
        replicas=max(a.replicas, b.replicas),
        competitive=max(a.competitive, b.competitive),
        device="gpu" if "gpu" in (a.device, b.device) else "cpu",
        batch=(a.batch or b.batch) if wants_batching(nodes) else None,
        wait=a.wait,
        continuation=a.continuation,
    )
    return plan.substitute(b.name, [merged], drop=[a.name])


def _fuse_chains(plan: Plan, options) -> Plan:
    while True:
        for b in plan.stages.values():
            if len(b.inputs) == 1 and b.inputs[0] != INPUT:
                a = plan.stages[b.inputs[0]]
                if can_fuse(plan, a, b, options):
                    plan = fuse(plan, a, b)
                    break
        else:
            return plan


# -- fork-join regions --------------------------------------------------------------------


def _plain(stage: Stage) -> bool:
    """A stage no other rule marks or cuts: no racing, key routing, choice or device split."""
    return (
        stage.wait == "all"
        and stage.competitive == 1
        and stage.continuation is None
        and not any(
            n.op.high_variance
            or n.op.kind in ("anyof", "choose", "ensemble")
            or getattr(n.op, "hedge", None) is not None
            or (n.op.kind == "lookup" and getattr(n.op, "dynamic", False))
            for n in stage.nodes
        )
    )


def region(plan: Plan, tail: Stage, options) -> list[str]:
    """May apply: the stages that can fuse with ``tail`` into one fork-join region.

    A stage joins the region when all of its consumers are already in it (so the region
    has one output, ``tail``'s), it is plain (see ``_plain``), on ``tail``'s device, and
    the region keeps batching if any part of it could batch.
    """
    if not options.fuse_branches or not _plain(tail):
        return [tail.name]
    consumers = plan.consumers()
    group = {tail.name}
    order = list(plan.stages)
    grew = True
    while grew:
        grew = False
        for name in reversed(order):
            s = plan.stages[name]
            if name in group or not consumers[name] or not all(c in group for c in consumers[name]):
                continue
            if not _plain(s) or (_device(s) != _device(tail) and not options.fuse_across_devices):
                continue
            nodes = [n for m in order if m in group or m == name for n in plan.stages[m].nodes]
            if any(n.op.batching for n in nodes) and not all(n.op.rowwise for n in nodes):
                continue
            group.add(name)
            grew = True
    return [m for m in order if m in group]


def fuse_region(plan: Plan, names: list[str]) -> Plan:
    """Apply: one stage running the region's stages in topological order; the branches of
    a fork run one after the other, the join reads them inside the stage."""
    members = [plan.stages[n] for n in names]
    inside = set(names)
    externals: list[str] = []
    nodes = []
    for s in members:
        for node in s.nodes:
            inputs = []
            for i in node.inputs:
                if not i.startswith("@"):
                    inputs.append(i)
                    continue
                src = s.inputs[int(i[1:])]
                if src in inside:
                    inputs.append(plan.stages[src].nodes[-1].name)
                else:
                    if src not in externals:
                        externals.append(src)
                    inputs.append(f"@{externals.index(src)}")
            nodes.append(replace(node, inputs=tuple(inputs)))
    tail = members[-1]
    merged = Stage(
        name=stage_name(nodes),
        nodes=tuple(nodes),
        inputs=tuple(externals),
        replicas=max(s.replicas for s in members),
        device=tail.device,
        batch=next((s.batch for s in members if s.batch), None) if wants_batching(nodes) else None,
    )
    return plan.substitute(tail.name, [merged], drop=names[:-1])


def apply(plan: Plan, options=None) -> Plan:
    """Fuse every chain the conditions allow, upstream first, then every fork-join region
    (``OptimizerOptions.fuse_branches``), until nothing more fuses (see module docs)."""
    options = options or OptimizerOptions()
    while True:
        plan = _fuse_chains(plan, options)
        for tail in reversed(list(plan.stages.values())):
            names = region(plan, tail, options)
            if len(names) > 1:
                plan = fuse_region(plan, names)
                break
        else:
            return plan
