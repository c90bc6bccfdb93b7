"""Examples on a cluster they share with their user (`flowserve up` running): they deploy
under names of their own, undeploy only those, never stop the cluster; a model key that
holds something else than the example's model is refused naming the key, and a model
constructor that fails on what a key held fails the deploy naming the operator and the key."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from executors.errors import ClusterNotOwnedError, DeployError
from executors.hosts.cluster import LocalCluster
from flow import Flow
from flow.errors import FlowValueError
from flowserve.cli import main

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, home) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--dir", str(home), *args]) == 0, out.getvalue()
    return out.getvalue()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A `flowserve up` cluster in a FLOWSERVE_HOME of its own."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLOWSERVE_QUIET", "1")
        mp.syspath_prepend(str(ROOT / "examples"))  # the examples' own modules (models, sharing)
        cli("up", "--port", "0", "--executors", "1", home=home)
        yield home
        with contextlib.suppress(Exception):
            cli("down", home=home)


def versions(cluster) -> dict[str, int]:
    return {f["name"]: f["version"] for f in cluster.request("GET", "/flows", "listing").json()["flows"]}


def test_an_example_run_beside_flowserve_up_leaves_the_cluster_and_its_flows_alone(home, monkeypatch):
    monkeypatch.setenv("FLOWSERVE_EXAMPLE_SMALL", "1")
    cli("deploy", str(ROOT / "examples" / "recommender.py"), home=home)  # the user's deploy of the example
    cluster = LocalCluster.connect(home)
    before = versions(cluster)
    env = dict(os.environ, FLOWSERVE_HOME=str(home), FLOWSERVE_EXAMPLE_SMALL="1")
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "recommender.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "deploys its own as 'recommender-2'" in r.stdout and "over HTTP" in r.stdout
    assert versions(cluster) == before  # still served, the same version; the example's own is gone
    cluster.close()


def test_stop_refuses_a_cluster_this_process_did_not_start(home):
    cluster = LocalCluster.connect(home)
    with pytest.raises(ClusterNotOwnedError, match=r"this process did not start it .*`flowserve down` stops it"):
        cluster.stop()
    cluster.release()  # lets go of it: no more than that
    with cluster as again:  # a with-block on a connected cluster leaves it running too
        assert again.request("GET", "/healthz", "health").status_code == 200
    assert LocalCluster.connect(home).request("GET", "/healthz", "health").status_code == 200


def test_a_model_key_holding_something_else_is_refused_naming_the_key(home):
    from models import ensure_models

    cluster = LocalCluster.connect(home)
    cluster.kvs.put("models/small", np.zeros(3))  # the README's `flowserve kvs put models/small weights.npy`
    try:
        with pytest.raises(FlowValueError, match=r"the store's key 'models/small' holds an array float64 \(3,\)"):
            ensure_models(cluster.kvs, names=("small",))
        assert cluster.kvs.get("models/small").shape == (3,)  # never overwritten
    finally:
        cluster.close()


def test_a_constructor_that_fails_on_a_keys_content_fails_the_deploy_naming_operator_and_key(home):
    from models import SmallNet

    cluster = LocalCluster.connect(home)
    cluster.kvs.put("models/small", np.zeros(3))
    flow = Flow("wrong-weights", schema={"img": int})
    flow.map(SmallNet, names=["cls", "conf"], batching=True)
    try:
        with pytest.raises(DeployError) as e:
            cluster.deploy(flow)
        message = str(e.value)
        assert "operator 'SmallNet': building it failed: UnpicklingError" in message
        assert "(it read from the store: 'models/small' (an array float64 (3,)))" in message
    finally:
        cluster.kvs.delete("models/small")
        cluster.close()
