"""benchmarks/gpu.py runs anywhere (its GPU parts reported as skipped without a GPU): a
tiny in-process run writes its figures and its plot. In a child process: on a GPU it
initialises CUDA, which this test process must not (test_gpu_executors checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_benchmark_runs_in_process(tmp_path):
    from benchmarks.gpu import BATCHES

    args = ["--no-cluster", "--width", "32", "--seconds", "0.01", "--out", str(tmp_path)]
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks", "gpu", *args], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stderr[-3000:]
    saved = json.loads((tmp_path / "gpu.json").read_text())
    assert (tmp_path / "gpu.png").stat().st_size > 0
    assert saved["width"] == 32 and "cpu_1_thread" in saved["in_process"]
    per_s = saved["in_process"]["cpu_1_thread"]["operator"]["images_per_s"]
    assert set(per_s) == {str(b) for b in BATCHES} and all(v > 0 for v in per_s.values())
    if saved["cuda"]["cuda"]:
        assert "gpu" in saved["in_process"] and not saved["skipped"]
    else:
        assert "gpu" not in saved["in_process"] and "in_process.gpu" in saved["skipped"]
