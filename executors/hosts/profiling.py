"""Serving under a latency SLO, the planning side (the pure core is optimizer/slo).

- ``profile_plan(plan, samples, kvs)``: times every stage of a plan per batch size on
  this machine, on the inputs each stage sees when the plan runs on the sample rows
  (``flowserve profile FLOW``); ``save_profile``/``load_profile`` keep it in the store
  (JSON, never pickle) under the flow's name, so that later deploys reuse it.
- ``plan_for_deploy``: what ``ClusterClient.deploy(flow, slo=...)`` does with the
  optimized plan: profile (given, stored, or measured now from ``samples``), plan
  (``optimizer.slo.serve_under``), store the profile.
The gateway's figures of such flows are executors/gateway/app/slo_monitor.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from executors.worker.stage_runner import BoundStage
from flow.errors import FlowError, FlowTypeError, FlowValueError
from flow.table import Table
from optimizer.plan import INPUT, Plan
from optimizer.slo import SLO, PlannerOptions, Profile, default_batch_sizes, measure_batches, serve_under

log = logging.getLogger("flowserve.slo")

PROFILE_KEY = "flowserve:profile:{flow}"


# -- profiler ------------------------------------------------------------------------------


def stage_inputs(plan: Plan, samples, kvs=None) -> dict[str, list[list[Table]]]:
    """Per stage, the input Tables it gets when the plan runs on each sample row alone (a
    sample whose run fails at a stage, or whose row was filtered out, gives no input to
    the stages after it)."""
    from types import SimpleNamespace

    from flow.validation import check_input

    schema = SimpleNamespace(name=plan.flow_name, schema=plan.input_schema)
    if isinstance(samples, dict) and not any(isinstance(v, (list, tuple)) for v in samples.values()):
        samples = [samples]
    rows = Table.from_any(samples).to_pylist(qid=False)
    if len(rows) == 0:
        raise FlowValueError(f"flow {plan.flow_name!r}: profiling needs at least one sample row")
    bound = {n: BoundStage(s) for n, s in plan.stages.items()}
    out: dict[str, list[list[Table]]] = {n: [] for n in plan.stages}
    for i in range(len(rows)):
        values = {INPUT: check_input(schema, [rows[i]], qid=[i])}
        for name, stage in plan.stages.items():
            if any(x not in values for x in stage.inputs):
                continue
            args = [values[x] for x in stage.inputs]
            if all(len(a) == 0 for a in args):
                continue  # filtered out before this stage: no sample of its work
            out[name].append(args)
            try:
                values[name] = bound[name](args, kvs)
            except FlowError:
                pass  # this sample stops here; its later stages are profiled on the others
    empty = [n for n, v in out.items() if not v]
    if empty:
        raise FlowValueError(
            f"flow {plan.flow_name!r}: no sample row reached stage(s) {empty} (every run failed or was "
            f"filtered before); give sample rows that pass through the whole flow"
        )
    return out


def profile_plan(
    plan: Plan,
    samples,
    kvs=None,
    *,
    max_batch: int = 32,
    repeats: int = 10,
    warmup: int = 2,
    classes: Sequence[str] | None = None,
) -> Profile:
    """Every stage timed per batch size (``default_batch_sizes(max_batch)`` for batching
    stages, 1 for the others) on this machine, under the class the stage is placed on, or
    under each of ``classes`` (built and run as on an executor of that class:
    ``flow.context.current_executor_class()``), so that the planner can choose."""
    from flow.context import using_executor_class

    inputs = stage_inputs(plan, samples, kvs)
    profile = Profile({})
    for name, stage in plan.stages.items():
        for cls in classes or (stage.device,):
            with using_executor_class(cls):
                profile = _profile_stage(profile, name, stage, cls, inputs[name], kvs, max_batch, repeats, warmup)
    return profile


def _profile_stage(profile, name, stage, cls, inputs, kvs, max_batch, repeats, warmup) -> Profile:
    bound = BoundStage(stage)
    sizes = default_batch_sizes(max_batch) if stage.batch is not None else (1,)
    arity = len(stage.inputs)

    def merge(batch, arity=arity):
        return [Table.concat([args[p] for args in batch]) for p in range(arity)]

    measured = measure_batches(
        lambda args, bound=bound: bound(args, kvs),
        inputs,
        batch_sizes=sizes,
        warmup=warmup,
        repeats=repeats,
        make_batch=merge,
    )
    return profile.with_stage(name, cls, measured)


def save_profile(kvs, flow_name: str, profile: Profile) -> None:
    kvs.redis.set(PROFILE_KEY.format(flow=flow_name), profile.to_json().encode())


def load_profile(kvs, flow_name: str, plan: Plan | None = None) -> Profile | None:
    """The stored profile of ``flow_name`` (None if there is none, or if it does not cover
    every stage of ``plan``: the flow changed since it was profiled)."""
    raw = kvs.redis.get(PROFILE_KEY.format(flow=flow_name))
    if raw is None:
        return None
    profile = Profile.from_json(raw.decode() if isinstance(raw, bytes) else raw)
    if plan is not None and any(n not in profile.stages for n in plan.stages):
        return None
    return profile


# -- deploy --------------------------------------------------------------------------------


def _trace_or_rate(traffic):
    """``traffic``: requests per second (a number) or arrival timestamps in ms."""
    if traffic is None:
        return None, None
    if isinstance(traffic, bool):
        raise FlowTypeError(f"traffic must be requests per second or a trace of arrival ms, got {traffic!r}")
    if isinstance(traffic, (int, float)):
        return None, float(traffic)
    if isinstance(traffic, Sequence) or hasattr(traffic, "__array__"):
        return traffic, None
    raise FlowTypeError(f"traffic must be requests per second or a trace of arrival ms, got {traffic!r:.80}")


def plan_for_deploy(
    kvs,
    plan: Plan,
    slo: SLO,
    *,
    traffic=None,
    samples=None,
    profile: Profile | None = None,
    planner: PlannerOptions | None = None,
) -> Plan:
    """The plan to register for a deploy under ``slo``. The profile: ``profile`` if given,
    else measured now from ``samples`` (and stored), else the stored one; planned when
    there is a profile and a load (``traffic``), else the SLO is only attached."""
    if not isinstance(slo, SLO):
        raise FlowTypeError(f"slo must be an SLO (flowserve.SLO(p99_ms=50)), got {type(slo).__name__} {slo!r:.80}")
    if profile is None and samples is not None:
        profile = profile_plan(plan, samples, kvs)
        save_profile(kvs, plan.flow_name, profile)
    elif profile is not None:
        save_profile(kvs, plan.flow_name, profile)
    else:
        profile = load_profile(kvs, plan.flow_name, plan)
    trace, rate = _trace_or_rate(traffic)
    if profile is not None and trace is None and rate is None:
        log.warning("flow %s: an SLO without traffic=: not planned, budgets only", plan.flow_name)
        profile = None
    # with a load, the tuner's re-plans for higher rates are planned now too, if asked for
    # (PlannerOptions.ladder, tuning.py): a switch rebuilds every stage, so it is opt-in
    ladder = planner.ladder if planner is not None and profile is not None else ()
    return serve_under(plan, slo, profile=profile, trace=trace, rate_rps=rate, options=planner, ladder=ladder)
