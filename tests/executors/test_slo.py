"""Serving under a latency SLO on a real local cluster (issue 17): the planner's sizes
applied at deploy, the SLO shown by explain / GET /flows / metrics, profiles stored and
reused, and the executor's AIMD batcher under the stage's budget."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from executors.hosts.profiling import load_profile, profile_plan, stage_inputs
from executors.worker.batcher import Batcher, aimd_for
from executors.worker.hosting import HostedStage
from flow import Flow
from flow.errors import FlowTypeError, FlowValueError
from optimizer import optimize
from optimizer.slo import SLO, InfeasibleSLOError, PlannerOptions, Profile, serve_under
from tests.executors.conftest import unique


def double(t):
    return t.column("x").to_numpy() * 2


def plus_one(t):
    return t.column("y").to_numpy() + 1


def two_stage(name: str) -> Flow:
    f = Flow(unique(name))
    f.map(double, names=["y"], batching=True).map(plus_one, names=["z"], batching=True)
    return f


RULES = ["batching"]  # keep the two stages apart (no fusion), both batching
APART = PlannerOptions(fuse=False)  # nor the planner's fusion (optimizer/slo/fusing.py)

# pre: 1 ms a call; model: 4 ms + 0.5 ms a request, measured up to batch 16
PROFILE = Profile(
    {
        "double": {"cpu": {1: [1.0] * 5, 16: [1.5] * 5}},
        "plus_one": {"cpu": {b: [4.0 + 0.5 * b] * 5 for b in (1, 2, 4, 8, 16)}},
    }
)


def _flow_json(cluster, name):
    return cluster.http.get(f"/flows/{name}").json()


def test_a_planned_slo_sizes_the_stages_and_is_shown_everywhere(cluster):
    f = two_stage("slo")
    d = cluster.deploy(f, rules=RULES, slo=SLO(p99_ms=40), profile=PROFILE, traffic=300, planner=APART)
    # 300 req/s at 4.5 ms a request needs batching on the model stage, one replica each
    planned = d.plan.slo.configs
    assert planned["plus_one"].batch_size > 1 and d.plan.stages["plus_one"].batch.max_batch_size > 1
    body = _flow_json(cluster, f.name)
    replicas = {s["name"]: s["replicas"] for s in body["stages"]}
    assert replicas == {n: c.replicas for n, c in planned.items()}  # exactly the planned count
    assert body["slo"]["slo"]["p99_ms"] == 40 and body["slo"]["planned"]
    assert set(body["slo"]["budgets_ms"]) == {"double", "plus_one"}
    assert "SLO p99 <= 40 ms" in body["explain"] and "to meet the SLO" in body["explain"]
    assert "SLO p99 <= 40 ms" in d.explain()

    rows = [{"x": i} for i in range(30)]
    for r in rows:
        assert d.invoke(r)["z"].tolist() == f.run([r])["z"].tolist()
    body = _flow_json(cluster, f.name)
    assert body["slo"]["answered"] == 30 and 0 <= body["slo"]["attainment"] <= 1
    for stage in body["stages"]:  # AIMD's live cap, per executor, from the answers
        caps, size = stage["batch_cap"], planned[stage["name"]].batch_size
        assert set(caps) <= set(stage["executors"]) and caps, stage
        assert all(isinstance(c, int) and 1 <= c <= 2 * size for c in caps.values()), (caps, size)
    metrics = cluster.http.get("/metrics").text
    assert f'flowserve_slo_attainment{{flow="{f.name}"}}' in metrics
    assert f'flowserve_slo_budget_share{{flow="{f.name}",stage="plus_one"}}' in metrics
    d.undeploy()
    plain = two_stage("plain")
    p = cluster.deploy(plain, rules=RULES)
    assert p.invoke({"x": 1})["z"].tolist() == [3]
    assert [s["batch_cap"] for s in _flow_json(cluster, plain.name)["stages"]] == [None, None]  # no SLO: no AIMD
    p.undeploy()


def test_the_planner_merges_stages_where_one_stage_costs_less_and_rows_are_unchanged(cluster):
    f = two_stage("slo-fused")
    d = cluster.deploy(f, rules=RULES, slo=SLO(p99_ms=40), profile=PROFILE, traffic=300)
    # apart: a replica each (cost 2); merged, one replica batches both (cost 1)
    assert list(d.plan.stages) == ["double+plus_one"]
    body = _flow_json(cluster, f.name)
    assert [s["name"] for s in body["stages"]] == ["double+plus_one"]
    assert "fused double, plus_one by the planner (cost 2 -> 1" in body["explain"]
    rows = [{"x": i} for i in range(20)]
    assert [d.invoke(r)["z"].tolist() for r in rows] == [f.run([r])["z"].tolist() for r in rows]
    d.undeploy()


def test_an_slo_without_a_profile_attaches_equal_budgets_and_says_to_profile(cluster):
    f = two_stage("slo-bare")
    d = cluster.deploy(f, rules=RULES, slo=SLO(p99_ms=30))
    body = _flow_json(cluster, f.name)
    assert body["slo"]["planned"] is False
    assert body["slo"]["budgets_ms"] == {"double": pytest.approx(15.0), "plus_one": pytest.approx(15.0)}
    assert "flowserve profile" in body["explain"]
    assert d.invoke({"x": 2})["z"].tolist() == [5]
    d.undeploy()


def test_samples_are_profiled_once_stored_and_reused(cluster):
    f = two_stage("slo-prof")
    cluster.deploy(f, rules=RULES, slo=SLO(p99_ms=200), samples=[{"x": i} for i in range(4)], traffic=20)
    stored = load_profile(cluster.kvs, f.name, optimize(f, rules=RULES))
    assert stored is not None and set(stored.stages) == {"double", "plus_one"}
    assert stored.batch_sizes("plus_one", "cpu")[:3] == (1, 2, 3)
    # a second deploy with no samples plans from the stored profile
    d = cluster.deploy(f, rules=RULES, slo=SLO(p99_ms=200), traffic=20, planner=APART)
    assert d.plan.slo.planned and Profile.from_json(d.plan.slo.profile_json) == stored
    d.undeploy()


def test_an_slo_no_stage_can_meet_names_the_stage(cluster):
    f = two_stage("slo-bad")
    with pytest.raises(InfeasibleSLOError, match="plus_one") as e:
        cluster.deploy(f, rules=RULES, slo=SLO(p99_ms=3), profile=PROFILE, traffic=10)
    assert e.value.stage == "plus_one"


def test_bad_slo_arguments_are_clear_errors(cluster):
    f = two_stage("slo-args")
    with pytest.raises(FlowTypeError, match="slo must be an SLO"):
        cluster.deploy(f, rules=RULES, slo=40)
    with pytest.raises(TypeError, match="needs slo=SLO"):
        f.deploy(cluster, traffic=10)
    with pytest.raises(FlowValueError, match="no stage"):
        serve_under(optimize(f), SLO(50), profile=PROFILE, rate_rps=10)  # fused plan: other stage names


def test_profiling_times_each_stage_on_the_inputs_it_really_gets():
    f = two_stage("prof")
    plan = optimize(f, rules=RULES)
    inputs = stage_inputs(plan, [{"x": 1}, {"x": 2}])
    assert [a[0]["x"].tolist() for a in inputs["double"]] == [[1], [2]]
    assert [a[0]["y"].tolist() for a in inputs["plus_one"]] == [[2], [4]]
    p = profile_plan(plan, [{"x": 1}, {"x": 2}], max_batch=4, repeats=2, warmup=0)
    assert p.batch_sizes("plus_one", "cpu") == (1, 2, 3, 4)
    with pytest.raises(FlowValueError, match="no sample row reached"):
        g = Flow(unique("prof-none"))
        g.filter(lambda r: False).map(plus_one, names=["z"], batching=True)
        stage_inputs(optimize(g, rules=RULES), [{"x": 1, "y": 1}])


def _by_class(t):
    import time as _t

    from flow.context import current_executor_class

    _t.sleep(0.002 if current_executor_class() == "gpu" else 0.02)  # a 10x faster "gpu"
    return t.column("x").to_numpy()


def test_profiling_per_class_runs_each_stage_as_on_that_class():
    from flow.context import current_executor_class

    f = Flow(unique("prof-class"))
    f.map(_by_class, names=["z"], batching=True)
    plan = optimize(f, rules=RULES)
    p = profile_plan(plan, [{"x": 1}], max_batch=2, repeats=3, warmup=0, classes=("cpu", "gpu"))
    assert p.classes(plan.sink) == ("cpu", "gpu")
    assert p.latency(plan.sink, "cpu", 1) >= 20 > 5 > p.latency(plan.sink, "gpu", 1)
    assert current_executor_class() == "cpu"  # restored after profiling


def test_the_batch_sizes_answers_ran_in_are_counted_per_batch():
    from executors.gateway.counters import StageCounters

    c = StageCounters()
    # one batch of 4 (its 4 answers each say 4), then two batches of 1, within the window
    for t, b in [(10.0, 4), (10.0, 4), (10.0, 4), (10.0, 4), (10.5, 1), (11.0, 1), (5.0, 16)]:
        c.batches.append((t, b))
    assert c.batch_seen(window_s=2.0, now=11.5) == {"mean": 2.0, "max": 4, "window_s": 2.0}  # 3 batches, 6 rows
    assert c.batch_seen(window_s=2.0, now=30.0) is None


def test_the_live_aimd_cap_is_each_executors_latest():
    from executors.gateway.counters import StageCounters

    c = StageCounters()
    assert c.batch_caps(now=10.0) is None
    c.caps.update({"e1": (10.0, 4), "e2": (5.0, 9)})
    assert c.batch_caps(window_s=60.0, now=11.0) == {"e1": 4, "e2": 9}
    assert c.batch_caps(window_s=60.0, now=66.0) == {"e1": 4}  # e2 said nothing for a minute


# -- the AIMD batcher inside the executor's Batcher ----------------------------------------


def _slow_when_big(t):
    return t.column("x").to_numpy()


def test_the_executor_batcher_backs_off_when_a_batch_overruns_its_budget():
    f = Flow(unique("aimd"))
    f.map(_slow_when_big, names=["y"], batching=True)
    plan = serve_under(optimize(f), SLO(p99_ms=25))  # one stage: a 25 ms budget, cap 20
    hosted = HostedStage(plan, plan.sink, 1)
    aimd = aimd_for(hosted)
    # a batch gets half the stage's budget: a request may wait for the batch in progress
    assert aimd is not None and aimd.budget_ms == pytest.approx(12.5) and aimd.max_batch == 20

    sizes: list[int] = []
    done = queue.Queue()

    def run(_hosted, batch):
        sizes.append(len(batch))
        if len(batch) > 6:
            time.sleep(0.04)  # a batch over 6 overruns the 12.5 ms batch budget
        for _ in batch:
            done.put(1)

    stopping = threading.Event()
    b = Batcher(hosted, run, stopping)
    n = 400
    for _ in range(n):
        b.put(object())  # items are opaque to the batcher: run() gets them back
    for _ in range(n):
        done.get(timeout=30)  # every item runs (synchronisation, not a timing)
    stopping.set()
    b.thread.join(5)
    assert max(sizes) >= 7  # it grew past the knee...
    assert sizes[-1] <= 7 and b.max_size <= 7  # ...and was cut back below it
    assert sum(sizes) == n


def test_without_an_slo_the_fixed_cap_stays():
    f = Flow(unique("fixed"))
    f.map(_slow_when_big, names=["y"], batching=True)
    plan = optimize(f)
    hosted = HostedStage(plan, plan.sink, 1)
    assert aimd_for(hosted) is None
    b = Batcher(hosted, lambda h, batch: None, threading.Event())
    assert b.max_size == 20 and b.wait_s() == 0


# -- the tuner -----------------------------------------------------------------------------


def _tuned_plan():
    f = Flow(unique("tune"))
    f.map(plus_one, names=["z"])  # no batching: one request per call
    plan = optimize(f)
    profile = Profile({plan.sink: {"cpu": {1: [10.0] * 5}}})  # 100 req/s a replica
    return serve_under(plan, SLO(p99_ms=50), profile=profile, rate_rps=50)


def test_the_tuner_scales_up_at_once_when_traffic_leaves_the_envelope_and_down_after_15_s():
    from executors.hosts.scaling import SLOTuner

    plan = _tuned_plan()
    stage = plan.sink
    tuner = SLOTuner(plan)
    assert tuner.per_ms[stage] == pytest.approx(0.1)
    # 250 req/s over the last second: 250 / (100 x 0.8) -> 4 replicas, at once
    (up,) = tuner.decide({stage: 1}, {1000: 250, 2000: 300, 5000: 400}, now=0.0)
    assert (up.from_replicas, up.to_replicas, up.direction) == (1, 4, "up")
    assert "250 req/s" in up.reason
    # back to 50 req/s: no scale-down until 15 s of samples asked for fewer
    for t in range(1, 15):
        assert tuner.decide({stage: 4}, {1000: 50, 2000: 100, 5000: 250}, now=float(t)) == []
    (down,) = tuner.decide({stage: 4}, {1000: 50, 2000: 100, 5000: 250}, now=16.0)
    assert (down.from_replicas, down.to_replicas) == (4, 1)


def test_the_tuner_scales_down_on_a_loop_whose_ticks_miss_the_window_edge():
    # the scaling loop ticks every 0.5 s plus whatever the tick cost: never exactly 15 s apart
    from executors.hosts.scaling import SLOTuner

    plan = _tuned_plan()
    stage = plan.sink
    tuner = SLOTuner(plan)
    tuner.decide({stage: 1}, {1000: 250, 2000: 300, 5000: 400}, now=0.0)
    downs, t = [], 0.0
    while t < 20 and not downs:
        t += 0.5 + 0.0031
        downs = tuner.decide({stage: 4}, {1000: 50, 2000: 100, 5000: 250}, now=t)
    assert downs, "never scaled down"
    assert 15.0 <= t < 15.6 and (downs[0].from_replicas, downs[0].to_replicas) == (4, 1)


@pytest.fixture
def own_cluster():
    """A cluster of its own: the tuner adds executors, which the shared one must not keep."""
    from executors.hosts.cluster import LocalCluster
    from executors.hosts.cluster_config import ClusterConfig

    with LocalCluster(ClusterConfig(executors=2, threads=4, request_timeout_s=20)) as c:
        yield c


def test_the_tuner_grows_a_planned_stage_on_the_real_cluster_under_a_burst(own_cluster):
    from tests.executors.processes import steady_load

    cluster = own_cluster

    f = Flow(unique("tune-live"))

    def slow(r):
        import time as _t

        _t.sleep(0.01)
        return r.x

    f.map(slow, names=["z"])
    plan_profile = Profile({"slow": {"cpu": {1: [10.0] * 5}}})
    # planned for 20 req/s (1 replica); closed-loop clients then push about 100+ req/s
    d = cluster.deploy(f, slo=SLO(p99_ms=60), profile=plan_profile, traffic=20)
    assert {s["name"]: s["replicas"] for s in _flow_json(cluster, f.name)["stages"]} == {"slow": 1}
    with steady_load(d.url, {"x": 1}) as failures:
        deadline = time.monotonic() + 30
        while _flow_json(cluster, f.name)["stages"][0]["replicas"] < 2:
            assert time.monotonic() < deadline, "the tuner did not add a replica"
            time.sleep(0.1)
    assert not failures, failures[:3]
    st = _flow_json(cluster, f.name)["stages"][0]["autoscaling"]
    assert "SLO tuner" in st["last_decision"]
    d.undeploy()


def test_the_tuner_re_plans_batch_sizes_on_the_real_cluster_under_a_burst(cluster):
    # the ladder planned with the flow when asked for (traffic 10 req/s, re-plans up to 60) is
    # switched to as the flow's next version: the stage runs bigger batches, on the same replica
    from tests.executors.processes import steady_load

    f = Flow(unique("replan-live"))

    def slow_batch(t):
        import time as _t

        _t.sleep(0.02)
        return t.column("x").to_numpy()

    f.map(slow_batch, names=["z"], batching=True)
    plan = optimize(f, rules=["batching"])
    # batch 1 serves 50 req/s a replica, batch 8 nearly 300: a re-plan for more grows the batch
    profile = Profile({plan.sink: {"cpu": {1: [20.0] * 5, 2: [21.0] * 5, 4: [23.0] * 5, 8: [27.0] * 5}}})
    from optimizer.slo import PlannerOptions
    from optimizer.slo.tuning import LADDER_FACTORS

    d = cluster.deploy(
        f,
        rules=["batching"],
        slo=SLO(p99_ms=80),
        profile=profile,
        traffic=10,
        planner=PlannerOptions(ladder=LADDER_FACTORS),
    )
    before = _flow_json(cluster, f.name)
    assert before["stages"][0]["batch"]["max_batch_size"] == 1 and len(before["slo"]["ladder_rates_rps"]) > 1
    with steady_load(d.url, {"x": 1}) as failures:
        deadline = time.monotonic() + 30
        while (now := _flow_json(cluster, f.name))["stages"][0]["batch"]["max_batch_size"] == 1:
            assert time.monotonic() < deadline, "the tuner did not re-plan the batch size"
            time.sleep(0.1)
    assert not failures, failures[:3]  # requests in flight during the switch finish
    stage = now["stages"][0]
    assert stage["batch"]["max_batch_size"] > 1 and stage["replicas"] == 1
    assert "re-planned for" in stage["autoscaling"]["last_decision"]
    assert now["version"] > before["version"] and now["slo"]["planning_rate_rps"] >= 30
    assert stage["batch_seen"] is not None and stage["batch_seen"]["max"] >= 1
    d.undeploy()


def test_the_tuner_keeps_the_planned_replicas_and_scales_them_with_the_envelope():
    # the planner gave "m" 3 replicas at 50 req/s for the queueing, not the throughput
    # (1 would carry 50 req/s at 0.8): the tuner never goes below 3, and traffic at twice
    # the planning envelope doubles them
    from dataclasses import replace

    from executors.hosts.scaling import SLOTuner
    from optimizer.slo import StageConfig

    plan = _tuned_plan()
    stage = plan.sink
    serving = replace(plan.slo, configs={stage: StageConfig(1, 3, "cpu")})
    plan = replace(plan, slo=serving)
    tuner = SLOTuner(plan)
    env = tuner.envelope
    assert env[1000] > 0  # the planning trace's most arrivals in 1 s, 2 s, 5 s
    within = {w: n for w, n in env.items()}
    for t in range(0, 20):
        assert tuner.decide({stage: 3}, within, now=float(t)) == []  # no scale-down below the plan
    twice = {w: 2 * n for w, n in env.items()}
    (up,) = tuner.decide({stage: 3}, twice, now=21.0)
    assert up.to_replicas == 6
