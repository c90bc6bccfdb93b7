"""Recorded-metric traces for the autoscaler tests, and a way to read their outcome.

Every trace uses a service time of 100 ms, so a stage's offered load in busy replicas is
``rate / 10``. With the default targets (utilisation 0.7, hysteresis 0.1) the hand
computations in the tests use:

    up need   = ceil(load / 0.7)    0.6 -> 1, 1.2 -> 2, 1.7 -> 3, 2.4 -> 4, 6.0 -> 9, 100 -> 143
    down need = ceil(load / 0.63)   0.6 -> 1, 1.2 -> 2, 1.7 -> 3, 2.4 -> 4
"""

from __future__ import annotations

from executors.hosts.autoscale import Autoscaler, AutoscalingConfig, StageMetrics, simulate

SERVICE_MS = 100.0


def sample(t: float, rate: float, replicas: int, **kw) -> StageMetrics:
    return StageMetrics(
        time=float(t),
        arrival_rate=float(rate),
        service_time_ms=kw.pop("service_time_ms", SERVICE_MS),
        replicas=replicas,
        **kw,
    )


def trace(stage: str, points) -> list:
    """(t, rate, replicas[, extra fields]) points -> simulate's (t, stage, StageMetrics) tuples."""
    out = []
    for p in points:
        t, rate, replicas, *extra = p
        out.append((float(t), stage, sample(t, rate, replicas, **(extra[0] if extra else {}))))
    return out


def steps(stage: str, segments, replicas: int, dt: float = 1.0, **fields) -> list:
    """Piecewise-constant rate: segments of (from_t, to_t exclusive, rate), sampled every dt."""
    out = []
    for start, stop, rate in segments:
        k = 0
        while start + k * dt < stop - 1e-9:
            t = round(start + k * dt, 6)
            out.append((t, stage, sample(t, rate, replicas, **fields)))
            k += 1
    return out


def run(trace_, config: AutoscalingConfig | None = None, stage: str = "s", **kw):
    configs = kw.pop("configs", None) or {stage: config or AutoscalingConfig()}
    return simulate(Autoscaler(configs, **kw), trace_)


def changes(result, stage: str | None = None) -> list[tuple]:
    """[(t, from, to)] (or (t, stage, from, to) for all stages) of a simulation."""
    if stage is None:
        return [(d.time, d.stage, d.from_replicas, d.to_replicas) for d in result.decisions]
    return [(d.time, d.from_replicas, d.to_replicas) for d in result.changes(stage)]


# a config that reacts to every sample: no delays, cooldowns, smoothing or hysteresis
NAIVE = AutoscalingConfig(
    upscale_delay_s=0,
    downscale_delay_s=0,
    upscale_cooldown_s=0,
    downscale_cooldown_s=0,
    smoothing_window_s=0,
    hysteresis=0,
)
