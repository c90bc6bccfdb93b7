"""InferLine's planner: batch size, replicas and executor class per stage, at the least
cost whose simulated tail latency on a planning trace meets the SLO.

    result = plan_for_slo(Shape.from_plan(plan), profile, SLO(p99_ms=50), trace,
                          prices={"cpu": 1.0, "gpu": 4.0})
    result.configs()["SmallNet"]          # StageConfig(batch_size=8, replicas=2, executor_class='gpu')
    print(result.explain())               # per stage, what it got and why

Two greedy phases (InferLine section 4.2, starting from the cheapest configuration):
1. from batch 1, the fewest replicas and the cheapest class everywhere, while the SLO is
   missed apply the move (a replica more, the next profiled batch size, another class)
   with the best latency gain per unit of added cost (free moves first);
2. then, while some move lowers the cost and keeps the SLO, apply the one that saves
   most (a replica fewer, a bigger batch with a replica fewer, another class re-sized).
Cost is replica-seconds weighted by each class's price; each stage's budget (for the
runtime's AIMD batcher) is its share of the SLO less the hops on the critical path, by profiled latency at the batch size it
ran in the simulation, on the critical path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from flow.errors import FlowTypeError, FlowValueError
from optimizer.plan import INPUT
from optimizer.slo._check import name, positive_int, positive_number
from optimizer.slo.errors import InfeasibleSLOError
from optimizer.slo.pipeline import ROUTINGS, Shape, StageConfig
from optimizer.slo.profile import Profile
from optimizer.slo.simulator import simulate
from optimizer.slo.spec import SLO
from optimizer.slo.traces import check_trace


@dataclass(frozen=True)
class PlannerOptions:
    """How the planner searches and prices.

    - ``prices``: cost per replica-second of each executor class (only priced classes are
      used); ``hop_ms``: one hop's cost; ``routing``: the simulator's routing policy;
    - ``max_replicas`` / ``max_batch``: per stage caps (default 32 / 64);
    - ``threads``: the executors' worker threads: how many requests one replica of a stage
      that does not batch runs at once (default 1, the cautious guess; a batching stage
      always runs one batch at a time);
    - ``seed``: the simulator's seed (plans are reproducible); ``max_steps``: a bound on
      moves per phase;
    - ``ladder``: multiples (> 1) of the planning rate to plan the tuner's re-plans for at
      deploy (``optimizer/slo/tuning.py``; e.g. ``tuning.LADDER_FACTORS``). Opt-in: each
      costs a planner run at deploy, and a switch serves the re-plan as the flow's next
      version, rebuilding every stage (a stall while models load). Empty (the default):
      the tuner adds and removes replicas at the planned batch sizes, and AIMD moves the
      batch sizes.

        PlannerOptions(prices={"cpu": 1.0, "gpu": 4.0}, hop_ms=0.3)
    """

    prices: Mapping[str, float] = field(default_factory=lambda: {"cpu": 1.0})
    hop_ms: float = 0.0
    routing: str = "least_loaded"
    max_replicas: int = 32
    max_batch: int = 64
    seed: int = 0
    max_steps: int = 500
    threads: int = 1
    ladder: tuple = ()
    fuse: bool = True
    headroom: float = 0.0

    def __post_init__(self):
        if not isinstance(self.prices, Mapping) or not self.prices:
            raise FlowTypeError(
                f"PlannerOptions.prices must be a non-empty {{class: price}} mapping, got {self.prices!r:.80}"
            )
        object.__setattr__(
            self,
            "prices",
            {name("executor class", c): positive_number(f"price of {c!r}", p) for c, p in self.prices.items()},
        )
        positive_number("PlannerOptions.hop_ms", self.hop_ms, allow_zero=True)
        if self.routing not in ROUTINGS:
            raise FlowValueError(f"PlannerOptions.routing={self.routing!r}; expected one of {ROUTINGS}")
        positive_int("PlannerOptions.max_replicas", self.max_replicas)
        positive_int("PlannerOptions.max_batch", self.max_batch)
        positive_int("PlannerOptions.max_steps", self.max_steps)
        positive_int("PlannerOptions.threads", self.threads)
        if isinstance(self.ladder, (str, bytes)) or not all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and f > 1 for f in self.ladder
        ):
            raise FlowValueError(
                f"PlannerOptions.ladder must be multiples of the planning rate above 1, got {self.ladder!r:.80}"
            )
        object.__setattr__(self, "ladder", tuple(float(f) for f in self.ladder))
        positive_number("PlannerOptions.headroom", self.headroom, allow_zero=True)
        if self.headroom >= 0.5:
            raise FlowValueError(f"PlannerOptions.headroom is a share of the SLO below 0.5, got {self.headroom!r}")
        if not isinstance(self.fuse, bool):
            raise FlowTypeError(f"PlannerOptions.fuse must be True or False, got {self.fuse!r:.80}")


@dataclass(frozen=True)
class StagePlan:
    """One stage's chosen configuration, why, its latency budget and its utilisation."""

    config: StageConfig
    reason: str
    budget_ms: float
    utilisation: float


