"""Serving under a latency SLO: the pure parts, over plans and profiles.

- ``SLO``: the objective (``spec``); ``Profile``: measured latency per stage, executor
  class and batch size (``profile``), filled by ``measure_batches`` (``profiler``).
- ``simulate``: a discrete-event simulation of a ``SimPipeline`` over an arrival trace
  (``simulator``, ``pipeline``, ``traces``).
- ``plan_for_slo``: InferLine's greedy planner: batch size, replicas and executor class
  per stage at the least cost under the SLO (``planner``).
- ``serve_under``: a Plan configured by the planner, carrying a ``ServingSLO`` (``sizing``).
- ``AIMDBatcher``: Clipper's adaptive batch size and delay window (``aimd``);
  ``ArrivalEnvelope``: max arrivals per window, for the tuner (``envelope``).

docs/slo.md says how they plug into the runtime.
"""

from optimizer.slo.aimd import AIMDBatcher
from optimizer.slo.envelope import WINDOWS_MS, ArrivalEnvelope, envelope_of
from optimizer.slo.errors import InfeasibleSLOError
from optimizer.slo.pipeline import (
    ROUTINGS,
    Shape,
    SimPipeline,
    SimStage,
    StageConfig,
    StageShape,
    exponential,
    fixed,
    linear,
    pipeline_from_plan,
    profile_service,
)
from optimizer.slo.planner import PlannerOptions, SLOPlan, StagePlan, plan_for_slo
from optimizer.slo.profile import LatencyFit, Profile
from optimizer.slo.profiler import default_batch_sizes, measure_batches
from optimizer.slo.simulator import SimResult, StageStats, simulate
from optimizer.slo.sizing import ServingSLO, equal_budgets, planning_trace, serve_under
from optimizer.slo.spec import SLO
from optimizer.slo.traces import bursty, check_trace, poisson

__all__ = [
    "ROUTINGS",
    "SLO",
    "WINDOWS_MS",
    "AIMDBatcher",
    "ArrivalEnvelope",
    "InfeasibleSLOError",
    "LatencyFit",
    "PlannerOptions",
    "Profile",
    "SLOPlan",
    "ServingSLO",
    "Shape",
    "SimPipeline",
    "SimResult",
    "SimStage",
    "StageConfig",
    "StagePlan",
    "StageShape",
    "StageStats",
    "bursty",
    "check_trace",
    "default_batch_sizes",
    "envelope_of",
    "equal_budgets",
    "exponential",
    "fixed",
    "linear",
    "measure_batches",
    "pipeline_from_plan",
    "plan_for_slo",
    "planning_trace",
    "poisson",
    "profile_service",
    "serve_under",
    "simulate",
]
