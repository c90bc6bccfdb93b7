"""The autoscaler's decision logic: metrics in, replica counts out. Pure and deterministic.

Nothing here reads a clock, talks to a backend or logs: the control loop passes times and
metrics in and applies the decisions it gets back, so the same inputs always give the
same decisions (and ``simulate`` can replay a recorded trace).

    >>> from executors.hosts.autoscale import Autoscaler, AutoscalingConfig, StageMetrics
    >>> a = Autoscaler({"net": AutoscalingConfig()})
    >>> for t in (0.0, 1.0):
    ...     a.observe("net", StageMetrics(time=t, arrival_rate=40, service_time_ms=50, replicas=1))
    >>> [(d.stage, d.from_replicas, d.to_replicas) for d in a.decide(1.0)]
    [('net', 1, 2)]

How a stage's count moves (per stage, each with its own ``AutoscalingConfig``):

* Every sample gives two needs, in replicas (see ``AutoscalingConfig``): an *up* need at
  the targets, and a *down* need at the targets lowered by ``hysteresis``. Smoothing over
  ``smoothing_window_s`` only makes them more conservative (up: the lower of raw and
  smoothed; down: the higher). While the stage has any work (arrivals, queue or in-flight
  requests) both are at least 1.
* A sample's need holds from its time until the next sample's. **Scale up** when the up
  need exceeded the current count throughout the last ``upscale_delay_s``, to the smallest
  up need seen in that window (the count that persisted), at most ``max_step_up`` times the
  current count, at most ``max_replicas``. **Scale down** when the down need stayed below
  the current count throughout the last ``downscale_delay_s``, to the largest down need in
  that window, at least ``min_replicas``. So a spike observed for no longer than
  ``upscale_delay_s`` (from its first high sample to the next normal one) never scales.
* No scale-up within ``upscale_cooldown_s`` of the last change, no scale-down within
  ``downscale_cooldown_s`` of it; no scale-down while replicas of an earlier one are still
  draining (``StageMetrics.draining > 0``).
* A count outside ``[min_replicas, max_replicas]`` (e.g. the one first observed) is clamped
  at once.
* Optionally, ``capacity`` caps the total replicas per device class (``{"gpu": 2}``): GPU
  and CPU stages are sized separately, and when a class is full the stage that is most
  short of replicas (need / current) gets the free slots first, ties by stage name.
  Scale-downs of a round are counted before its scale-ups, by target: a slot freed by a
  drain may be granted while that replica still finishes its requests, so a backend with
  one model per device should start the new replica once the drained one is gone.
  ``min_replicas`` is not limited by capacity.

Feeding it (the caller's side): one ``Autoscaler`` per deployed flow, driven from one
thread (it is not thread-safe). Every ``interval`` (1 s recommended; 0.25-1 s is fine),
for each stage: measure over the interval the arrivals (count requests routed to the
stage, divided by the interval), the mean run time per request (a batch's run time
divided by its size) and, if known, the busy fraction; read the queue length, the running
requests, the replicas accepting requests and those draining; call ``observe``. Then call
``decide(now)`` once with the same monotonic clock and apply what it returns. Log
``str(decision)``; use ``decision.direction`` (not the free-text reason) as a metrics label;
show ``status()`` in ``flowserve status``.

Applying a decision (the caller's side):

* Scale up: start ``to - from`` replicas (or take back replicas that are still draining:
  they are warm).
* Scale down (``decision.drain > 0``): **drain first**. Pick the ``drain`` replicas with
  the fewest in-flight requests, stop routing new requests to them at once, wait until
  each one's in-flight count is 0, then remove it. Report them in
  ``StageMetrics.draining`` until they are gone (and no longer in ``replicas``); the
  autoscaler makes no further scale-down of that stage until ``draining`` is 0 again. So
  a replica is never removed while it holds work, and the stage never has fewer
  replicas than those holding work.

The autoscaler keeps its own target per stage (``Autoscaler.target``): decisions go from
the last target, not from the replica count reported, so a slow start (a pod pulling an
image) does not trigger the same decision twice. It starts from the first reported
``replicas``, and again if a stage's device class changes (history is dropped then: the
service times of the other class say nothing about this one).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from executors.hosts.autoscale.autoscaling_config import AutoscalingConfig, check_int, check_number
from flow.errors import FlowTypeError, FlowValueError

DEVICES = ("cpu", "gpu")
_EPS = 1e-9  # float slack: 2.8 / 0.7 must need 4 replicas, not 5


@dataclass(frozen=True, kw_only=True)
class StageMetrics:
    """One snapshot of a stage's load, as the control loop measured it (keywords only).

    time: when it was measured, in seconds on the caller's monotonic clock.
    arrival_rate: requests per second that arrived at the stage over the last interval
        (offered load: count arrivals, not completions, or overload hides itself).
    service_time_ms: mean run time per request (a batch's time divided by its size), ms;
        0 if nothing finished yet.
    replicas: replicas that accept new requests now (not those draining).
    queue_length: requests waiting for the stage, not yet running, summed over replicas.
    utilisation: fraction of the interval the replicas were busy, averaged over them,
        0..1; None if not measured (then only rate x service time is used).
    inflight: requests running on the stage's replicas now.
    draining: replicas told to drain (see the module doc) that are not removed yet.
    device: "cpu" or "gpu", the executor class the stage's replicas run on.

        StageMetrics(time=12.0, arrival_rate=40.0, service_time_ms=35.0, replicas=2,
                     queue_length=3, utilisation=0.68, inflight=2, device="gpu")
    """

    time: float
    arrival_rate: float
    service_time_ms: float
    replicas: int
    queue_length: float = 0
    utilisation: float | None = None
    inflight: int = 0
    draining: int = 0
    device: str = "cpu"

    def __post_init__(self):
        f = "StageMetrics"
        check_number(self.time, f"{f}.time", "a finite number (seconds)", lambda v: True)
        check_number(self.arrival_rate, f"{f}.arrival_rate", "a number >= 0 (requests/s)", lambda v: v >= 0)
        check_number(self.service_time_ms, f"{f}.service_time_ms", "a number >= 0 (ms)", lambda v: v >= 0)
        check_int(self.replicas, f"{f}.replicas", 0)
        check_number(self.queue_length, f"{f}.queue_length", "a number >= 0", lambda v: v >= 0)
        if self.utilisation is not None:
            check_number(self.utilisation, f"{f}.utilisation", "a number in [0, 1] or None", lambda v: 0 <= v <= 1)
        check_int(self.inflight, f"{f}.inflight", 0)
        check_int(self.draining, f"{f}.draining", 0)
        if self.device not in DEVICES:
            err = FlowValueError if isinstance(self.device, str) else FlowTypeError
            raise err(f"{f}.device must be one of {DEVICES}, got {self.device!r}")

    @property
    def load(self) -> float:
        """Offered load in busy replicas (Little's law): arrival rate x service time."""
        return self.arrival_rate * self.service_time_ms / 1000.0

    @property
    def has_work(self) -> bool:
        return self.arrival_rate > 0 or self.queue_length > 0 or self.inflight > 0


@dataclass(frozen=True)
class ScalingDecision:
    """Set ``stage`` (on ``device``-class executors) from ``from_replicas`` to ``to_replicas``.

    ``reason`` says why, for logs, ``flowserve status`` and metrics labels; ``time`` is the
    ``now`` of the ``decide`` call. When ``drain`` > 0 the caller must drain that many
    replicas before removing them (see the module doc).
    """

    time: float
    stage: str
    device: str
    from_replicas: int
    to_replicas: int
    reason: str

    @property
    def direction(self) -> str:
        """``"up"`` or ``"down"``."""
        return "up" if self.to_replicas > self.from_replicas else "down"

    @property
    def drain(self) -> int:
        """Replicas to drain (stop routing to, wait for in-flight 0, remove); 0 for scale-ups."""
        return max(0, self.from_replicas - self.to_replicas)

    def __str__(self) -> str:
        return (
            f"stage {self.stage!r} ({self.device}): {self.from_replicas} -> {self.to_replicas} replicas, {self.reason}"
        )


@dataclass(frozen=True)
class StageStatus:
    """What the autoscaler thinks of one stage now, for ``flowserve status``.

    replicas: its target; actual: the replicas last reported; need: the latest up need
    (before clamping); reason: the last decision's or why it holds.
    """

    stage: str
    device: str | None
    replicas: int | None
    actual: int | None
    draining: int
    need: int | None
    reason: str
    last_change: float | None


class _Need(NamedTuple):
    time: float
    up: int
    down: int
    metrics: StageMetrics


class _Stage:
    def __init__(self, name: str, config: AutoscalingConfig):
        self.name = name
        self.config = config
        self.reset()

    def reset(self) -> None:
        self.device: str | None = None
        self.target: int | None = None
        self.last_change: float | None = None
        self.samples: list[StageMetrics] = []  # within the smoothing window
        self.needs: list[_Need] = []
        self.times: list[float] = []  # needs' times, for bisect
        self.reason = "no metrics yet"


class Autoscaler:
    """Replica counts per stage from a stream of ``StageMetrics`` (see the module doc).

    configs: stage name -> its ``AutoscalingConfig`` (one ``Autoscaler`` per deployed
        flow: stage names are unique within a plan).
    capacity: optional device class -> most replicas of all stages of that class together.
    stale_after_s: hold a stage whose newest sample is older than this (the metrics
        feed broke; do not act on old data). None: never.

        a = Autoscaler({"preprocess": AutoscalingConfig(max_replicas=16),
                        "SmallNet": AutoscalingConfig(max_replicas=2)}, capacity={"gpu": 2})
        every second:  a.observe(stage, StageMetrics(...)) for each stage
                       for d in a.decide(now): apply(d)
    """

    def __init__(
        self,
        configs: Mapping[str, AutoscalingConfig],
        *,
        capacity: Mapping[str, int] | None = None,
        stale_after_s: float | None = 10.0,
    ):
        if not isinstance(configs, Mapping):
            raise FlowTypeError(f"Autoscaler configs must be a dict of stage -> AutoscalingConfig, got {configs!r}")
        for stage, cfg in configs.items():
            if not isinstance(stage, str) or not stage:
                raise FlowTypeError(f"Autoscaler configs: a stage name must be a non-empty str, got {stage!r}")
            if not isinstance(cfg, AutoscalingConfig):
                raise FlowTypeError(f"Autoscaler configs[{stage!r}] must be an AutoscalingConfig, got {cfg!r}")
        if capacity is not None:
            if not isinstance(capacity, Mapping):
                raise FlowTypeError(
                    f"Autoscaler capacity must be a dict of device class -> int or None, got {capacity!r}"
                )
            for device, n in capacity.items():
                if device not in DEVICES:
                    raise FlowValueError(f"Autoscaler capacity: device class must be one of {DEVICES}, got {device!r}")
                check_int(n, f"Autoscaler capacity[{device!r}]", 1)
        if stale_after_s is not None:
            check_number(stale_after_s, "Autoscaler stale_after_s", "a number > 0 or None", lambda v: v > 0)
        self._stages = {name: _Stage(name, cfg) for name, cfg in configs.items()}
        self._capacity = dict(capacity or {})
        self._stale_after = stale_after_s
        self._now: float | None = None

    @property
    def configs(self) -> dict[str, AutoscalingConfig]:
        return {name: st.config for name, st in self._stages.items()}

    def target(self, stage: str) -> int | None:
        """The replicas the autoscaler wants for ``stage`` (None before its first sample)."""
        return self._stage(stage).target

    # -- input ---------------------------------------------------------------------------------

    def observe(self, stage: str, metrics: StageMetrics) -> None:
        """Record one sample of ``stage``; its times must increase (per stage)."""
        st = self._stage(stage)
        if not isinstance(metrics, StageMetrics):
            raise FlowTypeError(f"Autoscaler.observe({stage!r}) needs a StageMetrics, got {metrics!r}")
        if st.times and metrics.time <= st.times[-1]:
            raise FlowValueError(
                f"StageMetrics.time of stage {stage!r} must increase: got {metrics.time!r} after {st.times[-1]!r}"
            )
        if st.device is not None and metrics.device != st.device:
            st.reset()  # moved to the other class: its history says nothing about this one
        if st.device is None:
            st.device, st.target = metrics.device, metrics.replicas
        cfg = st.config
        t = metrics.time
        st.samples = [s for s in st.samples if s.time > t - cfg.smoothing_window_s + _EPS] + [metrics]
        up, down = _needs(cfg, metrics, st.samples)
        st.needs.append(_Need(t, up, down, metrics))
        st.times.append(t)
        if len(st.times) > 1000:  # decide() not called for a long time: keep memory bounded
            self._prune(st, t)

    # -- decisions -----------------------------------------------------------------------------

    def decide(self, now: float) -> list[ScalingDecision]:
        """The changes to make now, one per stage at most, sorted by stage name.

        Samples later than ``now`` are not used yet. ``now`` must not go backwards.
        """
        check_number(now, "Autoscaler.decide now", "a finite number (seconds)", lambda v: True)
        if self._now is not None and now < self._now:
            raise FlowValueError(f"Autoscaler.decide now must not go backwards: got {now!r} after {self._now!r}")
        self._now = now
        decisions: list[ScalingDecision] = []
        ups: list[tuple[_Stage, int, int, str]] = []  # stage, wanted, need, reason
        for name in sorted(self._stages):
            st = self._stages[name]
            self._prune(st, now)
            outcome = self._decide_stage(st, now)
            if outcome is None:
                continue
            to, need, reason = outcome
            if to > st.target and not self._clamped(st):
                ups.append((st, to, need, reason))
            else:
                decisions.append(self._apply(st, now, to, reason))
        decisions += self._grant_ups(ups, now)
        return sorted(decisions, key=lambda d: d.stage)

    def status(self) -> dict[str, StageStatus]:
        """Per stage: target, reported replicas, latest need and why it holds or changed."""
        out = {}
        for name, st in sorted(self._stages.items()):
            last = st.needs[-1] if st.needs else None
            out[name] = StageStatus(
                name,
                st.device,
                st.target,
                last.metrics.replicas if last else None,
                last.metrics.draining if last else 0,
                last.up if last else None,
                st.reason,
                st.last_change,
            )
        return out

    # -- internals -----------------------------------------------------------------------------

    def _stage(self, stage: str) -> _Stage:
        st = self._stages.get(stage)
        if st is None:
            raise FlowValueError(f"no AutoscalingConfig for stage {stage!r}; configured stages: {sorted(self._stages)}")
        return st

    def _clamped(self, st: _Stage) -> bool:
        return st.target < st.config.min_replicas or st.target > st.config.max_replicas

    @staticmethod
    def _prune(st: _Stage, now: float) -> None:
        """Drop needs no window can reach: keep the one in effect at now - longest delay."""
        horizon = max(st.config.upscale_delay_s, st.config.downscale_delay_s)
        i = bisect.bisect_right(st.times, now - horizon + _EPS) - 1
        if i > 0:
            del st.needs[:i], st.times[:i]

    @staticmethod
    def _window(st: _Stage, now: float, delay: float) -> list[_Need] | None:
        """The samples in effect during [now - delay, now], or None if history is shorter."""
        start = bisect.bisect_right(st.times, now - delay + _EPS) - 1
        if start < 0:
            return None
        end = bisect.bisect_right(st.times, now + _EPS)
        return st.needs[start:end]

    def _decide_stage(self, st: _Stage, now: float) -> tuple[int, int, str] | None:
        """(to, need, reason) if the stage should change now; else None and ``st.reason`` says why."""
        cfg = st.config
        end = bisect.bisect_right(st.times, now + _EPS)
        if end == 0:
            if st.target is None:
                st.reason = "no metrics yet"
            return None
        last = st.needs[end - 1]
        cur, lo, hi = st.target, cfg.min_replicas, cfg.max_replicas
        if self._stale_after is not None and now - last.time > self._stale_after + _EPS:
            st.reason = f"holding: metrics stale (newest sample {now - last.time:g} s old)"
            return None
        if cur < lo:
            return lo, last.up, f"below min_replicas {lo}"
        if cur > hi:
            return hi, last.up, f"above max_replicas {hi}; {_drain_note(cur - hi)}"
        since_change = math.inf if st.last_change is None else now - st.last_change
        up_win = self._window(st, now, cfg.upscale_delay_s)
        if up_win is not None and all(n.up > cur for n in up_win):
            need = min(n.up for n in up_win)
            if cur >= hi:
                st.reason = f"holding at max_replicas {hi} (need {need})"
                return None
            if since_change < cfg.upscale_cooldown_s - _EPS:
                st.reason = (
                    f"holding: need {need}, scale-up cooldown ({since_change:g} s of "
                    f"{cfg.upscale_cooldown_s:g} s since the last change)"
                )
                return None
            step = max(math.ceil(cur * cfg.max_step_up - _EPS), cur + 1)
            to = min(need, hi, step)
            notes = "".join(
                [
                    f"; limited to x{cfg.max_step_up:g} per step" if to == step < min(need, hi) else "",
                    f"; max_replicas {hi}" if to == hi < need else "",
                ]
            )
            return (
                to,
                need,
                (f"scale up: need {need} for {cfg.upscale_delay_s:g} s ({_describe(cfg, last.metrics)}){notes}"),
            )
        down_win = self._window(st, now, cfg.downscale_delay_s)
        if down_win is not None and all(n.down < cur for n in down_win):
            need = max(n.down for n in down_win)
            to = max(need, lo)
            if to >= cur:
                st.reason = f"holding at min_replicas {lo} (need {need})"
                return None
            if last.metrics.draining > 0:
                st.reason = (
                    f"holding: need {need}, waiting for {last.metrics.draining} draining "
                    "replica(s) to finish their in-flight requests"
                )
                return None
            if since_change < cfg.downscale_cooldown_s - _EPS:
                st.reason = (
                    f"holding: need {need}, scale-down cooldown ({since_change:g} s of "
                    f"{cfg.downscale_cooldown_s:g} s since the last change)"
                )
                return None
            note = f"; min_replicas {lo}" if to == lo > need else ""
            return (
                to,
                need,
                (
                    f"scale down: need at most {need} for {cfg.downscale_delay_s:g} s "
                    f"({_describe(cfg, last.metrics)}){note}; {_drain_note(cur - to)}"
                ),
            )
        if last.up > cur:
            st.reason = f"holding: need {last.up} > {cur}, waiting for it to last {cfg.upscale_delay_s:g} s"
        elif last.down < cur and cur > lo:
            st.reason = f"holding: need {last.down} < {cur}, waiting for it to last {cfg.downscale_delay_s:g} s"
        else:
            st.reason = f"steady at {cur} (need {last.up}; {_describe(cfg, last.metrics)})"
        return None

    def _grant_ups(self, ups: list, now: float) -> list[ScalingDecision]:
        """Apply scale-ups, within each device class's capacity, most short of replicas first."""
        used: dict[str, int] = {}
        for st in self._stages.values():
            if st.target is not None:
                used[st.device] = used.get(st.device, 0) + st.target
        ups.sort(key=lambda u: (-(u[2] / u[0].target if u[0].target else math.inf), u[0].name))
        out = []
        for st, to, _need, reason in ups:
            cap = self._capacity.get(st.device)
            if cap is not None:
                free = cap - used[st.device]
                if free <= 0:
                    st.reason = (
                        f"holding: {reason.removeprefix('scale up: ')}; waiting for {st.device} capacity "
                        f"({used[st.device]} of {cap} replicas in use)"
                    )
                    continue
                if to > st.target + free:
                    to = st.target + free
                    reason += f"; {st.device} capacity {cap}"
                used[st.device] += to - st.target
            out.append(self._apply(st, now, to, reason))
        return out

    @staticmethod
    def _apply(st: _Stage, now: float, to: int, reason: str) -> ScalingDecision:
        d = ScalingDecision(now, st.name, st.device, st.target, to, reason)
        st.target, st.last_change, st.reason = to, now, str(d)
        return d


def _needs(cfg: AutoscalingConfig, m: StageMetrics, window: list[StageMetrics]) -> tuple[int, int]:
    """(up need, down need) of one sample, given the samples in its smoothing window."""
    n = len(window)
    load = sum(s.load for s in window) / n
    busy = [s.utilisation * s.replicas for s in window if s.utilisation is not None]
    queue = sum(s.queue_length for s in window) / n
    raw = (m.load, None if m.utilisation is None else m.utilisation * m.replicas, m.queue_length)
    smooth = (load, sum(busy) / len(busy) if busy else None, queue)
    up = min(_replicas(cfg, *raw, 1.0), _replicas(cfg, *smooth, 1.0))
    down_scale = 1.0 - cfg.hysteresis
    down = max(_replicas(cfg, *raw, down_scale), _replicas(cfg, *smooth, down_scale))
    if m.has_work:
        up, down = max(up, 1), max(down, 1)
    return up, down


def _replicas(cfg: AutoscalingConfig, load: float, busy: float | None, queue: float, scale: float) -> int:
    """Replicas needed so that load, busy replicas and queue sit at ``scale`` x the targets."""
    need = 0.0
    if cfg.target_utilisation is not None:
        rho = cfg.target_utilisation * scale
        need = max(need, load / rho, (busy or 0.0) / rho)
    if cfg.target_queue_per_replica is not None:
        need = max(need, queue / (cfg.target_queue_per_replica * scale))
    return max(0, math.ceil(need - _EPS))


def _describe(cfg: AutoscalingConfig, m: StageMetrics) -> str:
    parts = []
    if cfg.target_utilisation is not None:
        parts.append(
            f"{m.arrival_rate:g} req/s x {m.service_time_ms:g} ms = {m.load:.2f} busy replicas, "
            f"target utilisation {cfg.target_utilisation:g}"
        )
        if m.utilisation is not None:
            parts.append(f"measured utilisation {m.utilisation:.2f} of {m.replicas}")
    if cfg.target_queue_per_replica is not None:
        parts.append(f"queue {m.queue_length:g}, target {cfg.target_queue_per_replica:g}/replica")
    if m.inflight:
        parts.append(f"{m.inflight} in flight")
    return "; ".join(parts)


def _drain_note(k: int) -> str:
    return f"drain {k} replica(s) first: stop routing to them, remove each once its in-flight count is 0"


# -- replaying a recorded trace ------------------------------------------------------------


@dataclass(frozen=True)
class SimulationResult:
    """What ``simulate`` saw: every decision, and each stage's target after every step.

    timeline: stage -> ((t, replicas), ...), one entry per step from the stage's first
    sample on; ``series(stage)`` gives the two columns for a plot.
    """

    decisions: tuple[ScalingDecision, ...]
    timeline: Mapping[str, tuple[tuple[float, int], ...]]

    def series(self, stage: str) -> tuple[list[float], list[int]]:
        """(times, replicas) of one stage, ready for ``plt.step(..., where="post")``."""
        points = self.timeline.get(stage, ())
        return [t for t, _ in points], [n for _, n in points]

    def replicas_at(self, stage: str, t: float) -> int | None:
        """The stage's target after the last step at or before ``t`` (None before its first sample)."""
        times, counts = self.series(stage)
        i = bisect.bisect_right(times, t + _EPS) - 1
        return counts[i] if i >= 0 else None

    def changes(self, stage: str | None = None) -> list[ScalingDecision]:
        """The decisions, of one stage or all, in time order."""
        return [d for d in self.decisions if stage is None or d.stage == stage]


def simulate(autoscaler: Autoscaler, trace) -> SimulationResult:
    """Replay ``trace`` through ``autoscaler``: the replica timeline a live loop would produce.

    trace: (t, stage, StageMetrics) tuples with non-decreasing ``t``, the time the control
    loop had the sample. At each distinct ``t`` all its samples are observed, then
    ``decide(t)`` runs. Open loop: the recorded metrics are fed as they are, decisions do
    not change them.

        >>> a = Autoscaler({"s": AutoscalingConfig()})
        >>> r = simulate(a, [(float(t), "s", StageMetrics(time=float(t), arrival_rate=0,
        ...                   service_time_ms=10, replicas=3)) for t in range(20)])
        >>> r.series("s")[1][14:17]
        [3, 1, 1]
    """
    if not isinstance(autoscaler, Autoscaler):
        raise FlowTypeError(f"simulate needs an Autoscaler, got {autoscaler!r}")
    steps: list[tuple[float, list[tuple[str, StageMetrics]]]] = []
    for i, item in enumerate(trace):
        if not (isinstance(item, tuple) and len(item) == 3):
            raise FlowTypeError(f"simulate trace[{i}] must be a (t, stage, StageMetrics) tuple, got {item!r}")
        t, stage, metrics = item
        check_number(t, f"simulate trace[{i}] t", "a finite number (seconds)", lambda v: True)
        if steps and t < steps[-1][0]:
            raise FlowValueError(
                f"simulate trace times must not decrease: trace[{i}] has t={t!r} after {steps[-1][0]!r}"
            )
        if not steps or t != steps[-1][0]:
            steps.append((t, []))
        steps[-1][1].append((stage, metrics))
    decisions: list[ScalingDecision] = []
    timeline: dict[str, list[tuple[float, int]]] = {}
    for t, samples in steps:
        for stage, metrics in samples:
            autoscaler.observe(stage, metrics)
        decisions += autoscaler.decide(t)
        for stage in autoscaler.configs:
            n = autoscaler.target(stage)
            if n is not None:
                timeline.setdefault(stage, []).append((t, n))
    return SimulationResult(tuple(decisions), {s: tuple(p) for s, p in timeline.items()})