@dataclass(frozen=True)
class SLOPlan:
    """The planner's answer: per stage a StagePlan; the simulated tail and median on the
    planning trace; the cost in price-weighted replica-seconds over the trace, and per second."""

    slo: SLO
    stages: Mapping[str, StagePlan]
    tail_ms: float
    p50_ms: float
    cost: float
    cost_per_s: float

    def configs(self) -> dict[str, StageConfig]:
        return {n: s.config for n, s in self.stages.items()}

    def explain(self) -> str:
        head = (
            f"SLO {self.slo.describe()}: simulated tail {self.tail_ms:.1f} ms, p50 {self.p50_ms:.1f} ms, "
            f"cost {self.cost_per_s:g}/s"
        )
        lines = [head]
        for n, s in self.stages.items():
            c = s.config
            lines.append(
                f"  {n}: {c.executor_class} x{c.replicas}, batch {c.batch_size}, budget "
                f"{s.budget_ms:.1f} ms, utilisation {s.utilisation:.2f} -- {s.reason}"
            )
        return "\n".join(lines)


class _Search:
    """The state both phases share: evaluations are cached by configuration."""

    def __init__(self, shape, profile, slo, trace, options):
        self.shape, self.profile, self.slo, self.trace, self.opt = shape, profile, slo, trace, options
        # what a configuration must meet in simulation: the SLO less the headroom kept free
        keep = 1.0 - options.headroom
        self.target = replace(slo, p99_ms=slo.p99_ms * keep, p50_ms=None if slo.p50_ms is None else slo.p50_ms * keep)
        self.cache: dict = {}
        self.classes = {}
        for s in shape.stages:
            priced = [c for c in profile.classes(s.name) if c in options.prices]
            if not priced:
                raise FlowValueError(
                    f"stage {s.name!r} was profiled on {sorted(profile.classes(s.name))} but only "
                    f"{sorted(options.prices)} have a price; price one of them"
                )
            self.classes[s.name] = sorted(priced, key=lambda c: (options.prices[c], c))

    def batches(self, stage, cls) -> list[int]:
        if not next(s for s in self.shape.stages if s.name == stage).batchable:
            return [1]
        return _geometric([b for b in self.profile.batch_sizes(stage, cls) if b <= self.opt.max_batch]) or [1]

    def cost_rate(self, configs) -> float:
        return sum(c.replicas * self.opt.prices[c.executor_class] for c in configs.values())

    def evaluate(self, configs):
        """(objective ms, tail ms, p50 ms, SimResult); the objective is the tail plus any
        excess of the median over its bound."""
        key = tuple(sorted((n, c.batch_size, c.replicas, c.executor_class) for n, c in configs.items()))
        if key not in self.cache:
            pipe = self.shape.pipeline(self.profile, configs, self.opt.hop_ms, self.opt.routing, self.opt.threads)
            r = simulate(pipe, self.trace, self.opt.seed)
            tail, p50 = r.quantile(self.slo.percentile), r.p50_ms
            excess = max(0.0, p50 - self.target.p50_ms) if self.target.p50_ms is not None else 0.0
            self.cache[key] = (tail + excess, tail, p50, r)
        return self.cache[key]

    def meets(self, configs) -> bool:
        _, tail, p50, _ = self.evaluate(configs)
        return self.target.met_by(tail, p50)


