"""The probes on real processes (executors/gateway/readiness.py): /livez answers while the
process does; /readyz and /readyz/{flow} are 200 only when every deployed flow has a warm
replica of every stage, and name what is missing: a flow the registry lists that is still
being built here, a stage at zero replicas. The probes need no token; a standalone gateway
(the Kubernetes shape) over executors that register in the session's Redis."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx

from executors.hosts.cluster import _register_by_value
from executors.plans import PLAN_KEY, next_version, register_deployed
from flow import Flow
from kvs import KVS
from optimizer import optimize
from tests.executors.conftest import unique
from tests.executors.processes import health, wait_until

TOKEN = "probe-test-token"


class Gated:
    """A model that loads until its gate file exists (a slow load the test ends)."""

    gate = ""

    def __init__(self):
        deadline = time.monotonic() + 120
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.02)

    def __call__(self, row):
        return row.x + 1


def probe(url: str, path: str) -> tuple[int, dict]:
    r = httpx.get(url + path, timeout=5)  # no token: probes need none
    return r.status_code, r.json()


def register(store: KVS, flow: Flow) -> int:
    """What a deploy through another gateway leaves in the store: the signed plan and its
    registry entry (the gateway under test then loads it on its own)."""
    plan = optimize(flow)
    _register_by_value(plan)
    version = next_version(store.redis, flow.name)
    store.put_trusted(PLAN_KEY.format(flow=flow.name, version=version), plan)
    register_deployed(store.redis, flow.name, version)
    return version


def test_readiness_names_a_flow_mid_deploy_and_a_stage_at_zero_replicas(procs, tmp_path):
    e0 = procs.executor("e0")
    gw = procs.gateway("gw", "--config", json.dumps({"token": TOKEN}))
    wait_until("the gateway to find its executor", lambda: health(gw).get("executors") == 1)
    assert probe(gw, "/livez") == (200, {"live": True})
    assert probe(gw, "/readyz")[0] == 200
    assert httpx.get(gw + "/flows").status_code == 401  # the token is needed elsewhere

    name = unique("gated")
    gate = tmp_path / "gate"
    f = Flow(name, schema={"x": int})
    f.map(type("Model", (Gated,), {"gate": str(gate)}), names=["y"])
    with KVS.from_url(procs.redis_url) as store:
        version = register(store, f)

    # registered, being built here: the gateway is not ready, and says which flow
    status, body = wait_until("the flow to be loading", lambda: (lambda s: s[0] == 503 and s)(probe(gw, "/readyz")))
    assert f"flow {name!r} v{version} is being deployed" in " ".join(body["missing"])
    assert body["flows"][name]["deploying"] == version and body["flows"][name]["ready"] is False
    assert probe(gw, f"/readyz/{name}")[0] == 503
    assert probe(gw, "/livez")[0] == 200  # alive all the same: nothing for a restart to fix

    gate.touch()
    wait_until("the gateway to be ready", lambda: probe(gw, "/readyz")[0] == 200)
    status, body = probe(gw, f"/readyz/{name}")
    assert status == 200 and body["flows"][name] == {"version": version, "ready": True}
    status, body = probe(gw, "/readyz/no-such-flow")
    assert status == 404 and body["error"] == "UnknownFlow"

    # the only executor goes: the stage is left with zero replicas
    e0.send_signal(signal.SIGKILL)
    status, body = wait_until(
        "the stage to have no replica",
        lambda: (lambda s: s[0] == 503 and "zero replicas" in str(s[1]) and s)(probe(gw, f"/readyz/{name}")),
    )
    assert any(f"flow {name!r} v{version} stage" in m and "zero replicas" in m for m in body["missing"])
    procs.executor("e1")  # a new one joins and builds it: ready again
    wait_until("a warm replica again", lambda: probe(gw, "/readyz")[0] == 200)
