"""Per-stage autoscaling on a real local cluster: a load step grows the hot stage only,
and it shrinks back once the load is gone."""

from __future__ import annotations

import time

from executors.hosts.autoscale import AutoscalingConfig
from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow
from tests.executors.processes import steady_load


def busy(row):
    import time

    time.sleep(0.02)  # the hot stage: 20 ms a request
    return row.x


def replicas(c: LocalCluster, flow: str) -> dict[str, int]:
    return {s["name"]: s["replicas"] for s in c.http.get(f"/flows/{flow}").json()["stages"]}


def fast_policy() -> AutoscalingConfig:
    """A policy that reacts within a second or two: what the live-cluster tests wait for."""
    return AutoscalingConfig(
        min_replicas=1,
        max_replicas=3,
        upscale_delay_s=0.5,
        upscale_cooldown_s=0.5,
        downscale_delay_s=2.0,
        downscale_cooldown_s=1.0,
        smoothing_window_s=0.5,
    )


def test_load_step_scales_the_hot_stage_only_then_back():
    policy = fast_policy()
    with LocalCluster(ClusterConfig(executors=3, threads=4, autoscaling=policy)) as c:
        f = Flow("hotcold")
        f.map(lambda r: r.x + 1, names=["x"]).map(busy, names=["y"])
        d = c.deploy(f, optimize=False)  # two stages: one cold, one hot
        cold, hot = list(d.plan.stages)
        assert replicas(c, f.name) == {cold: 1, hot: 1}

        with steady_load(d.url, {"x": 1}) as failures:
            deadline = time.monotonic() + 30
            while replicas(c, f.name)[hot] < 2:
                assert time.monotonic() < deadline, f"hot stage did not scale up: {replicas(c, f.name)}"
                time.sleep(0.1)
            assert replicas(c, f.name)[cold] == 1  # 6 req in flight x 0.1 ms: no need to grow
        assert not failures, failures[:3]
        deadline = time.monotonic() + 30
        while replicas(c, f.name)[hot] > 1:
            assert time.monotonic() < deadline, f"hot stage did not scale back down: {replicas(c, f.name)}"
            time.sleep(0.1)
        status = c.http.get(f"/flows/{f.name}").json()["stages"]
        hot_status = next(s for s in status if s["name"] == hot)["autoscaling"]
        assert hot_status["target"] == 1 and hot_status["last_decision"]
        metrics = c.http.get("/metrics").text
        assert (
            f'flowserve_scaling_decisions_total{{direction="up",flow="{f.name}",stage="{hot}"}}' in metrics
            or f'flowserve_scaling_decisions_total{{flow="{f.name}",stage="{hot}",direction="up"}}' in metrics
        )
        assert d.invoke({"x": 1})["y"].tolist() == [2]