#: the batch sizes the search steps through grow by at least this factor
BATCH_STEP = 1.5


def _geometric(sizes: list[int]) -> list[int]:
    """The profiled batch sizes thinned to steps of at least ``BATCH_STEP`` (the largest
    kept): a profile measured at every size from 1 to 16 gives 1, 2, 3, 5, 8, 12, 16. Each
    size is a move the search simulates, and the runtime's AIMD batcher tunes the size
    between the steps anyway."""
    kept: list[int] = []
    for b in sorted(sizes):
        if not kept or b >= kept[-1] * BATCH_STEP or b == max(sizes):
            kept.append(b)
    return kept


def _with(configs, stage, **changes):
    out = dict(configs)
    c = out[stage]
    out[stage] = StageConfig(
        changes.get("batch_size", c.batch_size),
        changes.get("replicas", c.replicas),
        changes.get("executor_class", c.executor_class),
    )
    return out


def _critical_path(shape: Shape, latency: Mapping[str, float], hop_ms: float) -> tuple[float, list[str]]:
    """The longest input-to-sink path by ``latency`` (plus a hop per edge), and its stages."""
    best: dict[str, tuple[float, list[str]]] = {INPUT: (hop_ms, [])}
    for s in shape.stages:
        # an anyof stage waits for its fastest input; every other stage for its slowest
        pick = min if s.wait == "first" else max
        t, path = pick((best[i] for i in s.inputs), key=lambda tp: tp[0])
        best[s.name] = (t + latency[s.name] + hop_ms, path + [s.name])
    return best[shape.sink]


def _check_feasible(search: _Search) -> None:
    """InferLine's first test: even with every stage at batch 1 on its fastest class and no
    queueing, the critical path must fit in the SLO; else name the stage that cannot."""
    shape, slo, q = search.shape, search.slo, search.slo.percentile
    fastest = {
        s.name: min(search.profile.latency(s.name, c, 1, q) for c in search.classes[s.name]) for s in shape.stages
    }
    hop = search.opt.hop_ms
    alone = [(fastest[n] + 2 * hop, n) for n in fastest if fastest[n] + 2 * hop > slo.p99_ms]
    if alone:
        ms, stage = max(alone)
        raise InfeasibleSLOError(
            f"stage {stage!r} cannot meet the SLO ({slo.describe()}): its fastest run (batch 1 on "
            f"{search.classes[stage]}) alone takes {ms:.1f} ms at p{q:g} with hops",
            stage=stage,
        )
    total, path = _critical_path(shape, fastest, hop)
    if total > slo.p99_ms:
        stage = max(path, key=lambda n: fastest[n])
        raise InfeasibleSLOError(
            f"the path {' -> '.join(path)} takes {total:.1f} ms at p{q:g} even unloaded on the fastest classes, "
            f"over the SLO ({slo.describe()}); its slowest stage is {stage!r}",
            stage=stage,
        )


def _grow_moves(search, configs):
    """Phase 1 candidates: configurations one step from ``configs``."""
    for s in search.shape.stages:
        c = configs[s.name]
        if c.replicas < search.opt.max_replicas:
            yield _with(configs, s.name, replicas=c.replicas + 1)
        bigger = [b for b in search.batches(s.name, c.executor_class) if b > c.batch_size]
        if bigger:
            yield _with(configs, s.name, batch_size=bigger[0])
        for cls in search.classes[s.name]:
            if cls != c.executor_class:
                b = max([x for x in search.batches(s.name, cls) if x <= c.batch_size] or [1])
                yield _with(configs, s.name, executor_class=cls, batch_size=b)


