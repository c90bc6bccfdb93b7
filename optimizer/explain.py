"""``Plan.explain()``: the physical plan as readable, deterministic text.

Stages in topological order, each with its inputs, operators (``op.describe()``), device,
replicas and racing, wait mode, batching and continuation. No ids, addresses or reprs of
functions appear, so the text can be compared with stored files in tests.

    plan 'demo' (2 stages; sink 'SmallNet+pick')
    input: raw: float
    rules: competition, locality, placement, fusion, batching

    stage 1: preprocess
      inputs        request
      operators     map preprocess -> img
      ...
"""

from __future__ import annotations

from collections.abc import Mapping

from optimizer.stage import INPUT, Stage

_W = 14  # width of the field names


def explain(plan, replicas: Mapping[str, int] | None = None) -> str:
    """``plan``: an optimizer Plan (optimizer/plan.py, which imports this module).
    ``replicas``: per stage, how many replicas a deployment placed (GET /flows/{name},
    ``Deployment.explain()``); without it, what the plan asks for."""
    n = len(plan.stages)
    lines = [f"plan {plan.flow_name!r} ({n} stage{'s' if n != 1 else ''}; sink {plan.sink!r})"]
    if plan.input_schema is None:
        lines.append("input: any columns (no schema)")
    else:
        lines.append("input: " + ", ".join(f"{c}: {t}" for c, t in plan.input_schema.items()))
    lines.append("rules: " + (", ".join(plan.rules) if plan.rules else "none (one stage per operator)"))
    if plan.timeout_s is not None:
        lines.append(f"deadline: {plan.timeout_s:g} s (this flow's; the cluster's default otherwise)")
    exact = getattr(getattr(plan, "slo", None), "planned", False)  # an SLO plan places exactly
    for i, stage in enumerate(plan.stages.values(), 1):
        lines.append("")
        lines.extend(_stage(i, stage, None if replicas is None else replicas.get(stage.name), exact))
    if getattr(plan, "slo", None) is not None:  # served under a latency SLO (optimizer.slo.sizing)
        lines.append("")
        lines.extend(plan.slo.explain().splitlines())
    return "\n".join(lines) + "\n"


def _replicas(s: Stage, placed: int | None, exact: bool = False) -> str:
    """One count everywhere: what was placed once deployed, else what the plan asks for. A
    stage that asks for nothing in particular may run on any executor (placement.py)."""
    if s.competitive > 1:
        n = s.replicas if placed is None else placed
        return f"{n}, competitive: {s.competitive} run each input, the first result wins"
    if s.continuation is not None:
        where = "every executor" if placed is None else f"{placed}"
        return f"{where}, rows routed by key"
    if s.replicas == 1 and not exact:
        if placed is None:
            return "any executor (placed on every one; the least loaded runs each request)"
        return f"{placed} (the least loaded runs each request)"
    return str(s.replicas if placed is None else placed)


def _field(name: str, value: str) -> str:
    return f"  {name:<{_W}}{value}"


def _stage(i: int, s: Stage, placed: int | None = None, exact: bool = False) -> list[str]:
    out = [f"stage {i}: {s.name}"]
    out.append(_field("inputs", ", ".join("request" if x == INPUT else x for x in s.inputs)))
    ops = [n.op.describe() for n in s.nodes]
    if not s.chain:  # a fused fork-join region: say what each operator reads
        pos = {n.name: k for k, n in enumerate(s.nodes, 1)}
        for k, n in enumerate(s.nodes):
            src = [_source(s, i) if i.startswith("@") else str(pos[i]) for i in n.inputs]
            ops[k] += f"  (reads {', '.join(src)})"
    if len(ops) == 1:
        out.append(_field("operators", ops[0]))
    else:
        out.append(_field("operators", f"1. {ops[0]}"))
        out.extend(_field("", f"{k}. {d}") for k, d in enumerate(ops[1:], 2))
    out.append(_field("device", s.device))
    out.append(_field("replicas", _replicas(s, placed, exact)))
    if s.wait == "first_valid":
        out.append(
            _field(
                "wait",
                f"first valid of {len(s.inputs)} alternatives (argument order locally, first to arrive deployed)",
            )
        )
    else:
        out.append(_field("wait", "all inputs"))
    if s.batch is None:
        out.append(_field("batching", "no"))
    else:
        wait = f"waiting at most {s.batch.max_wait_ms:g} ms" if s.batch.max_wait_ms else "the queued ones, no wait"
        out.append(_field("batching", f"up to {s.batch.max_batch_size} requests, {wait}"))
    if s.hedge is not None:
        when = f"its observed {s.hedge} latency" if isinstance(s.hedge, str) else f"{s.hedge * 1000:g} ms"
        out.append(_field("hedging", f"a backup copy to another replica after {when} without an answer"))
    if s.deadline_answers:
        out.append(_field("deadline", "answers with the members that arrived by the deadline (missing named)"))
    if s.continuation is not None:
        out.append(
            _field("continuation", f"route rows by key column {s.continuation!r} to an executor that caches the key")
        )
    return out


def _source(s: Stage, ref: str) -> str:
    upstream = s.inputs[int(ref[1:])]
    return "request" if upstream == INPUT else upstream
