"""Per-stage autoscaling settings: one frozen, validated object with documented defaults.

    >>> from executors.hosts.autoscale import AutoscalingConfig
    >>> AutoscalingConfig(min_replicas=1, max_replicas=4, target_utilisation=0.6).max_step_up
    2.0

A bad field raises ``ConfigError`` (``ConfigTypeError`` for a wrong type); a bad metric
or argument of the autoscaler ``FlowValueError`` / ``FlowTypeError`` (``flow.errors``).
Every message names the field and quotes the bad value, e.g.
``AutoscalingConfig.min_replicas must be an int >= 0, got -1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flow.configuration import Check, Config, Int, Number, check_value, setting
from flow.errors import FlowTypeError, FlowValueError

_SECONDS = Number(ge=0, note="seconds")


@dataclass(frozen=True)
class AutoscalingConfig(Config):
    """How the autoscaler sizes one stage (one config per stage; GPU and CPU stages alike).

    The need of a stage, in replicas, is the largest of (whichever targets are set):

    * Little's law: ``arrival_rate * service_time / target_utilisation`` (the offered
      load in busy replicas, with headroom), and the measured ``utilisation * replicas /
      target_utilisation``;
    * queue pressure: ``queue_length / target_queue_per_replica``;

    rounded up, at least 1 while the stage has any work, clamped to
    ``[min_replicas, max_replicas]``.

    Fields (defaults in brackets, and why):

    min_replicas [1]: never fewer. 1 keeps a warm replica (loading a model takes seconds);
        0 allows scale-to-zero (the first request then waits for a replica to start).
    max_replicas [8]: never more; bounds the cost of a wrong measurement.
    target_utilisation [0.7]: busy fraction per replica to size for, in (0, 1]. 30 %
        headroom keeps queueing delay small under Poisson arrivals. None: do not use
        rate/utilisation (scale on the queue only).
    target_queue_per_replica [2.0]: waiting requests per replica above which the stage
        is short of replicas (Ray Serve's default target is 2 ongoing requests). For
        batching stages set it to at least the batch size: a batch being filled is not
        a backlog. None: ignore the queue. At least one of the two targets must be set.
    upscale_delay_s [1.0]: scale up only when every sample of the last this-many seconds
        asked for more replicas. InferLine reacts within seconds; Ray Serve's 30 s is too
        slow for millisecond SLOs. A spike that lasts no longer than this never scales.
    downscale_delay_s [15.0]: scale down only when every sample of the last this-many
        seconds asked for fewer (InferLine's tuner waits 15 s). Long, because removing
        a replica by mistake costs a cold start while keeping one costs little.
    upscale_cooldown_s [2.0]: after any change, wait this long before scaling up again,
        so new replicas start and show in the metrics before the next step.
    downscale_cooldown_s [15.0]: after any change, wait this long before scaling down;
        this is what stops an up-then-down flap.
    max_step_up [2.0]: one scale-up goes at most to ``max(ceil(n * max_step_up), n + 1)``
        replicas (double per step): bounded overshoot if a measurement is wrong, and
        still 1 -> 8 in three steps.
    smoothing_window_s [1.0]: the needs are also computed from the metrics averaged over
        this window, and smoothing only ever delays a change: a scale-up uses the lower of
        the raw and the smoothed need, a scale-down the higher. 1 s makes the policy
        independent of the sampling rate (samples faster than 1/s, whose rates are noisy,
        are averaged to a 1 s view) while at the recommended 1 s sampling a load step is
        still acted on within upscale_delay_s + one interval. Longer windows damp noise
        more but slow the reaction by up to the window. 0 turns it off.
    hysteresis [0.1]: scale down only to a count that would run at most
        ``target * (1 - hysteresis)``, so a load between the two thresholds holds the
        current count instead of flapping around one threshold (Kubernetes' HPA uses a
        10 % tolerance).
    """

    min_replicas: int = setting(1, Int(0))
    max_replicas: int = setting(8, Int(1))
    target_utilisation: float | None = setting(0.7, Number(gt=0, le=1, optional=True))
    target_queue_per_replica: float | None = setting(2.0, Number(gt=0, optional=True))
    upscale_delay_s: float = setting(1.0, _SECONDS)
    downscale_delay_s: float = setting(15.0, _SECONDS)
    upscale_cooldown_s: float = setting(2.0, _SECONDS)
    downscale_cooldown_s: float = setting(15.0, _SECONDS)
    max_step_up: float = setting(2.0, Number(ge=1))
    smoothing_window_s: float = setting(1.0, _SECONDS)
    hysteresis: float = setting(0.1, Number(ge=0, lt=1))

    def _validate(self) -> None:
        f = "AutoscalingConfig"
        if self.max_replicas < self.min_replicas:
            raise self.error(
                f"{f}.max_replicas must be >= min_replicas ({self.min_replicas}), got {self.max_replicas!r}"
            )
        if self.target_utilisation is None and self.target_queue_per_replica is None:
            raise self.error(f"{f} needs target_utilisation or target_queue_per_replica, got both None")


# -- validation helpers (shared with policy.py) ------------------------------------------


def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_int(v, name: str, minimum: int) -> None:
    """``v`` must be an int (not a bool) >= minimum; the message quotes the bad value."""
    check_value(v, name, Int(minimum), error=FlowValueError, type_error=FlowTypeError)


def check_number(v, name: str, what: str, ok) -> None:
    """``v`` must be a finite int or float (not a bool) with ``ok(v)`` true."""
    check_value(
        v,
        name,
        Check(what, lambda x: math.isfinite(x) and ok(x), types=(int, float)),
        error=FlowValueError,
        type_error=FlowTypeError,
    )
