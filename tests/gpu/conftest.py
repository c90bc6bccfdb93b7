"""Fixtures for the GPU tests: tests marked ``gpu`` need CUDA and skip, with the reason,
where torch sees no GPU (CI's machines). The rest of this package runs everywhere.

Whether there is a GPU is asked in a child process: the test process itself must never
initialise CUDA (one test checks that the user's process, like the gateway, has not).

* ``cuda`` (session): the number of CUDA devices torch sees (skips the test where 0).
* ``gpu_cluster`` (session): a LocalCluster with 2 CPU executors and 1 gpu executor; its
  directory (logs) is kept under ``$FLOWSERVE_GPU_TEST_DIR`` where that is set
  (scripts/gpu-check.sh bundles them), else a temporary one.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

os.environ.setdefault("FLOWSERVE_QUIET", "1")

_PROBE = (
    "import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; "
    "print(n, torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if n else '-', sep='|')"
)


@functools.cache
def cuda_probe() -> tuple[int, str]:
    """(CUDA devices torch sees, why there are none or what they are), asked in a child."""
    try:
        import torch
    except ImportError:
        return 0, "torch is not installed"
    if torch.version.cuda is None:
        return 0, f"torch {torch.__version__} is a CPU-only build"
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return 0, f"asking torch for CUDA devices failed: {r.stderr.strip()[-300:]}"
    n, version, cuda, name = r.stdout.strip().split("|")
    if int(n) == 0:
        return 0, f"torch {version} (CUDA {cuda}) sees no GPU: torch.cuda.is_available() is False"
    return int(n), f"{n} x {name}, torch {version}, CUDA {cuda}"


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    n, why = cuda_probe()
    if n == 0:
        skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {why}")
        for item in marked:
            item.add_marker(skip)


def pytest_report_header(config):
    n, why = cuda_probe()
    return f"gpu: {why}" if n else f"gpu: none ({why}); tests marked gpu skip"


@pytest.fixture(scope="session")
def cuda() -> int:
    n, why = cuda_probe()
    if n == 0:
        pytest.skip(f"needs a CUDA GPU: {why}")
    return n


@pytest.fixture(scope="session")
def gpu_cluster(cuda):
    from executors.hosts.cluster import LocalCluster
    from executors.hosts.cluster_config import ClusterConfig

    keep = os.environ.get("FLOWSERVE_GPU_TEST_DIR")
    where = {"dir": os.path.join(keep, "gpu-cluster")} if keep else {}
    c = LocalCluster(ClusterConfig(executors=2, gpu_executors=1, threads=4, request_timeout_s=60, **where)).start()
    yield c
    c.stop()
