"""GPU executors fall back to the CPU cleanly where there is no GPU (as on CI)."""

from __future__ import annotations

import logging

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from executors.worker import gpu
from flow import Flow, current_device


def test_gpu_class_without_cuda_warns_and_uses_cpu(caplog, monkeypatch):
    monkeypatch.setattr(gpu, "cuda_device_count", lambda: 0)
    with caplog.at_level(logging.WARNING, logger="flowserve.gpu"):
        gpu.set_executor_class("gpu")
    try:
        assert "runs on the CPU" in caplog.text or "run on the CPU" in caplog.text
        assert current_device() == "cpu"
        assert gpu.gpu_stats() == [] or all("utilisation" in g for g in gpu.gpu_stats())
    finally:
        gpu.set_executor_class("cpu")


def where(row):
    from flow import current_device

    return current_device()


def test_gpu_stage_runs_on_a_gpu_executor_falling_back_to_cpu():
    with LocalCluster(ClusterConfig(executors=1, gpu_executors=1)) as c:
        f = Flow("gpu-stage")
        f.map(lambda r: r.x, names=["x"]).map(where, names=["device"], gpu=True)
        d = c.deploy(f)
        gpu_stage = next(s for s in d.plan.stages.values() if s.device == "gpu")
        status = c.status()["flows"][0]
        placed = {s["name"]: s["executors"] for s in status["stages"]}
        assert all(e.startswith("gpu") for e in placed[gpu_stage.name])  # never on a cpu-only executor
        assert all(e.startswith("cpu") for n, ids in placed.items() if n != gpu_stage.name for e in ids)
        # without CUDA (as on CI) the same code runs on the CPU; on a GPU machine, on the GPU
        assert d.invoke({"x": 1})["device"].tolist() == ["cuda" if gpu.cuda_device_count() else "cpu"]
