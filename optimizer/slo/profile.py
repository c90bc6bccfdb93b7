"""``Profile``: measured latency per stage, executor class and batch size, with a fit.

    p = Profile({"SmallNet": {"cpu": {1: [4.1, 4.3], 8: [9.8, 10.2]}}})
    p.latency("SmallNet", "cpu", 8)            # 10.0: the median of the measured points
    p.latency("SmallNet", "cpu", 4)            # from the fit a + c*b (batch 4 not measured)
    Profile.from_json(p.to_json()) == p        # stored with the plan

Latencies are milliseconds per call of the stage on one batch. The measured samples are
kept (the simulator draws from them, so a stage's tail shows in the pipeline's tail); the
linear fit ``latency(b) = a + c*b`` only fills in batch sizes that were not measured.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from flow.errors import FlowTypeError, FlowValueError
from optimizer.slo._check import name, positive_int, positive_number

FORMAT = 1  # bumped when the JSON layout changes


@dataclass(frozen=True)
class LatencyFit:
    """``latency(b) = a_ms + c_ms * b``: a fixed cost per call plus a cost per row."""

    a_ms: float
    c_ms: float

    def __call__(self, batch: int) -> float:
        return self.a_ms + self.c_ms * batch

    @classmethod
    def of(cls, points: Mapping[int, float]) -> LatencyFit:
        """Least squares over (batch size, mean latency); one point gives a line through
        the origin (no batching benefit assumed: the cautious guess). Negative parts are
        clamped, since a call cannot get cheaper with more rows or cost less than nothing."""
        bs = np.array(sorted(points), dtype=float)
        ys = np.array([points[int(b)] for b in bs], dtype=float)
        if len(bs) == 1:
            return cls(0.0, float(ys[0] / bs[0]))
        c, a = np.polyfit(bs, ys, 1)
        if c < 0:
            return cls(float(ys.mean()), 0.0)
        if a < 0:
            return cls(0.0, float((bs @ ys) / (bs @ bs)))
        return cls(float(a), float(c))


def _freeze(stages) -> Mapping:
    if not isinstance(stages, Mapping):
        raise FlowTypeError(f"Profile needs {{stage: {{class: {{batch: [ms, ...]}}}}}}, got {stages!r:.120}")
    out = {}
    for stage, classes in stages.items():
        name("a profiled stage name", stage)
        if not isinstance(classes, Mapping) or not classes:
            raise FlowValueError(
                f"profile of stage {stage!r}: needs {{class: {{batch: [ms, ...]}}}}, got {classes!r:.120}"
            )
        per_class = {}
        for cls, batches in classes.items():
            name(f"profile of stage {stage!r}: executor class", cls)
            if not isinstance(batches, Mapping) or not batches:
                raise FlowValueError(
                    f"profile of stage {stage!r} on {cls!r}: needs {{batch: [ms, ...]}}, got {batches!r:.120}"
                )
            per_batch = {}
            for b, samples in batches.items():
                where = f"profile of stage {stage!r} on {cls!r}"
                b = positive_int(f"{where}: batch size", b)
                if isinstance(samples, (int, float)) or not samples:
                    raise FlowValueError(
                        f"{where} batch {b}: needs a non-empty list of latencies in ms, got {samples!r:.80}"
                    )
                per_batch[b] = tuple(
                    positive_number(f"{where} batch {b}: latency", s, allow_zero=True) for s in samples
                )
            per_class[cls] = MappingProxyType(dict(sorted(per_batch.items())))
        out[stage] = MappingProxyType(per_class)
    return MappingProxyType(out)


class Profile:
    """Immutable latency measurements ``{stage: {executor class: {batch: (ms, ...)}}}``."""

    __slots__ = ("_fits", "stages")

    def __init__(self, stages: Mapping):
        self.stages = _freeze(stages)
        self._fits: dict = {}

    def __eq__(self, other):
        return isinstance(other, Profile) and _plain(self.stages) == _plain(other.stages)

    def __repr__(self):
        return f"Profile({_plain(self.stages)!r:.200})"

    def _get(self, stage: str, cls: str) -> Mapping:
        if stage not in self.stages:
            raise FlowValueError(f"no profile for stage {stage!r}; profiled stages: {sorted(self.stages)}")
        if cls not in self.stages[stage]:
            raise FlowValueError(
                f"stage {stage!r} was not profiled on executor class {cls!r}; "
                f"profiled classes: {sorted(self.stages[stage])}"
            )
        return self.stages[stage][cls]

    def classes(self, stage: str) -> tuple[str, ...]:
        if stage not in self.stages:
            raise FlowValueError(f"no profile for stage {stage!r}; profiled stages: {sorted(self.stages)}")
        return tuple(self.stages[stage])

    def batch_sizes(self, stage: str, cls: str) -> tuple[int, ...]:
        return tuple(self._get(stage, cls))

    def fit(self, stage: str, cls: str) -> LatencyFit:
        key = (stage, cls)
        if key not in self._fits:
            self._fits[key] = LatencyFit.of({b: float(np.mean(s)) for b, s in self._get(stage, cls).items()})
        return self._fits[key]

    def _nearest(self, stage: str, cls: str, batch: int) -> int:
        sizes = self.batch_sizes(stage, cls)
        i = bisect.bisect_left(sizes, batch)
        near = [sizes[j] for j in (i - 1, i) if 0 <= j < len(sizes)]
        return min(near, key=lambda b: abs(b - batch))

    def samples(self, stage: str, cls: str, batch: int) -> tuple[float, ...]:
        """Latencies (ms) of one call on ``batch`` rows: the measured ones, or for a batch
        size not measured, the nearest measured size's scaled by the fit (so its spread,
        and with it the stage's tail, carries over)."""
        batch = positive_int("batch size", batch)
        measured = self._get(stage, cls)
        if batch in measured:
            return measured[batch]
        fit = self.fit(stage, cls)
        near = self._nearest(stage, cls, batch)
        scale = fit(batch) / fit(near) if fit(near) > 0 else 1.0
        return tuple(s * scale for s in measured[near])

    def latency(self, stage: str, cls: str, batch: int, q: float = 50.0) -> float:
        """The ``q``-th percentile (ms) of one call on ``batch`` rows."""
        return float(np.percentile(self.samples(stage, cls, batch), q))

    def with_stage(self, stage: str, cls: str, measured: Mapping[int, list]) -> Profile:
        """A copy with ``stage`` on ``cls`` (re)measured: what the profiler adds."""
        stages = {s: {c: dict(bs) for c, bs in cs.items()} for s, cs in self.stages.items()}
        stages.setdefault(stage, {})[cls] = dict(measured)
        return Profile(stages)

    def to_dict(self) -> dict:
        out: dict[str, dict[str, dict]] = {}
        for stage, classes in self.stages.items():
            out[stage] = {}
            for cls, batches in classes.items():
                fit = self.fit(stage, cls)
                out[stage][cls] = {
                    "samples_ms": {str(b): list(s) for b, s in batches.items()},
                    "fit": {"a_ms": fit.a_ms, "c_ms": fit.c_ms},  # for readers; recomputed on load
                }
        return {"format": FORMAT, "stages": out}

    @classmethod
    def from_dict(cls, d) -> Profile:
        if not isinstance(d, Mapping) or d.get("format") != FORMAT or not isinstance(d.get("stages"), Mapping):
            raise FlowValueError(f"not a stored profile (format {FORMAT} with 'stages'): {d!r:.120}")
        stages: dict[str, dict[str, dict[int, list]]] = {}
        for stage, classes in d["stages"].items():
            stages[stage] = {}
            for c, body in classes.items():
                if not isinstance(body, Mapping) or not isinstance(body.get("samples_ms"), Mapping):
                    raise FlowValueError(
                        f"stored profile of stage {stage!r} on {c!r} has no 'samples_ms': {body!r:.120}"
                    )
                stages[stage][c] = {_batch_key(stage, b): s for b, s in body["samples_ms"].items()}
        return cls(stages)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        try:
            d = json.loads(text)
        except (TypeError, ValueError) as e:
            raise FlowValueError(f"a stored profile must be JSON text: {e}") from None
        return cls.from_dict(d)


def _batch_key(stage, b) -> int:
    try:
        return int(b)
    except ValueError:
        raise FlowValueError(f"stored profile of stage {stage!r}: batch size {b!r} is not an integer") from None


def _plain(stages) -> dict:
    return {s: {c: dict(bs) for c, bs in cs.items()} for s, cs in stages.items()}
