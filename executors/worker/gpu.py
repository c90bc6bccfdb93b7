"""GPU executors: where operator code should put its models, and what the GPUs are doing.

A gpu-class executor runs its stages' models on CUDA when torch sees a GPU; on a machine
without one it logs a warning once and everything runs on the CPU, unchanged. GPU
utilisation and memory come from NVML (the ``nvidia-ml-py`` package, extra ``gpu``) and
are absent, not an error, where there is no NVML.

    class Net:
        def __init__(self):
            self.model = build().to(flow.current_device())   # set here, read in flow.context

        def __call__(self, table):                         # batching: a whole Table
            x = table.tensor("img").to(flow.current_device())
            return self.model(x)                           # stays on the GPU for the next stage here

CUDA is initialised only in gpu executor processes, each started (``exec``, not a fork)
by the cluster after its gateway: nothing here runs at import, and neither the gateway nor
the user's process ever calls into CUDA for the runtime. NVML is opened once per process
(opening it takes milliseconds; the executor answers a liveness ping every second on its
IO thread) and its figures are read at most every ``STATS_TTL_S``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from functools import lru_cache

from flow import context
from flow.context import set_device

log = logging.getLogger("flowserve.gpu")

STATS_TTL_S = 0.5  # a ping within this long of the last one gets the same figures


def set_executor_class(device: str) -> None:
    """Executors call this at start with their class ("cpu" or "gpu"): operator code then
    finds its device in ``flow.current_device()``. A gpu executor also opens NVML here, so
    its first ping costs what the others do."""
    context.set_executor_class(device)
    usable = device == "gpu" and cuda_device_count() > 0
    if device == "gpu" and not usable:
        log.warning("gpu executor without a usable GPU (no CUDA device visible to torch): its stages run on the CPU")
    set_device("cuda" if usable else "cpu")
    if device == "gpu":
        _nvml.handles()


@lru_cache(maxsize=1)
def cuda_device_count() -> int:
    """CUDA devices torch can use in this process (0 without torch, a GPU or a driver).
    It initialises the CUDA driver: only gpu executors call it."""
    try:
        import torch
    except ImportError:
        return 0
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver must not take the executor down
        return 0


def visible(devices: list[tuple[int, str]], spec: str | None) -> list[tuple[int, str]]:
    """The (NVML index, UUID) pairs that ``CUDA_VISIBLE_DEVICES=spec`` lets this process use,
    in its order. Entries are indices or UUIDs (or their prefixes, as CUDA takes them);
    CUDA stops at the first entry that names no device (so "" is none); None (unset): all.
    Indices are NVML's (PCI bus order), which is CUDA's with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    and on machines of one GPU model."""
    if spec is None:
        return list(devices)
    out = []
    for entry in (e.strip() for e in spec.split(",")):
        if entry.isdigit():
            found = [d for d in devices if d[0] == int(entry)]
        elif entry.startswith(("GPU-", "MIG-")):
            found = [d for d in devices if d[1].startswith(entry)]
        else:
            found = []
        if len(found) != 1 or found[0] in out:
            break
        out.append(found[0])
    return out


class _NVML:
    """NVML, opened once per process (lazily; never shut down: the process's exit does),
    and the last figures read, kept for ``STATS_TTL_S``."""

    def __init__(self):
        self._lock = threading.Lock()
        self._handles: list | None = None  # [(index, handle, name)]; [] where there is no NVML
        self._stats: list[dict] = []
        self._read_at = float("-inf")

    def handles(self) -> list:
        if self._handles is None:
            with self._lock:
                if self._handles is None:
                    self._handles = self._open()
        return self._handles

    def _open(self) -> list:
        try:
            import pynvml
        except ImportError:
            return []
        try:
            pynvml.nvmlInit()
        except Exception:  # no driver: the normal case on a CPU machine
            return []
        try:
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                found.append((i, h, _text(pynvml.nvmlDeviceGetName(h)), _text(pynvml.nvmlDeviceGetUUID(h))))
            keep = {d for d in visible([(i, u) for i, _, _, u in found], os.environ.get("CUDA_VISIBLE_DEVICES"))}
            return [(i, h, name) for i, h, name, u in found if (i, u) in keep]
        except Exception as e:  # a driver's own error types: GPU figures are optional, serving is not
            log.warning("NVML is there but listing the GPUs failed (%s): no GPU figures", e)
            return []

    def stats(self) -> list[dict]:
        now = time.monotonic()
        if now - self._read_at < STATS_TTL_S:
            return self._stats
        handles = self.handles()
        if not handles:
            return []
        import pynvml

        pid = os.getpid()
        out = []
        for i, h, name in handles:
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(h)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            except Exception:  # a GPU that fell off the bus: report the others
                continue
            entry = {
                "index": i,
                "name": name,
                "utilisation": int(util.gpu),
                "memory_used": int(mem.used),
                "memory_total": int(mem.total),
            }
            mine = _process_memory(pynvml, h, pid)
            if mine is not None:
                entry["process_memory_used"] = mine
            out.append(entry)
        self._stats, self._read_at = out, now
        return out


def _process_memory(pynvml, handle, pid: int) -> int | None:
    """GPU memory this process holds on ``handle`` (None if NVML cannot say: another PID
    namespace, or no context here yet)."""
    try:
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # NVML's errors for what it cannot see (another PID namespace): unknown, not fatal
        return None
    for p in procs:
        if p.pid == pid and p.usedGpuMemory is not None:
            return int(p.usedGpuMemory)
    return None


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


_nvml = _NVML()


def gpu_stats() -> list[dict]:
    """Per GPU this process may use: index, name, utilisation (%), memory used and total
    (bytes), and ``process_memory_used`` where NVML knows this process's share; [] without
    NVML. Cheap to call often: NVML stays open and figures are re-read every STATS_TTL_S."""
    return _nvml.stats()


def gpu_for_executor(k: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for the ``k``-th GPU executor of a machine with several GPUs:
    one each, in turn, so executors do not all crowd the first GPU; None (leave it as it
    is) on a machine of one GPU or none. The GPUs are those ``CUDA_VISIBLE_DEVICES`` names,
    else the driver's (``/proc/driver/nvidia/gpus``): the supervisor that asks loads no
    NVIDIA library (NVML maps the CUDA driver library into the process)."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is not None:
        gpus = [e.strip() for e in spec.split(",") if e.strip()]
    else:
        try:
            gpus = [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
        except OSError:  # no NVIDIA driver
            gpus = []
    return gpus[k % len(gpus)] if len(gpus) >= 2 else None
