"""A canary is the cluster's, not one gateway's (executors/gateway/rollouts.py): every
gateway serves the candidate the store records, whichever gateway started, promoted or
rolled it back, and a gateway that restarts serves it again. Real processes: standalone
gateways and executors over the session's Redis (the Kubernetes shape), and a local cluster
whose gateway process is killed."""

from __future__ import annotations

import collections
import os
import signal

import httpx

from executors.gateway.rollouts import SPLIT_BLOCK
from executors.hosts.cluster import ClusterClient, LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow
from tests.executors.conftest import unique
from tests.executors.processes import ADMIN, health, wait_until


def adder(name: str, k: int) -> Flow:
    f = Flow(name, schema={"x": int})
    f.map(lambda row, k=k: row.x + k, names=["y"])
    return f


def versions(url: str, name: str, n: int) -> collections.Counter:
    """Which k answered each of ``n`` requests; "retry" counts 503 UnavailableError, which a
    gateway answers (the request not run) in the moment between another gateway's promote
    or rollback releasing the version it routed to and its own read of the change."""
    seen: collections.Counter = collections.Counter()
    with httpx.Client(timeout=30) as http:
        for x in range(n):
            r = http.post(f"{url}/flows/{name}", json={"x": x})
            if r.status_code == 503 and r.json()["error"] == "UnavailableError":
                seen["retry"] += 1
                continue
            assert r.status_code == 200, (url, r.status_code, r.text)
            seen[r.json()["rows"][0]["y"] - x] += 1
    return seen


def candidate(url: str, name: str) -> int | None:
    doc = httpx.get(f"{url}/flows/{name}", timeout=10).json()
    return (doc.get("rollout") or {}).get("candidate", {}).get("version")


def test_every_gateway_serves_the_canary_and_follows_its_promotion_and_rollback(procs):
    procs.executor("e0")
    procs.executor("e1")
    a, b = procs.gateway("gw-a"), procs.gateway("gw-b")
    for url in (a, b):
        wait_until(f"{url} to find both executors", lambda url=url: health(url).get("executors") == 2)
    name = unique("spread")
    ca, cb = ClusterClient(a, procs.redis_url, ADMIN), ClusterClient(b, procs.redis_url, ADMIN)
    try:
        d1 = ca.deploy(adder(name, 1))
        c2 = ca.deploy(adder(name, 2), canary=0.5)  # started on a
        wait_until("gateway b to serve the canary", lambda: candidate(b, name) == c2.version)
        assert versions(b, name, SPLIT_BLOCK) == {1: 500, 2: 500}  # b holds the share too
        assert cb.promote(name)["promoted"] == {"version": c2.version, "replaced": d1.version}  # promoted on b
        wait_until("gateway a to serve the promoted version", lambda: versions(a, name, 20) == {2: 20})
        assert candidate(a, name) is None

        c3 = cb.deploy(adder(name, 3), canary=0.5)  # started on b
        wait_until("gateway a to serve the new canary", lambda: candidate(a, name) == c3.version)
        back = ca.rollback(name)["rolled_back"]  # rolled back on a
        assert back["plan_of"] == c2.version and back["dropped"] == c3.version
        wait_until("gateway b to drop the canary", lambda: candidate(b, name) is None)
        wait_until("gateway b to serve the rollback", lambda: versions(b, name, 20) == {2: 20})
        assert versions(a, name, 50) == {2: 50}
        for url in (a, b):
            assert httpx.get(f"{url}/flows/{name}").json()["version"] == back["version"]
    finally:
        ca.close()
        cb.close()


def restarted(url: str, pid: int) -> bool:
    """A gateway process other than ``pid`` answers, ready."""
    if health(url).get("gateway", {}).get("pid") in (None, pid):
        return False
    try:
        return httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_restarted_gateway_serves_the_canary_again():
    with LocalCluster(ClusterConfig(executors=1)) as c:
        name = unique("restart")
        c.deploy(adder(name, 1))
        canary = c.deploy(adder(name, 2), canary=0.25)
        pid = httpx.get(f"{c.url}/healthz").json()["gateway"]["pid"]
        os.kill(pid, signal.SIGKILL)
        wait_until("a new gateway process to be ready", lambda: restarted(c.url, pid), timeout=60)
        wait_until("the canary to be served again", lambda: candidate(c.url, name) == canary.version)
        assert versions(c.url, name, SPLIT_BLOCK) == {1: 750, 2: 250}