def _shrink_moves(search, configs):
    """Phase 2 candidates: each lowers the cost."""
    for s in search.shape.stages:
        c = configs[s.name]
        if c.replicas > s.competitive:
            yield _with(configs, s.name, replicas=c.replicas - 1)
            for b in search.batches(s.name, c.executor_class):
                if b > c.batch_size:
                    yield _with(configs, s.name, batch_size=b, replicas=c.replicas - 1)
        now = search.cost_rate(configs)
        for cls in search.classes[s.name]:
            if cls == c.executor_class:
                continue
            # another class, with the fewest replicas (and the batch size) that keep the SLO
            for r in range(s.competitive, search.opt.max_replicas + 1):
                trial = _with(configs, s.name, executor_class=cls, replicas=r, batch_size=1)
                if search.cost_rate(trial) >= now:
                    break
                fits = [t for b in search.batches(s.name, cls) if search.meets(t := _with(trial, s.name, batch_size=b))]
                if fits:
                    yield fits[0]
                    break


def describe_change(configs_before, configs_after, stage) -> str:
    a, b = configs_before[stage], configs_after[stage]
    parts = []
    if a.executor_class != b.executor_class:
        parts.append(f"class {a.executor_class}->{b.executor_class}")
    if a.replicas != b.replicas:
        parts.append(f"replicas {a.replicas}->{b.replicas}")
    if a.batch_size != b.batch_size:
        parts.append(f"batch {a.batch_size}->{b.batch_size}")
    return ", ".join(parts)


def plan_for_slo(
    shape, profile: Profile, slo: SLO, trace, options: PlannerOptions | None = None, *, start=None
) -> SLOPlan:
    """The cheapest configuration the greedy search finds whose simulated tail on
    ``trace`` (arrival timestamps, ms) meets ``slo``; ``shape`` is a ``Shape`` or a
    ``Plan``. ``start``: stage -> StageConfig to search from instead of batch 1 and the
    fewest replicas on the cheapest class (a re-plan starts from what runs, so it
    needs few steps; optimizer/slo/tuning.py). Raises ``InfeasibleSLOError`` naming
    the stage that cannot meet it."""
    from optimizer.plan import Plan

    if isinstance(shape, Plan):
        shape = Shape.from_plan(shape)
    if not isinstance(shape, Shape):
        raise FlowTypeError(f"plan_for_slo needs a Shape or a Plan, got {type(shape).__name__}")
    if not isinstance(profile, Profile):
        raise FlowTypeError(f"plan_for_slo needs a Profile, got {type(profile).__name__}")
    if not isinstance(slo, SLO):
        raise FlowTypeError(f"plan_for_slo needs an SLO, got {type(slo).__name__}")
    options = PlannerOptions() if options is None else options
    if not isinstance(options, PlannerOptions):
        raise FlowTypeError(f"options must be PlannerOptions, got {type(options).__name__}")
    trace = check_trace(trace)
    search = _Search(shape, profile, slo, trace, options)
    _check_feasible(search)

    configs = {s.name: StageConfig(1, s.competitive, search.classes[s.name][0]) for s in shape.stages}
    if start is not None:
        configs = _check_start(search, start)
    start = configs

    for _ in range(options.max_steps):  # phase 1: meet the SLO
        if search.meets(configs):
            break
        objective, now_cost = search.evaluate(configs)[0], search.cost_rate(configs)
        best = None
        for trial in _grow_moves(search, configs):
            gain = objective - search.evaluate(trial)[0]
            if gain <= 0:
                continue
            added = search.cost_rate(trial) - now_cost
            # (float, float): phase 2 reuses the name for its own scores
            score: tuple[float, float] = (1, gain) if added <= 0 else (0, gain / added)  # free moves first
            if best is None or score > best[0]:
                best = (score, trial)
        configs = best[1] if best is not None else _relieve_bottleneck(search, configs)
    else:
        if not search.meets(configs):
            _no_gain(search, configs)
    met = configs

    for _ in range(options.max_steps):  # phase 2: cut the cost, keeping the SLO
        now_cost = search.cost_rate(configs)
        best = None
        for trial in _shrink_moves(search, configs):
            saved = now_cost - search.cost_rate(trial)
            if saved <= 0 or not search.meets(trial):
                continue
            score = (saved, -search.evaluate(trial)[0])
            if best is None or score > best[0]:
                best = (score, trial)
        if best is None:
            break
        configs = best[1]

    return _result(search, start, met, configs)


