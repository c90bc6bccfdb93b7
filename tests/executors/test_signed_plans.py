"""Plans are authenticated: what executors and gateways unpickle from the KVS is signed
with a cluster key that is never stored there. A crafted plan written into the store (by
anyone holding the KVS password) is refused and logged, runs nothing, and the cluster
keeps serving."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from executors.plans import PLAN_KEY
from kvs import KVS, SerializationError
from kvs.serialization import dumps_trusted
from tests.executors.processes import wait_until
from tests.executors.test_runtime_paths import _executor_pids

KEY = bytes(range(32))


class Payload:
    """Unpickling this runs code: what an attacker would store as a plan."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_signed_values_round_trip_and_forgeries_are_refused(kvs, redis_url):
    signed = KVS.from_url(redis_url, signing_key=KEY)
    signed.put_trusted("plan", {"a": 1})
    assert signed.get("plan", trusted=True) == {"a": 1}
    good = signed.get_bytes("plan")
    with pytest.raises(SerializationError, match="only with trusted=True"):
        signed.get("plan")
    tampered = good[:-1] + bytes([good[-1] ^ 1])
    kvs.redis.set("plan", tampered)
    with pytest.raises(SerializationError, match="signature does not match"):
        signed.get("plan", trusted=True)
    kvs.redis.set("plan", dumps_trusted({"a": 2}))  # unsigned, as anyone with the password could write
    with pytest.raises(SerializationError, match="unsigned pickle"):
        signed.get("plan", trusted=True)
    other = KVS.from_url(redis_url, signing_key=bytes(32))
    kvs.redis.set("plan", good)
    with pytest.raises(SerializationError, match="signature does not match"):
        other.get("plan", trusted=True)
    with pytest.raises(SerializationError, match="no cluster key"):
        kvs.get("plan", trusted=True)  # a signed value needs the key to be read at all
    signed.close()
    other.close()


def test_a_crafted_plan_in_the_store_runs_nothing(tmp_path):
    pwned = tmp_path / "pwned"
    with LocalCluster(ClusterConfig(executors=2)) as c:
        from flow import Flow

        f = Flow("signed")
        f.map(lambda r: r.x + 1, names=["y"])
        d = c.deploy(f)
        version = d.cluster.http.get(f"/flows/{f.name}").json()["version"]
        assert httpx.post(d.url, json={"x": 1}).json()["rows"][0]["y"] == 2
        # an attacker with the KVS password replaces the served plan with a crafted pickle
        raw = KVS.from_url(c.state["kvs_url"])
        raw.redis.set(PLAN_KEY.format(flow=f.name, version=version), dumps_trusted(Payload(str(pwned))))
        raw.close()
        # a restarted executor reads the plan again from the store
        os.kill(_executor_pids(c)[0], signal.SIGKILL)
        logs = c.dir / "logs"
        wait_until(
            "the restarted executor to refuse the plan",
            lambda: any("unsigned pickle" in p.read_text(errors="replace") for p in logs.glob("*.log")),
            timeout=60,
        )
        assert not pwned.exists(), "the crafted plan ran"
        for x in range(20):  # the cluster keeps serving the flow it deployed
            assert httpx.post(d.url, json={"x": x}, timeout=30).json()["rows"][0]["y"] == x + 1
        assert not pwned.exists()
