"""Fusion under an SLO: the planner may merge neighbouring stages when one merged stage
costs less than the two did (FlowServe's own step; InferLine plans each model apart).

    plan, profile, result, merged = plan_with_fusion(plan, profile, SLO(60), trace, options)
    merged   # e.g. {"detect+classify+post": ("detect", "classify", "post")}

Why: the optimizer's fusion rule decides without profiles, so it keeps a CPU operator out
of a GPU stage (the GPU time it would hold is assumed to cost more than the hop). Under an
SLO the planner knows better. A cheap CPU step after a GPU model costs the GPU replica a
little time on each batch, while as a stage of its own it costs CPU replicas sized for the
peak. Two models on one GPU replica batch together, where apart each needs a replica of
its own. So: plan the stages as they are, then greedily try fusing each pair of neighbours
the fusion rule's structural checks allow (across devices), plan again, and keep the
cheapest plan that meets the SLO, until no merge saves cost.

A merged stage's profile is the sum of its parts' (sample by sample, per executor class
and batch size both were profiled at): one call runs the first part on the batch, then
the second. It is an estimate, stored with the plan like the measured profiles.
"""

from __future__ import annotations

from optimizer.options import OptimizerOptions
from optimizer.plan import INPUT, Plan
from optimizer.rules.fusion import fuse, why_not_fuse
from optimizer.slo.errors import InfeasibleSLOError
from optimizer.slo.pipeline import StageConfig
from optimizer.slo.planner import PlannerOptions, SLOPlan, plan_for_slo
from optimizer.slo.profile import Profile

#: the structural checks of the fusion rule, with devices left to the planner's prices
_ACROSS_DEVICES = OptimizerOptions(fuse_across_devices=True)
#: a merge must save at least this share of the cost (not a rounding difference)
_MIN_SAVING = 0.01


def fused_profile(profile: Profile, a: str, b: str, merged: str) -> Profile | None:
    """``profile`` with stage ``merged`` = ``a`` then ``b``: per class and batch size both
    were profiled at, each sample the sum of a's and b's (in measurement order). None when
    they share no class and batch size."""
    per_class = {}
    for cls in profile.classes(a):
        if cls not in profile.classes(b):
            continue
        sizes = [s for s in profile.batch_sizes(a, cls) if s in profile.batch_sizes(b, cls)]
        if sizes:
            per_class[cls] = {
                s: [x + y for x, y in zip(profile.samples(a, cls, s), profile.samples(b, cls, s))] for s in sizes
            }
    if not per_class:
        return None
    stages = {n: {c: dict(bs) for c, bs in cs.items()} for n, cs in profile.stages.items() if n not in (a, b)}
    stages[merged] = per_class
    return Profile(stages)


def _cheapest(profile: Profile, stage: str, options: PlannerOptions) -> str:
    priced = [c for c in profile.classes(stage) if c in options.prices]
    return min(priced or profile.classes(stage), key=lambda c: (options.prices.get(c, 0.0), c))


def _neighbours(plan: Plan):
    """(a, b) for each stage b that reads only the stage a."""
    for b in plan.stages.values():
        if len(b.inputs) == 1 and b.inputs[0] != INPUT:
            yield plan.stages[b.inputs[0]], b


def plan_with_fusion(
    plan: Plan, profile: Profile, slo, trace, options: PlannerOptions, first: SLOPlan | None = None
) -> tuple[Plan, Profile, SLOPlan, dict]:
    """The cheapest of ``plan`` and its fusions of neighbours that meets ``slo`` on
    ``trace``: (plan, profile, planner result, {merged stage: the stages it holds}).
    ``first``: the planner's result for ``plan`` as it is, if already computed."""
    best = first if first is not None else plan_for_slo(plan, profile, slo, trace, options)
    merged: dict[str, tuple[str, ...]] = {}
    while True:
        trials = []
        for a, b in _neighbours(plan):
            if why_not_fuse(plan, a, b, _ACROSS_DEVICES) is not None:
                continue
            fused = fuse(plan, a, b)
            (name,) = set(fused.stages) - set(plan.stages)
            fprofile = fused_profile(profile, a.name, b.name, name)
            if fprofile is None:
                continue
            # the other stages start where the last plan put them: the search only re-sizes
            start = {n: c for n, c in best.configs().items() if n in fused.stages}
            start[name] = StageConfig(1, fused.stages[name].competitive, _cheapest(fprofile, name, options))
            try:
                result = plan_for_slo(fused, fprofile, slo, trace, options, start=start)
            except InfeasibleSLOError:
                continue  # merged, the stage is too slow for the SLO: not a candidate
            if result.cost_per_s < best.cost_per_s * (1.0 - _MIN_SAVING):
                trials.append((result.cost_per_s, result.tail_ms, name, a.name, b.name, fused, fprofile, result))
        if not trials:
            return plan, profile, best, merged
        _, _, name, a, b, plan, profile, best = min(trials, key=lambda t: t[:3])
        merged[name] = merged.pop(a, (a,)) + merged.pop(b, (b,))
