"""The tuner's re-plans: the planner run again over a higher (or lower) arrival rate, and
the decision of which plan to run as traffic moves (InferLine's reactive controller,
with batch sizes re-planned too).

    rungs = ladder(shape, profile, SLO(p99_ms=60), 60.0, planned_configs, options)
    # rungs[0] is the plan for 60 req/s, then one per factor: 90, 120, 180, 240, 360 req/s
    choice = RePlanner(rungs)
    choice.decide({100.0: 30, 1000.0: 200}, now=12.0)  # -> 4: the lowest rung whose envelope holds that
    choice.decide({100.0: 6, 1000.0: 55}, now=20.0)    # -> None: down only after 15 s below

A re-plan keeps each stage on the executor class it runs on (moving a stage to other
hardware is a redeploy, not a reaction) and starts the greedy search from the
configuration that runs, so it takes a few simulated steps, not a whole search. The
ladder is computed when the flow is planned (``serve_under``), not by the gateway under
a burst: the planner costs seconds of CPU, which a burst cannot wait for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flow.errors import FlowTypeError, FlowValueError
from optimizer.slo._check import positive_number
from optimizer.slo.envelope import envelope_of
from optimizer.slo.errors import InfeasibleSLOError
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
    envelope: Mapping[float, int] = field(default_factory=dict)  # window ms -> most arrivals planned for

    def to_dict(self) -> dict:
        return {
            "rate_rps": self.rate_rps,
            "configs": {n: [c.batch_size, c.replicas, c.executor_class] for n, c in self.configs.items()},
            "budgets": dict(self.budgets),
            "tail_ms": self.tail_ms,
            "cost_per_s": self.cost_per_s,
            "envelope": [[w, n] for w, n in self.envelope.items()],
        }

    def covers(self, counts: Mapping[float, int], windows_ms: Sequence[float]) -> bool:
        """True when the arrivals now in each of ``windows_ms`` (``counts``: window ms ->
        arrivals) are within this rung's planning envelope (InferLine: A(dt) <= A_max(dt));
        a rung without an envelope compares the rate over each window with its rate."""
        for w in windows_ms:
            n = counts.get(w)
            if n is None:
                continue
            limit = self.envelope.get(w) if self.envelope else self.rate_rps * w / 1000.0
            if limit is not None and n > limit:
                return False
        return True

    @classmethod
    def from_dict(cls, d: Mapping) -> Rung:
        return cls(
            float(d["rate_rps"]),
            {n: StageConfig(int(b), int(r), str(c)) for n, (b, r, c) in d["configs"].items()},
            {n: float(v) for n, v in d["budgets"].items()},
            float(d["tail_ms"]),
            float(d["cost_per_s"]),
            {float(w): int(n) for w, n in d.get("envelope", ())},
        )

    @classmethod
    def of(cls, rate_rps: float, result: SLOPlan, trace=None) -> Rung:
        return cls(
            float(rate_rps),
            result.configs(),
            {n: s.budget_ms for n, s in result.stages.items()},
            result.tail_ms,
            result.cost_per_s,
            {} if trace is None else envelope_of(trace),
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
        raise FlowTypeError(f"current must map stage -> StageConfig, got {current!r:.80}")
    return _replan(shape, profile, slo, rate_rps, current, options, requests)[0]


def _replan(shape, profile, slo, rate_rps, current, options, requests):
    options = PlannerOptions() if options is None else options
    trace = poisson(rate_rps, max(200, int(requests)), options.seed)
    return plan_for_slo(shape, pinned_profile(profile, current), slo, trace, options, start=current), trace


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
    trace=None,
) -> tuple[Rung, ...]:
    """The planned configuration (rung 0, at ``rate_rps``, planned on ``trace``) and a
    re-plan for each of ``factors`` x that rate, each searched from the rung below; each
    rung keeps the arrival envelope of the trace it was planned on. Stops at the first
    rate no configuration within the limits meets (the tuner then only adds replicas)."""
    rungs = [Rung.of(rate_rps, planned, trace)]
    last = planned.configs()
    for f in sorted(positive_number("ladder factor", x) for x in factors):
        if f <= 1:
            raise FlowValueError(f"ladder factors must be over 1 (multiples of the planning rate), got {f!r}")
        try:
            result, planned_on = _replan(shape, profile, slo, rate_rps * f, last, options, requests)
        except InfeasibleSLOError:
            break
        rungs.append(Rung.of(rate_rps * f, result, planned_on))
        last = result.configs()
    return tuple(rungs)


#: the windows the tuner compares with a rung's envelope: from a tenth of a second (a
#: burst shows within it) to 5 s (a rate change); the longer ones outlast the planning traces
DECISION_WINDOWS_MS = (100.0, 200.0, 500.0, 1_000.0, 2_000.0, 5_000.0)


class RePlanner:
    """Which rung of a ladder should run: the lowest whose planning envelope covers the
    arrivals now in every decision window (InferLine's test, A(dt) <= A_max(dt): a Poisson
    trace's own bursts are in its envelope, so noise does not trigger it; a burst shows in
    the short windows within a tenth of a second), the top one when none does; up at once,
    down only when every reading of the last ``downscale_after_s`` wanted a lower rung
    (InferLine's 15 s), and then to the highest of those. Time is passed in (seconds).

        r = RePlanner(rungs)                             # starts on rung 0
        r.decide({100.0: 25, 1000.0: 130}, now=0.0)      # -> the rung to switch to, or None
    """

    def __init__(
        self,
        rungs: Sequence[Rung],
        *,
        downscale_after_s: float = 15.0,
        current: int = 0,
        windows_ms: Sequence[float] = DECISION_WINDOWS_MS,
    ):
        if not rungs or not all(isinstance(r, Rung) for r in rungs):
            raise FlowTypeError(f"RePlanner needs a non-empty sequence of Rungs, got {rungs!r:.80}")
        rates = [r.rate_rps for r in rungs]
        if rates != sorted(rates):
            raise FlowValueError(f"ladder rungs must be in increasing rate order, got rates {rates}")
        self.rungs = tuple(rungs)
        self.downscale_after_s = positive_number("downscale_after_s", downscale_after_s, allow_zero=True)
        self.current = current
        self.windows_ms = tuple(windows_ms)
        self._wants: list[tuple[float, int]] = []

    def want(self, counts: Mapping[float, int]) -> int:
        """The lowest rung whose envelope covers ``counts`` (window ms -> arrivals now)."""
        for i, r in enumerate(self.rungs):
            if r.covers(counts, self.windows_ms):
                return i
        return len(self.rungs) - 1

    def decide(self, counts: Mapping[float, int], now: float) -> int | None:
        """The rung to switch to now, or None to keep the one running."""
        want = self.want(counts)
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
