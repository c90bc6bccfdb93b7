"""The tuner's re-plans: the planner run again over a higher (or lower) arrival rate, and
the decision of which plan to run as traffic moves (InferLine's reactive controller,
with batch sizes re-planned too, issue 17 item 6).

    rungs = ladder(shape, profile, SLO(p99_ms=60), 60.0, planned_configs, options)
    # rungs[0] is the plan for 60 req/s, then one per factor: 90, 120, 180, 240, 360 req/s
    choice = RePlanner(rungs)
    choice.decide(rate_rps=200.0, now=12.0)   # -> 4: the 240 req/s plan, at once
    choice.decide(rate_rps=55.0, now=20.0)    # -> None: down only after 15 s below

A re-plan keeps each stage on the executor class it runs on (moving a stage to other
hardware is a redeploy, not a reaction) and starts the greedy search from the
configuration that runs, so it takes a few simulated steps, not a whole search. The
ladder is computed when the flow is planned (``serve_under``), not by the gateway under
a burst: the planner costs seconds of CPU, which a burst cannot wait for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from optimizer.slo._check import positive_number
from optimizer.slo.errors import InfeasibleSLOError, SLOError, SLOTypeError
from optimizer.slo.pipeline import Shape, StageConfig
from optimizer.slo.planner import PlannerOptions, SLOPlan, plan_for_slo
from optimizer.slo.profile import Profile
from optimizer.slo.spec import SLO
from optimizer.slo.traces import poisson

#: the rates a ladder is planned for, as multiples of the planning rate
LADDER_FACTORS = (1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class Rung:
    """One re-plan: the rate it was planned for and, per stage, its configuration and
    latency budget; the simulated tail and the cost per second."""

    rate_rps: float
    configs: Mapping[str, StageConfig]
    budgets: Mapping[str, float]
    tail_ms: float
    cost_per_s: float

    def to_dict(self) -> dict:
        return {
            "rate_rps": self.rate_rps,
            "configs": {n: [c.batch_size, c.replicas, c.executor_class] for n, c in self.configs.items()},
            "budgets": dict(self.budgets),
            "tail_ms": self.tail_ms,
            "cost_per_s": self.cost_per_s,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> Rung:
        return cls(
            float(d["rate_rps"]),
            {n: StageConfig(int(b), int(r), str(c)) for n, (b, r, c) in d["configs"].items()},
            {n: float(v) for n, v in d["budgets"].items()},
            float(d["tail_ms"]),
            float(d["cost_per_s"]),
        )

    @classmethod
    def of(cls, rate_rps: float, result: SLOPlan) -> Rung:
        return cls(
            float(rate_rps),
            result.configs(),
            {n: s.budget_ms for n, s in result.stages.items()},
            result.tail_ms,
            result.cost_per_s,
        )


def pinned_profile(profile: Profile, configs: Mapping[str, StageConfig]) -> Profile:
    """``profile`` with each stage measured on its configured class only (a re-plan may
    change batch sizes and replicas, not hardware)."""
    stages = {}
    for n, per_class in profile.stages.items():
        c = configs.get(n)
        stages[n] = dict(per_class) if c is None else {c.executor_class: per_class[c.executor_class]}
    return Profile(stages)


def replan(
    shape: Shape,
    profile: Profile,
    slo: SLO,
    rate_rps: float,
    current: Mapping[str, StageConfig],
    options: PlannerOptions | None = None,
    *,
    requests: int = 2000,
) -> SLOPlan:
    """The planner over a Poisson trace of ``requests`` at ``rate_rps``, from ``current``
    with each stage's class kept. Raises ``InfeasibleSLOError`` (naming the bottleneck)
    when no configuration within the options' limits meets the SLO at that rate."""
    rate_rps = positive_number("rate_rps", rate_rps)
    if not isinstance(current, Mapping) or not current:
        raise SLOTypeError(f"current must map stage -> StageConfig, got {current!r:.80}")
    options = PlannerOptions() if options is None else options
    trace = poisson(rate_rps, max(200, int(requests)), options.seed)
    return plan_for_slo(shape, pinned_profile(profile, current), slo, trace, options, start=current)


def ladder(
    shape: Shape,
    profile: Profile,
    slo: SLO,
    rate_rps: float,
    planned: SLOPlan,
    options: PlannerOptions | None = None,
    *,
    factors: Sequence[float] = LADDER_FACTORS,
    requests: int = 2000,
) -> tuple[Rung, ...]:
    """The planned configuration (rung 0, at ``rate_rps``) and a re-plan for each of
    ``factors`` x that rate, each searched from the rung below. Stops at the first rate
    no configuration within the limits meets (the tuner then only adds replicas)."""
    rungs = [Rung.of(rate_rps, planned)]
    last = planned.configs()
    for f in sorted(positive_number("ladder factor", x) for x in factors):
        if f <= 1:
            raise SLOError(f"ladder factors must be over 1 (multiples of the planning rate), got {f!r}")
        try:
            result = replan(shape, profile, slo, rate_rps * f, last, options, requests=requests)
        except InfeasibleSLOError:
            break
        rungs.append(Rung.of(rate_rps * f, result))
        last = result.configs()
    return tuple(rungs)


class RePlanner:
    """Which rung of a ladder should run, from the arrival rate: the lowest rung planned
    for at least the rate (the top one when none is), up at once, down only when every
    reading of the last ``downscale_after_s`` wanted a lower rung (InferLine's 15 s), and
    then to the highest of those. Time is passed in (seconds), so tests drive it.

        r = RePlanner(rungs)                 # starts on rung 0
        r.decide(200.0, now=0.0)             # -> the rung for >= 200 req/s, or None if it runs
    """

    def __init__(self, rungs: Sequence[Rung], *, downscale_after_s: float = 15.0, current: int = 0):
        if not rungs or not all(isinstance(r, Rung) for r in rungs):
            raise SLOTypeError(f"RePlanner needs a non-empty sequence of Rungs, got {rungs!r:.80}")
        rates = [r.rate_rps for r in rungs]
        if rates != sorted(rates):
            raise SLOError(f"ladder rungs must be in increasing rate order, got rates {rates}")
        self.rungs = tuple(rungs)
        self.downscale_after_s = positive_number("downscale_after_s", downscale_after_s, allow_zero=True)
        self.current = current
        self._wants: list[tuple[float, int]] = []

    def want(self, rate_rps: float) -> int:
        """The lowest rung planned for at least ``rate_rps`` (the top one when none is)."""
        for i, r in enumerate(self.rungs):
            if r.rate_rps >= rate_rps:
                return i
        return len(self.rungs) - 1

    def decide(self, rate_rps: float, now: float) -> int | None:
        """The rung to switch to now, or None to keep the one running."""
        want = self.want(rate_rps)
        hist = self._wants
        hist.append((now, want))
        # keep the newest reading at or before the window's start: the history covers the
        # whole window exactly when its first reading is that old
        while len(hist) > 1 and hist[1][0] <= now - self.downscale_after_s:
            hist.pop(0)
        if want > self.current:
            self.current = want
            return want
        if want < self.current and hist[0][0] <= now - self.downscale_after_s:
            most = max(k for _, k in hist)
            if most < self.current:
                self.current = most
                return most
        return None
