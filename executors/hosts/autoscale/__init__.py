"""Per-stage autoscaling: a pure policy (metrics in, replica decisions out) and its settings.

    from executors.hosts.autoscale import Autoscaler, AutoscalingConfig, StageMetrics

    scaler = Autoscaler({"preprocess": AutoscalingConfig(), "SmallNet": AutoscalingConfig(max_replicas=2)})
    scaler.observe("SmallNet", StageMetrics(time=now, arrival_rate=40, service_time_ms=35,
                                            replicas=1, queue_length=3, device="gpu"))
    for decision in scaler.decide(now):   # ScalingDecision(stage, device, from, to, reason)
        backend.scale(decision)            # scale-downs: drain first (see policy.py)

``simulate(scaler, trace)`` replays a recorded metric trace and returns the replica timeline.
"""

from executors.hosts.autoscale.autoscaler import (
    Autoscaler,
    ScalingDecision,
    SimulationResult,
    StageMetrics,
    StageStatus,
    simulate,
)
from executors.hosts.autoscale.autoscaling_config import AutoscalingConfig

__all__ = [
    "Autoscaler",
    "AutoscalingConfig",
    "ScalingDecision",
    "SimulationResult",
    "StageMetrics",
    "StageStatus",
    "simulate",
]
