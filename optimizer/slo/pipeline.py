"""What the simulator runs: a small description of a physical plan's stages and their
configuration (replicas, batching, routing), built by hand or from a ``Plan``.

    stage = SimStage("model", inputs=(INPUT,), service=fixed(5.0), replicas=2, max_batch=8)
    pipe = SimPipeline((stage,), sink="model", hop_ms=0.3)

``service(batch, rng)`` returns one call's latency in ms for a batch of that many
requests; ``profile_service`` draws it from a ``Profile``'s measured samples.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from flow.errors import FlowTypeError, FlowValueError
from optimizer.plan import INPUT, Plan
from optimizer.slo._check import name, positive_int, positive_number
from optimizer.slo.aimd import AIMDConfig, aimd_config
from optimizer.slo.profile import Profile

ROUTINGS = ("least_loaded", "round_robin", "shared", "gateway")
WAITS = ("all", "first")

Service = Callable[[int, random.Random], float]


def fixed(ms: float) -> Service:
    """A constant service time per call, whatever the batch size (an M/D/c server)."""
    ms = positive_number("service time", ms, allow_zero=True)
    return lambda batch, rng: ms


def linear(a_ms: float, c_ms: float) -> Service:
    """A deterministic ``a + c*b`` service time: a fixed cost per call plus one per row."""
    a_ms = positive_number("a_ms", a_ms, allow_zero=True)
    c_ms = positive_number("c_ms", c_ms, allow_zero=True)
    return lambda batch, rng: a_ms + c_ms * batch


def exponential(mean_ms: float) -> Service:
    """Exponentially distributed service times (an M/M/c server)."""
    rate = 1.0 / positive_number("mean service time", mean_ms)
    return lambda batch, rng: rng.expovariate(rate)


def profile_service(profile: Profile, stage: str, cls: str) -> Service:
    """Draws one call's latency uniformly from the profile's samples for that batch size."""
    profile.classes(stage)  # fail now, naming the stage, if it was never profiled
    cache: dict[int, tuple[float, ...]] = {}

    def draw(batch: int, rng: random.Random) -> float:
        s = cache.get(batch)
        if s is None:
            s = cache[batch] = profile.samples(stage, cls, batch)
        return s[int(rng.random() * len(s))]

    return draw


@dataclass(frozen=True)
class SimStage:
    """One stage as the simulator sees it.

    - ``inputs``: upstream stage names, or ``INPUT`` for the request itself;
    - ``wait``: ``"all"`` (a join: run once every input arrived) or ``"first"`` (anyof:
      the first input to arrive is used, later ones are dropped);
    - ``max_batch`` / ``max_wait_ms``: a free replica takes up to ``max_batch`` queued
      requests, waiting up to ``max_wait_ms`` after the oldest one arrived for the batch
      to fill (0: take what is queued);
    - ``competitive``: k > 1 sends each request to k distinct replicas; the first copy to
      finish is passed on and the others still run to the end (they are not cancelled,
      as in the runtime: a queued copy costs what a proactive redundancy costs);
    - ``threads``: calls one replica runs at once. 1 for a batching stage (an executor runs
      each batching stage on one batcher thread); a stage that does not batch runs on the
      executor's pool of worker threads, so one replica serves up to that many at once;
    - ``aimd``: an ``AIMDConfig``: each replica batches as the runtime does under an SLO
      (Clipper's AIMD cap and the delay window from the arrival rate, optimizer/slo/aimd.py)
      instead of ``max_batch`` / ``max_wait_ms``.
    """

    name: str
    inputs: tuple[str, ...]
    service: Service
    replicas: int = 1
    max_batch: int = 1
    max_wait_ms: float = 0.0
    competitive: int = 1
    wait: str = "all"
    threads: int = 1
    aimd: AIMDConfig | None = None

    def __post_init__(self):
        name("SimStage.name", self.name)
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if not self.inputs:
            raise FlowValueError(f"stage {self.name!r}: needs at least one input (INPUT for the request)")
        if not callable(self.service):
            raise FlowTypeError(
                f"stage {self.name!r}: service must be a callable (batch, rng) -> ms, got {self.service!r:.80}"
            )
        positive_int(f"stage {self.name!r}: replicas", self.replicas)
        positive_int(f"stage {self.name!r}: max_batch", self.max_batch)
        positive_int(f"stage {self.name!r}: competitive", self.competitive)
        positive_int(f"stage {self.name!r}: threads", self.threads)
        positive_number(f"stage {self.name!r}: max_wait_ms", self.max_wait_ms, allow_zero=True)
        if self.competitive > self.replicas:
            raise FlowValueError(
                f"stage {self.name!r}: competitive={self.competitive} needs as many replicas, "
                f"got replicas={self.replicas}"
            )
        if self.wait not in WAITS:
            raise FlowValueError(f"stage {self.name!r}: wait={self.wait!r}; expected one of {WAITS}")
        if self.aimd is not None:
            if not isinstance(self.aimd, AIMDConfig):
                raise FlowTypeError(f"stage {self.name!r}: aimd must be an AIMDConfig, got {self.aimd!r:.80}")
            if self.threads != 1:
                raise FlowValueError(
                    f"stage {self.name!r}: an AIMD stage runs one batch at a time, got threads={self.threads}"
                )


@dataclass(frozen=True)
class SimPipeline:
    """Stages in topological order, the sink whose output answers the request, the cost of
    one hop (gateway -> stage, stage -> stage, sink -> gateway) and the routing policy:
    ``least_loaded`` (when a request reaches a stage, the replica with the fewest queued +
    running requests), ``round_robin``, ``shared`` (one queue per stage that free
    replicas pull from: the M/M/c model), or ``gateway`` (what the runtime's dispatcher
    does: when a request enters, every stage's replica is chosen up front, the one whose
    executor has the fewest requests in flight -- a request counts on each executor it
    uses until its answer is back; ``placement`` names each replica's executor, replicas
    of different stages may share one; without it each replica is an executor of its own).

    ``hop_samples``: measured hop times (ms), drawn per hop (else ``hop_ms``); with
    ``hop_per_request`` one draw per request is used for all of its hops (a slow moment
    slows the whole request, as the calibration that measured them saw it)."""

    stages: tuple[SimStage, ...]
    sink: str
    hop_ms: float = 0.0
    routing: str = "least_loaded"
    hop_samples: tuple[float, ...] = ()
    hop_per_request: bool = False
    placement: Mapping[str, tuple[str, ...]] | None = None  # stage -> executor id of each replica

    def __post_init__(self):
        object.__setattr__(self, "stages", tuple(self.stages))
        if not self.stages:
            raise FlowValueError("a SimPipeline needs at least one stage")
        seen = {INPUT}
        for s in self.stages:
            if not isinstance(s, SimStage):
                raise FlowTypeError(f"SimPipeline stages must be SimStages, got {s!r:.80}")
            if s.name in seen:
                raise FlowValueError(f"two stages named {s.name!r}")
            for i in s.inputs:
                if i not in seen:
                    raise FlowValueError(f"stage {s.name!r} reads {i!r}, which is not an earlier stage")
            seen.add(s.name)
        if self.sink not in seen - {INPUT}:
            raise FlowValueError(f"sink {self.sink!r} is not a stage")
        positive_number("hop_ms", self.hop_ms, allow_zero=True)
        object.__setattr__(
            self, "hop_samples", tuple(positive_number("hop sample (ms)", h, allow_zero=True) for h in self.hop_samples)
        )
        if self.routing not in ROUTINGS:
            raise FlowValueError(f"routing={self.routing!r}; expected one of {ROUTINGS}")
        if self.placement is not None:
            if self.routing != "gateway":
                raise FlowValueError(f"a placement is only used by routing='gateway', got routing={self.routing!r}")
            placement = {}
            for s in self.stages:
                ids = self.placement.get(s.name)
                if ids is None or len(tuple(ids)) != s.replicas:
                    raise FlowValueError(
                        f"stage {s.name!r}: placement must name one executor per replica ({s.replicas}), got {ids!r}"
                    )
                if len(set(ids)) != len(tuple(ids)):
                    raise FlowValueError(f"stage {s.name!r}: two replicas on one executor in placement {ids!r}")
                placement[s.name] = tuple(str(i) for i in ids)
            object.__setattr__(self, "placement", placement)


@dataclass(frozen=True)
class StageConfig:
    """What the planner chooses for one stage (and what a deployment applies)."""

    batch_size: int = 1
    replicas: int = 1
    executor_class: str = "cpu"

    def __post_init__(self):
        positive_int("StageConfig.batch_size", self.batch_size)
        positive_int("StageConfig.replicas", self.replicas)
        name("StageConfig.executor_class", self.executor_class)


@dataclass(frozen=True)
class StageShape:
    """What the planner may not change about a stage: its inputs, whether it may batch
    (every operator row-wise), how many replicas race (``competitive``) and its wait mode."""

    name: str
    inputs: tuple[str, ...] = (INPUT,)
    batchable: bool = True
    competitive: int = 1
    wait: str = "all"


@dataclass(frozen=True)
class Shape:
    """A plan's stages as the planner sees them, in topological order, and its sink.

    Shape.chain("pre", "model", "post")      # a hand-made three-stage chain
    Shape.from_plan(optimize(flow))          # a real plan's stages
    """

    stages: tuple[StageShape, ...]
    sink: str

    def __post_init__(self):
        object.__setattr__(self, "stages", tuple(self.stages))
        # building a pipeline validates the graph; the service is a placeholder
        SimPipeline(
            tuple(
                SimStage(s.name, s.inputs, fixed(0.0), replicas=s.competitive, competitive=s.competitive, wait=s.wait)
                for s in self.stages
            ),
            self.sink,
        )

    @classmethod
    def chain(cls, *names: str, batchable: bool = True) -> Shape:
        stages, prev = [], INPUT
        for n in names:
            stages.append(StageShape(n, (prev,), batchable))
            prev = n
        return cls(tuple(stages), prev)

    @classmethod
    def from_plan(cls, plan: Plan) -> Shape:
        if not isinstance(plan, Plan):
            raise FlowTypeError(f"expected an optimizer Plan, got {type(plan).__name__}")
        return cls(
            tuple(
                StageShape(
                    s.name, s.inputs, s.batch is not None, s.competitive, "first" if s.wait == "first_valid" else "all"
                )
                for s in plan.stages.values()
            ),
            plan.sink,
        )

    def pipeline(
        self,
        profile: Profile,
        configs: Mapping[str, StageConfig],
        hop_ms: float = 0.0,
        routing: str = "least_loaded",
        threads: int = 1,
        aimd: Mapping[str, AIMDConfig] | None = None,
    ) -> SimPipeline:
        """The stages with each one's configuration and service times drawn from ``profile``;
        ``threads``: the executors' worker threads, what a replica of a stage that does not
        batch runs at once (a batching stage runs one batch at a time); ``aimd``: per stage,
        the AIMD batching it runs with (stages not named batch at their fixed size).

        Every request is assumed to pass every stage (a filter that drops rows makes the
        real pipeline cheaper, never dearer, than simulated)."""
        missing = [s.name for s in self.stages if s.name not in configs]
        if missing:
            raise FlowValueError(f"no StageConfig for stage(s) {missing}")
        out = []
        for s in self.stages:
            cfg = configs[s.name]
            if cfg.batch_size > 1 and not s.batchable:
                raise FlowValueError(
                    f"stage {s.name!r} cannot batch (an operator mixes rows of different queries), "
                    f"got batch_size={cfg.batch_size}"
                )
            out.append(
                SimStage(
                    s.name,
                    s.inputs,
                    profile_service(profile, s.name, cfg.executor_class),
                    replicas=cfg.replicas,
                    max_batch=cfg.batch_size,
                    competitive=s.competitive,
                    wait=s.wait,
                    threads=1 if s.batchable else threads,
                    aimd=(aimd or {}).get(s.name) if s.batchable else None,
                )
            )
        return SimPipeline(tuple(out), self.sink, hop_ms, routing)


def pipeline_from_plan(
    plan: Plan,
    profile: Profile,
    configs: Mapping[str, StageConfig],
    hop_ms: float = 0.0,
    routing: str = "least_loaded",
    threads: int = 1,
    adapt: bool = True,
) -> SimPipeline:
    """``Shape.from_plan(plan).pipeline(...)``: the plan's stages, configured and profiled.
    A plan served under an SLO (``plan.slo``) that lets the runtime adapt it batches with
    AIMD as the runtime does (``aimd_config``); ``adapt=False`` simulates the fixed sizes."""
    serving = getattr(plan, "slo", None) if adapt else None
    aimd = {}
    for n, s in plan.stages.items():
        config = aimd_config(serving, n, configs[n].batch_size) if s.batch is not None and n in configs else None
        if config is not None:
            aimd[n] = config
    return Shape.from_plan(plan).pipeline(profile, configs, hop_ms, routing, threads, aimd)
