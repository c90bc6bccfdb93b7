"""A plan served under an SLO: the planner's answer applied to the physical plan.

    plan = optimize(flow)
    served = serve_under(plan, SLO(p99_ms=50), profile=profile, trace=poisson(200, 4000))
    served.stages["SmallNet"].batch.max_batch_size   # the planned batch size
    served.slo.budgets["SmallNet"]                   # its share of the SLO (the AIMD budget)
    print(served.explain())                          # the plan, then why each stage got its size

``serve_under`` is pure: it returns a new ``Plan`` whose stages carry the planned replicas,
batch size and device, and whose ``slo`` is a ``ServingSLO`` (the objective, per-stage
budgets and reasons, the planning envelope for the tuner and the profile, stored with the
plan so that a redeploy or a re-plan reuses it). Without a profile the SLO is only
attached: budgets are equal shares of the critical path, stages keep their size, and
``explain()`` says to profile the flow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flow.errors import FlowTypeError, FlowValueError
from optimizer.plan import DEVICES, INPUT, BatchConfig, Plan
from optimizer.slo.aimd import HEADROOM
from optimizer.slo.envelope import envelope_of
from optimizer.slo.pipeline import Shape, StageConfig
from optimizer.slo.planner import PlannerOptions, SLOPlan, describe_change, plan_for_slo
from optimizer.slo.profile import Profile
from optimizer.slo.spec import SLO
from optimizer.slo.traces import check_trace, poisson

#: AIMD may grow a stage's batch to this many times the planned size (docs/slo.md)
AIMD_HEADROOM = HEADROOM


@dataclass(frozen=True)
class ServingSLO:
    """What a plan served under an SLO carries (``Plan.slo``): plain values, so it pickles
    with the plan and ``to_dict()`` is JSON (``GET /flows/{name}``).

    - ``budgets``: per stage, its latency budget in ms (what its AIMD batcher keeps each
      batch within);
    - ``configs`` / ``reasons``: the planner's choice per stage and why (empty when the
      plan was not profiled);
    - ``tail_ms`` / ``p50_ms`` / ``cost_per_s``: the simulated figures on the planning trace;
    - ``rate_rps`` / ``envelope``: the planning trace's mean rate and arrival envelope
      (window ms -> most arrivals), what the tuner compares live traffic with;
    - ``profile_json``: the profile it was planned from (``Profile.from_json``);
    - ``options``: the planner options' plain fields, so that the tuner re-plans alike;
    - ``adapt``: True (default) lets the runtime adapt the plan (AIMD batch sizes, the
      tuner's replicas); False pins the planned configuration (to check the simulator);
    - ``ladder``: the tuner's re-plans (``optimizer.slo.tuning.Rung.to_dict()`` each, by
      rate; the first is this plan's configuration), computed when the flow was planned.
    """

    slo: SLO
    budgets: Mapping[str, float]
    configs: Mapping[str, StageConfig] = field(default_factory=dict)
    reasons: Mapping[str, str] = field(default_factory=dict)
    tail_ms: float | None = None
    p50_ms: float | None = None
    cost_per_s: float | None = None
    rate_rps: float | None = None
    envelope: Mapping[float, int] | None = None
    profile_json: str | None = None
    options: Mapping | None = None
    adapt: bool = True
    ladder: tuple = ()

    @property
    def planned(self) -> bool:
        return bool(self.configs)

    def profile(self) -> Profile | None:
        return None if self.profile_json is None else Profile.from_json(self.profile_json)

    def rungs(self) -> tuple:
        """The ladder as ``Rung`` objects (optimizer/slo/tuning.py)."""
        from optimizer.slo.tuning import Rung

        return tuple(Rung.from_dict(d) for d in self.ladder)

    def planner_options(self) -> PlannerOptions:
        return PlannerOptions(**dict(self.options or {}))

    def explain(self) -> str:
        lines = [f"SLO {self.slo.describe()}"]
        if not self.planned:
            lines[0] += ": not profiled, each stage's budget is an equal share of the critical path"
            lines.append("  (profile the flow, `flowserve profile FLOW`, for planned batch sizes and replicas)")
        else:
            lines[0] += (
                f": simulated p{self.slo.percentile:g} {self.tail_ms:.1f} ms, p50 {self.p50_ms:.1f} ms at "
                f"{self.rate_rps:.0f} req/s, cost {self.cost_per_s:g} (replicas x price, per unit of time)"
            )
        for stage, budget in self.budgets.items():
            c = self.configs.get(stage)
            got = f"{c.executor_class} x{c.replicas}, batch {c.batch_size}, " if c is not None else ""
            why = f" -- {self.reasons[stage]}" if stage in self.reasons else ""
            lines.append(f"  {stage}: {got}budget {budget:.1f} ms{why}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "slo": self.slo.to_dict(),
            "planned": self.planned,
            "budgets_ms": dict(self.budgets),
            "budget_share": self.shares(),
            "stages": {
                n: {"batch_size": c.batch_size, "replicas": c.replicas, "executor_class": c.executor_class}
                for n, c in self.configs.items()
            },
            "reasons": dict(self.reasons),
            "simulated_tail_ms": self.tail_ms,
            "simulated_p50_ms": self.p50_ms,
            "cost_per_s": self.cost_per_s,
            "planning_rate_rps": self.rate_rps,
            "ladder_rates_rps": [d["rate_rps"] for d in self.ladder],
        }

    def shares(self) -> dict[str, float]:
        """Each stage's budget as a share of the SLO (what /metrics exports)."""
        return {n: b / self.slo.p99_ms for n, b in self.budgets.items()}


def planning_trace(rate_rps: float, seconds: float = 20.0, seed: int = 0):
    """A Poisson planning trace of ``seconds`` at ``rate_rps`` (at least 2,000 requests, so
    that a p99 is measured on 20 or more of them)."""
    n = max(2000, int(rate_rps * seconds))
    return poisson(rate_rps, n, seed)


def equal_budgets(plan: Plan, slo: SLO, hop_ms: float = 0.0) -> dict[str, float]:
    """Without a profile: each stage gets the SLO (less the hops) divided by the number of
    stages on the longest path to the sink through it."""
    depth: dict[str, int] = {INPUT: 0}
    for s in plan.stages.values():
        depth[s.name] = 1 + max(depth[i] for i in s.inputs)
    longest = depth[plan.sink]
    usable = max(slo.p99_ms - hop_ms * (longest + 1), slo.p99_ms / 2)
    return {n: usable / longest for n in plan.stages}


def serve_under(
    plan: Plan,
    slo: SLO,
    *,
    profile: Profile | None = None,
    trace=None,
    rate_rps: float | None = None,
    options: PlannerOptions | None = None,
    ladder: Sequence[float] = (),
) -> Plan:
    """``plan`` configured to meet ``slo``: with a profile and a planning load (``trace``
    of arrival ms, or ``rate_rps`` for a Poisson one) each stage gets the planner's batch
    size, replicas and class; else the SLO is attached with equal budgets. ``ladder``:
    multiples of the planning rate to re-plan for now (``tuning.LADDER_FACTORS``), what
    the runtime's tuner switches to when traffic leaves the planned envelope. Raises
    ``InfeasibleSLOError`` naming the stage that cannot meet the SLO."""
    if not isinstance(plan, Plan):
        raise FlowTypeError(f"serve_under needs an optimizer Plan, got {type(plan).__name__}")
    if not isinstance(slo, SLO):
        raise FlowTypeError(f"slo must be an SLO (SLO(p99_ms=50)), got {type(slo).__name__} {slo!r:.80}")
    options = PlannerOptions() if options is None else options
    if not isinstance(options, PlannerOptions):
        raise FlowTypeError(f"options must be PlannerOptions, got {type(options).__name__}")
    opts = {
        "prices": dict(options.prices),
        "hop_ms": options.hop_ms,
        "routing": options.routing,
        "max_replicas": options.max_replicas,
        "max_batch": options.max_batch,
        "seed": options.seed,
        "fuse": options.fuse,
        "headroom": options.headroom,
    }
    if profile is None:
        attached = ServingSLO(slo, equal_budgets(plan, slo, options.hop_ms), options=opts)
        return replace(plan, slo=attached)
    if not isinstance(profile, Profile):
        raise FlowTypeError(f"profile must be a Profile, got {type(profile).__name__}")
    missing = [n for n in plan.stages if n not in profile.stages]
    if missing:
        raise FlowValueError(
            f"flow {plan.flow_name!r}: the profile has no stage(s) {missing} (profiled: {sorted(profile.stages)}); "
            f"profile this plan again (`flowserve profile {plan.flow_name}`)"
        )
    if trace is None:
        if rate_rps is None:
            raise FlowValueError(
                f"flow {plan.flow_name!r}: planning under an SLO needs the expected load: "
                f"traffic=<requests per second> or a trace of arrival times (ms)"
            )
        trace = planning_trace(rate_rps)
    trace = check_trace(trace)
    result = plan_for_slo(Shape.from_plan(plan), profile, slo, trace, options)
    if options.fuse:
        plan, profile, result = _fused(plan, profile, slo, trace, options, result)
    rungs: tuple = ()
    if ladder:
        from optimizer.slo.tuning import ladder as plan_ladder

        rate = float(rate_rps) if rate_rps is not None else _mean_rate(trace)
        shape = Shape.from_plan(plan)
        rungs = plan_ladder(shape, profile, slo, rate, result, options, factors=ladder, trace=trace)
    return apply_plan(plan, result, profile, trace, opts, ladder=tuple(r.to_dict() for r in rungs))


def _fused(plan: Plan, profile: Profile, slo: SLO, trace, options: PlannerOptions, first: SLOPlan):
    """The planner's fusions of neighbouring stages (optimizer/slo/fusing.py), each merged
    stage's reason saying what it holds and what merging saved."""
    from optimizer.slo.fusing import plan_with_fusion

    plan, profile, result, merged = plan_with_fusion(plan, profile, slo, trace, options, first=first)
    if merged:
        saved = f"cost {first.cost_per_s:g} -> {result.cost_per_s:g} a unit of time"
        stages = dict(result.stages)
        for name, s in stages.items():
            if name in merged:
                why = f"fused {', '.join(merged[name])} by the planner ({saved}); {s.reason}"
            else:  # planned apart first; the merges' searches started from that
                before, now = first.stages[name], s.config
                why = before.reason
                if now != before.config:
                    why += f"; after the merges {describe_change({name: before.config}, {name: now}, name)}"
            stages[name] = replace(s, reason=why)
        result = replace(result, stages=stages)
    return plan, profile, result


def with_rung(plan: Plan, rung) -> Plan:
    """``plan`` (served under an SLO) running ``rung`` of its ladder: each stage's batch
    size and replicas, the budgets (what AIMD keeps batches within) and the rate the tuner
    compares traffic with; the ladder, profile and options are kept."""
    serving = plan.slo
    if not isinstance(serving, ServingSLO) or not serving.planned:  # Plan.slo: a ServingSLO or None
        raise FlowValueError(f"flow {plan.flow_name!r}: only a plan served under a profiled SLO has re-plans")
    stages = {}
    for name, stage in plan.stages.items():
        c = rung.configs[name]
        changes: dict[str, Any] = {"replicas": max(c.replicas, stage.competitive)}
        if stage.batch is not None:
            changes["batch"] = BatchConfig(max_batch_size=c.batch_size, max_wait_ms=stage.batch.max_wait_ms)
        stages[name] = replace(stage, **changes)
    attached = replace(
        serving,
        budgets=dict(rung.budgets),
        configs=dict(rung.configs),
        reasons={n: f"tuner: re-planned for {rung.rate_rps:.0f} req/s" for n in rung.configs},
        tail_ms=rung.tail_ms,
        cost_per_s=rung.cost_per_s,
        rate_rps=rung.rate_rps,
    )
    return replace(plan.replace_stages(stages), slo=attached)


def apply_plan(plan: Plan, result: SLOPlan, profile: Profile, trace, options: Mapping, ladder: tuple = ()) -> Plan:
    """The planner's ``result`` written into ``plan``'s stages, with the ``ServingSLO``
    (``ladder``: its re-plans, ``Rung.to_dict()`` each)."""
    stages = {}
    for name, stage in plan.stages.items():
        c = result.stages[name].config
        changes: dict[str, Any] = {"replicas": max(c.replicas, stage.competitive)}
        if stage.batch is not None:
            changes["batch"] = BatchConfig(max_batch_size=c.batch_size, max_wait_ms=stage.batch.max_wait_ms)
        if c.executor_class in DEVICES:
            changes["device"] = c.executor_class
        stages[name] = replace(stage, **changes)
    attached = ServingSLO(
        result.slo,
        budgets={n: s.budget_ms for n, s in result.stages.items()},
        configs=result.configs(),
        reasons={n: s.reason for n, s in result.stages.items()},
        tail_ms=result.tail_ms,
        p50_ms=result.p50_ms,
        cost_per_s=result.cost_per_s,
        rate_rps=_mean_rate(trace),
        envelope=envelope_of(trace),
        profile_json=profile.to_json(),
        options=dict(options),
        ladder=ladder,
    )
    return replace(plan.replace_stages(stages), slo=attached)


def _mean_rate(trace) -> float:
    """Requests per second over the planning trace (arrival ms)."""
    duration_s = max((float(trace[-1]) - float(trace[0])) / 1000.0, 1e-3)
    return len(trace) / duration_s
