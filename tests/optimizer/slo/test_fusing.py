"""The planner's fusion of neighbouring stages (optimizer/slo/fusing.py): literal cases
whose cheapest answer is known, the fusion rule's structural checks kept, and the served
plan returning what ``flow.run`` returns."""

from __future__ import annotations

import numpy as np
import pytest

from flow import Flow
from optimizer import optimize
from optimizer.slo import SLO, PlannerOptions, Profile, serve_under
from optimizer.slo.fusing import fused_profile, plan_with_fusion
from optimizer.slo.planner import plan_for_slo


def every(ms: float, n: int = 400) -> np.ndarray:
    return np.arange(n) * ms


def model(t):
    return t.column("x").to_numpy() * 2


def post(t):
    return t.column("y").to_numpy() + 1


def other(t):
    return t.column("y").to_numpy() - 1


def chain(name: str, batching: bool = True) -> Flow:
    f = Flow(name)
    f.map(model, names=["y"], batching=batching).map(post, names=["z"], batching=batching)
    return f


def apart(flow: Flow):
    return optimize(flow, rules=["batching"])  # the optimizer's own fusion off: two stages


# a GPU model (cheap per row on a GPU, slow on a CPU) and a cheap step after it, same on both
GPU_MODEL = Profile(
    {
        "model": {"cpu": {b: [40.0 + 30.0 * b] * 3 for b in (1, 4)}, "gpu": {b: [5.0 + 0.5 * b] * 3 for b in (1, 4)}},
        "post": {"cpu": {b: [1.0 + 0.2 * b] * 3 for b in (1, 4)}, "gpu": {b: [1.0 + 0.2 * b] * 3 for b in (1, 4)}},
    }
)
PRICES = PlannerOptions(prices={"cpu": 1.0, "gpu": 6.0})


def test_a_merged_stage_profile_is_the_sum_of_its_parts_where_both_were_measured():
    p = Profile({"a": {"cpu": {1: [1.0, 2.0], 4: [3.0]}, "gpu": {1: [9.0]}}, "b": {"cpu": {1: [10.0, 20.0], 2: [5.0]}}})
    merged = fused_profile(p, "a", "b", "a+b")
    assert dict(merged.stages["a+b"]) == {"cpu": {1: (11.0, 22.0)}}  # gpu: b has none; batch 4/2: not both
    assert set(merged.stages) == {"a+b"}
    assert fused_profile(Profile({"a": {"gpu": {1: [1.0]}}, "b": {"cpu": {1: [1.0]}}}), "a", "b", "a+b") is None


def test_a_cheap_step_after_a_gpu_model_rides_on_the_gpu_replica():
    plan = apart(chain("fz-gpu"))
    alone = plan_for_slo(plan, GPU_MODEL, SLO(40), every(10.0), PRICES)
    assert alone.cost_per_s == 7.0  # gpu x1 for the model, cpu x1 for post
    fused, profile, result, merged = plan_with_fusion(plan, GPU_MODEL, SLO(40), every(10.0), PRICES, first=alone)
    assert list(fused.stages) == ["model+post"] and merged == {"model+post": ("model", "post")}
    (config,) = result.configs().values()
    assert (config.executor_class, config.replicas, result.cost_per_s) == ("gpu", 1, 6.0)
    assert result.tail_ms <= 40 and set(profile.stages) == {"model+post"}


def test_no_merge_when_it_saves_nothing():
    # two CPU stages of 10 ms, a request every 5 ms: apart 2 + 2 replicas, merged 20 ms needs 4
    p = Profile({"model": {"cpu": {1: [10.0]}}, "post": {"cpu": {1: [10.0]}}})
    plan = apart(chain("fz-none", batching=False))
    fused, _, result, merged = plan_with_fusion(plan, p, SLO(30), every(5.0), PlannerOptions())
    assert merged == {} and list(fused.stages) == ["model", "post"] and result.cost_per_s == 4.0


def test_a_stage_read_by_two_others_is_never_merged():
    f = Flow("fz-fork")
    y = f.map(model, names=["y"], batching=True)
    y.map(post, names=["z"], batching=True).join(y.map(other, names=["w"], batching=True))
    plan = optimize(f, rules=["batching"])
    p = Profile({n: {"cpu": {1: [1.0]}, "gpu": {1: [1.0]}} for n in plan.stages})
    fused, _, _, merged = plan_with_fusion(plan, p, SLO(50), every(10.0), PRICES)
    assert "model" in fused.stages  # its two readers still need its output
    assert all("model" not in parts for parts in merged.values())


def test_serve_under_fuses_by_default_says_why_and_keeps_the_rows():
    f = chain("fz-serve")
    served = serve_under(apart(f), SLO(40), profile=GPU_MODEL, trace=every(10.0), options=PRICES)
    assert list(served.stages) == ["model+post"] and served.stages["model+post"].device == "gpu"
    assert "fused model, post by the planner (cost 7 -> 6" in served.slo.explain()
    assert set(served.slo.budgets) == {"model+post"} and served.slo.options["fuse"] is True
    assert set(served.slo.profile().stages) == {"model+post"}  # what the tuner re-plans from
    from executors.worker.interpreter import run_plan

    rows = [{"x": i} for i in range(5)]
    assert run_plan(served, rows)["z"].tolist() == f.run(rows)["z"].tolist()


def test_fuse_false_keeps_the_optimizers_stages():
    options = PlannerOptions(prices={"cpu": 1.0, "gpu": 6.0}, fuse=False)
    served = serve_under(apart(chain("fz-off")), SLO(40), profile=GPU_MODEL, trace=every(10.0), options=options)
    assert list(served.stages) == ["model", "post"] and served.slo.cost_per_s == 7.0
    with pytest.raises(Exception, match="fuse must be True or False"):
        PlannerOptions(fuse="yes")
