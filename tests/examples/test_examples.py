"""Every example runs end to end (embedded cluster, HTTP, clean-up), so none can rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# the examples are the scripts that define flows(); the others are their helpers (models, sharing)
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py") if "\ndef flows(" in p.read_text())


@pytest.mark.parametrize("script", EXAMPLES)
def test_example_runs(script, tmp_path):
    # TMPDIR: the embedded cluster's directory (and so its processes' command lines) is ours
    env = dict(os.environ, FLOWSERVE_HOME=str(tmp_path), FLOWSERVE_EXAMPLE_SMALL="1", TMPDIR=str(tmp_path))
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "over HTTP" in r.stdout
    assert not _processes_under(tmp_path), "the example left a cluster running"


def _processes_under(path: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-f", f"executors.(daemon|executor).*{path}"], capture_output=True, text=True).stdout
    return out.split()


def test_training_says_how_far_it_is_and_runs_once(tmp_path):
    """The examples train their models at first use (up to a minute on 2 cores): a line
    an epoch, so the run is never silent; the next run takes them from the disk cache."""
    env = dict(os.environ, FLOWSERVE_MODEL_CACHE=str(tmp_path))
    code = "import models; models.trained(16, epochs=2)"

    def run() -> str:
        r = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT / "examples", env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout

    first = run()
    assert "training a 16-unit MLP on the digits for 2 epochs" in first
    assert "epoch 1/2: loss" in first and "epoch 2/2: loss" in first
    assert run() == ""  # cached: nothing to train, nothing to say
