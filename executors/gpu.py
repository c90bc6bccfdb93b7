"""GPU executors: where operator code should put its models, and what the GPUs are doing.

A gpu-class executor runs its stages' models on CUDA when torch sees a GPU; on a machine
without one it logs a warning once and everything runs on the CPU, unchanged. GPU
utilisation and memory come from NVML (the ``nvidia-ml-py`` package, extra ``gpu``) and
are absent, not an error, where there is no NVML.

    class Net:
        def __init__(self):
            self.model = build().to(flow.current_device())   # set here, read in flow.context
"""

from __future__ import annotations

import logging
from functools import lru_cache

from flow import context
from flow.context import set_device

log = logging.getLogger("flowserve.gpu")


def set_executor_class(device: str) -> None:
    """Executors call this at start with their class ("cpu" or "gpu"): operator code then
    finds its device in ``flow.current_device()``."""
    context.set_executor_class(device)
    if device == "gpu" and cuda_device_count() == 0:
        log.warning("gpu executor without a usable GPU (no CUDA device visible to torch): its stages run on the CPU")
    set_device("cuda" if device == "gpu" and cuda_device_count() > 0 else "cpu")


@lru_cache(maxsize=1)
def cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver must not take the executor down
        return 0


def gpu_stats() -> list[dict]:
    """Per GPU: index, name, utilisation (%) and memory (bytes), from NVML; [] without it."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: the normal case on a CPU machine
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            out.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "utilisation": int(util.gpu),
                    "memory_used": int(mem.used),
                    "memory_total": int(mem.total),
                }
            )
        return out
    finally:
        pynvml.nvmlShutdown()