def _check_start(search, start) -> dict:
    if not isinstance(start, Mapping):
        raise FlowTypeError(f"start must map stage -> StageConfig, got {type(start).__name__}")
    out = {}
    for s in search.shape.stages:
        c = start.get(s.name)
        if not isinstance(c, StageConfig):
            raise FlowTypeError(f"start: stage {s.name!r} needs a StageConfig, got {c!r:.80}")
        if c.executor_class not in search.classes[s.name]:
            raise FlowValueError(
                f"start: stage {s.name!r} on {c.executor_class!r}, which has no price or profile "
                f"(priced and profiled: {search.classes[s.name]})"
            )
        out[s.name] = StageConfig(c.batch_size, max(c.replicas, s.competitive), c.executor_class)
    return out


def _relieve_bottleneck(search, configs):
    """When no single move lowers the tail (several stages overloaded at once: relieving
    one only moves the queue), add a replica to the busiest stage, InferLine's
    throughput-bottleneck step."""
    result = search.evaluate(configs)[3]
    stage = max(result.stages, key=lambda n: result.stages[n].utilisation)
    if configs[stage].replicas >= search.opt.max_replicas:
        _no_gain(search, configs)
    return _with(configs, stage, replicas=configs[stage].replicas + 1)


def _no_gain(search, configs):
    """No move helps (or the step bound ran out): name the busiest stage, the bottleneck."""
    _, tail, _, result = search.evaluate(configs)
    stage = max(result.stages, key=lambda n: result.stages[n].utilisation)
    c = configs[stage]
    raise InfeasibleSLOError(
        f"no configuration within the limits meets the SLO ({search.slo.describe()}): the simulated tail is "
        f"{tail:.1f} ms and stage {stage!r} ({c.executor_class} x{c.replicas}, batch {c.batch_size}, utilisation "
        f"{result.stages[stage].utilisation:.2f}) is the bottleneck; raise max_replicas "
        f"({search.opt.max_replicas}) or max_batch ({search.opt.max_batch}), or relax the SLO",
        stage=stage,
    )


def _result(search, start, met, configs) -> SLOPlan:
    """The plan, each stage's reason saying what each phase changed and the tails it saw."""
    start_tail, met_tail = search.evaluate(start)[1], search.evaluate(met)[1]
    _, tail, p50, result = search.evaluate(configs)
    q = search.slo.percentile
    # each stage at the batch size it ran in the simulation (queues rarely fill the cap)
    own = {
        n: search.profile.latency(n, c.executor_class, max(1, round(result.stages[n].mean_batch)), q)
        for n, c in configs.items()
    }
    path_ms, _ = _critical_path(search.shape, own, 0.0)
    # the hops along the critical path are spent before any stage runs: budgets split the rest
    hops_ms = _critical_path(search.shape, own, search.opt.hop_ms)[0] - path_ms
    share = max(search.slo.p99_ms - hops_ms, 0.0)
    stages = {}
    for s in search.shape.stages:
        steps = []
        grown, shrunk = describe_change(start, met, s.name), describe_change(met, configs, s.name)
        if grown:
            steps.append(f"{grown} to meet the SLO (pipeline tail {start_tail:.1f} -> {met_tail:.1f} ms)")
        if shrunk:
            steps.append(f"then {shrunk} to cut cost (tail {tail:.1f} ms still within the SLO)")
        reason = ", ".join(steps) or "the cheapest start (batch 1, fewest replicas, cheapest class) was enough"
        budget = share * own[s.name] / path_ms if path_ms > 0 else share
        stages[s.name] = StagePlan(configs[s.name], reason, budget, result.stages[s.name].utilisation)
    rate = search.cost_rate(configs)
    duration_s = float(search.trace[-1] - search.trace[0]) / 1000.0
    return SLOPlan(search.slo, stages, tail, p50, rate * duration_s, rate)
