"""executors/worker/gpu.py's logic, on any machine: which GPUs CUDA_VISIBLE_DEVICES leaves, NVML
opened once and read at most every STATS_TTL_S (the executor answers a ping a second on its
IO thread), the device strings operator code may be given.

NVML itself cannot run here (no driver): a stand-in ``pynvml`` module (NVML's Python API,
nvidia-ml-py, is a third-party library, not part of FlowServe) counts the calls. On a
machine with NVML, the real one is checked too."""

from __future__ import annotations

import os
import sys
import types
from collections import namedtuple

import pytest

from executors.worker import gpu
from flow.context import current_device, set_device
from flow.errors import FlowValueError

DEVICES = [(0, "GPU-aaaa-0"), (1, "GPU-bbbb-1"), (2, "GPU-cccc-2")]


@pytest.mark.parametrize(
    "spec, want",
    [
        (None, [0, 1, 2]),
        ("", []),
        ("2,0", [2, 0]),
        ("1,7,0", [1]),  # CUDA stops at the first entry that names no device
        ("GPU-cccc", [2]),
        ("GPU-", []),  # a prefix of several: ambiguous, as CUDA takes it
        ("0,0", [0]),
        ("gpu0", []),
    ],
)
def test_cuda_visible_devices(spec, want):
    assert [i for i, _ in gpu.visible(DEVICES, spec)] == want


Util = namedtuple("Util", "gpu memory")
Mem = namedtuple("Mem", "total used free")
Proc = namedtuple("Proc", "pid usedGpuMemory")


def fake_nvml(calls: dict, pid: int) -> types.ModuleType:
    m = types.ModuleType("pynvml")

    def count(name, value=None):
        def f(*args):
            calls[name] = calls.get(name, 0) + 1
            return value(*args) if callable(value) else value

        return f

    m.nvmlInit = count("init")
    m.nvmlShutdown = count("shutdown")
    m.nvmlDeviceGetCount = count("count", 3)
    m.nvmlDeviceGetHandleByIndex = count("handle", lambda i: f"h{i}")
    m.nvmlDeviceGetName = count("name", b"Fake GPU")
    m.nvmlDeviceGetUUID = count("uuid", lambda h: DEVICES[int(h[1:])][1])
    m.nvmlDeviceGetUtilizationRates = count("util", lambda h: Util(10 * int(h[1:]), 0))
    m.nvmlDeviceGetMemoryInfo = count("mem", lambda h: Mem(80 << 30, (1 + int(h[1:])) << 30, 0))
    m.nvmlDeviceGetComputeRunningProcesses = count(
        "procs", lambda h: [Proc(1, 5), Proc(pid, 123 << 20)] if h == "h2" else []
    )
    return m


@pytest.fixture
def nvml(monkeypatch):
    calls: dict = {}
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(calls, os.getpid()))
    monkeypatch.setattr(gpu, "_nvml", gpu._NVML())
    return calls


def test_nvml_is_opened_once_and_read_at_most_every_ttl(nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    clock = [1000.0]
    monkeypatch.setattr(gpu.time, "monotonic", lambda: clock[0])
    first = gpu.gpu_stats()
    assert [g["index"] for g in first] == [1, 2]  # NVML's order; the visible ones only
    assert first[1] == {
        "index": 2,
        "name": "Fake GPU",
        "utilisation": 20,
        "memory_used": 3 << 30,
        "memory_total": 80 << 30,
        "process_memory_used": 123 << 20,
    }
    assert "process_memory_used" not in first[0]  # no context of this process there
    assert gpu.gpu_stats() is first  # within the TTL: the same figures, NVML not asked
    assert nvml["util"] == 2
    clock[0] += gpu.STATS_TTL_S
    assert gpu.gpu_stats() == first
    assert nvml["util"] == 4
    for _ in range(5):
        clock[0] += 1.0
        gpu.gpu_stats()
    assert nvml["init"] == 1 and nvml.get("shutdown", 0) == 0


def test_without_a_driver_there_are_no_figures_and_no_error(monkeypatch):
    m = types.ModuleType("pynvml")

    def no_driver():
        raise OSError("NVML Shared Library Not Found")

    m.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", m)
    monkeypatch.setattr(gpu, "_nvml", gpu._NVML())
    assert gpu.gpu_stats() == []
    assert gpu.gpu_stats() == []


def test_the_real_nvml_where_there_is_one():
    stats = gpu.gpu_stats()  # [] without nvidia-ml-py or a driver
    for g in stats:
        assert set(g) >= {"index", "name", "utilisation", "memory_used", "memory_total"}
        assert 0 <= g["utilisation"] <= 100 and 0 < g["memory_used"] <= g["memory_total"]


def test_gpu_executor_opens_nvml_at_start(nvml, monkeypatch):
    monkeypatch.setattr(gpu, "cuda_device_count", lambda: 0)
    try:
        gpu.set_executor_class("gpu")
        assert nvml["init"] == 1  # at start, not in the first ping
        assert current_device() == "cpu"
    finally:
        gpu.set_executor_class("cpu")


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_strings(device):
    try:
        set_device(device)
        assert current_device() == device
    finally:
        set_device("cpu")


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cuda:01", "CUDA", None, "mps"])
def test_bad_device_strings(device):
    with pytest.raises(FlowValueError, match="device must be one of"):
        set_device(device)
    assert current_device() == "cpu"


@pytest.mark.parametrize(
    "spec, want",
    [
        ("3,5", ["3", "5", "3"]),
        ("GPU-aaaa,GPU-bbbb", ["GPU-aaaa", "GPU-bbbb", "GPU-aaaa"]),
        ("7", [None] * 3),
        ("", [None] * 3),
    ],
)
def test_gpu_executors_take_the_visible_gpus_in_turn(monkeypatch, spec, want):
    from executors.worker.gpu import gpu_for_executor

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    assert [gpu_for_executor(k) for k in range(3)] == want
