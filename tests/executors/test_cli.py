"""The flowserve CLI end to end: up, deploy a script, invoke, status, down."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest


def flowserve(*args, home, check=True):
    r = subprocess.run([sys.executable, "-m", "executors.cli", "--dir", str(home), *args],
                       capture_output=True, text=True, timeout=120, env={"FLOWSERVE_QUIET": "1", **__import__("os").environ})
    if check and r.returncode != 0:
        raise AssertionError(f"flowserve {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture
def home(tmp_path):
    d = tmp_path / "cluster"
    yield d
    if (d / "cluster.json").exists():
        flowserve("down", home=d, check=False)


def test_up_deploy_invoke_status_down(home, tmp_path):
    up = flowserve("up", "--port", "0", "--executors", "2", home=home)
    assert "cluster up at http://127.0.0.1:" in up.stdout
    again = flowserve("up", "--port", "0", home=home)
    assert "already running" in again.stdout

    script = tmp_path / "myflow.py"
    script.write_text(textwrap.dedent("""
        from flow import Flow

        def triple(row):
            return row.x * 3

        flow = Flow("tripler", schema={"x": int})
        flow.map(triple, names=["y"])
    """))
    deployed = flowserve("deploy", str(script), home=home)
    assert "deployed tripler at http://127.0.0.1:" in deployed.stdout

    out = flowserve("invoke", "tripler", "--json", '[{"x": 2}, {"x": 5}]', home=home)
    assert [r["y"] for r in json.loads(out.stdout)["rows"]] == [6, 15]

    bad = flowserve("invoke", "tripler", "--json", '{"x": "no"}', home=home, check=False)
    assert bad.returncode == 1 and "'x'" in bad.stdout

    status = flowserve("status", home=home)
    # versions are unique across KVS restarts (floored at the server clock in ms: README)
    assert re.search(r"flow tripler \(v\d+\)", status.stdout) and "triple" in status.stdout
    assert "2 executors alive" in status.stdout
    as_json = json.loads(flowserve("status", "--json", home=home).stdout)
    assert as_json["flows"][0]["name"] == "tripler"

    down = flowserve("down", home=home)
    assert "cluster stopped" in down.stdout
    assert not (home / "cluster.json").exists()


def test_helpful_errors(home, tmp_path):
    r = flowserve("status", home=home, check=False)
    assert r.returncode == 1 and "flowserve up" in r.stderr
    r = subprocess.run([sys.executable, "-m", "executors.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "deploy" in r.stdout and "status" in r.stdout
    r = subprocess.run([sys.executable, "-m", "executors.cli", "bogus"], capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice" in r.stderr
