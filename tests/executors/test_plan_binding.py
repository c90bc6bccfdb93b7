"""A plan's signature is bound to its flow and version (the key it is stored under).

Anyone with the store's password can copy bytes between keys. A flow's plan key holding
another flow's signed plan, or an older version of its own, must be refused wherever it
is read -- by an executor that restarts and rebuilds, by a gateway that loads the flow --
while the flow goes on being served, by the processes that hold its real plan, with its
own semantics. And a gateway never goes back to a version older than one it has served,
whatever the registry says.

Real processes throughout: a LocalCluster (its supervisor restarts a killed executor), or
standalone gateways and executors over the session's Redis server.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from executors.hosts.cluster import ClusterClient, LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from executors.plans import DEPLOYED_KEY, KEY_ENV, PLAN_KEY
from flow import Flow
from kvs import KVS
from tests.executors.processes import ADMIN, Procs, health, wait_until
from tests.executors.test_runtime_paths import _executor_pids

REFUSED = "signature does not match this key: a plan copied from another flow or version?"


def flows(a_name: str, b_name: str) -> tuple[Flow, Flow, Flow]:
    """A v1, A v2 and B: one map stage each, of the same name, so that a plan copied from
    one to another would build (and answer wrongly) if it were accepted."""
    a1, a2, b = Flow(a_name), Flow(a_name), Flow(b_name)
    a1.map(lambda r: r.x - 1, names=["y"])
    a2.map(lambda r: r.x + 1, names=["y"])
    b.map(lambda r: r.x * 3, names=["y"])
    return a1, a2, b


def executor_pid(c: LocalCluster, id_: str) -> int | None:
    """The pid of the cluster's executor ``id_`` now (it changes when it is restarted)."""
    for pid in _executor_pids(c):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--id" in args and args[args.index(b"--id") + 1] == id_.encode():
            return pid
    return None


def logged(paths, *needles: str) -> bool:
    """Whether one line of one of the logs ``paths`` holds every needle."""
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            if all(n in line for n in needles):
                return True
    return False


class Stream:
    """Clients posting a stream of requests to a flow until stopped; each answer is kept
    to be compared with ``flow.run`` afterwards, each failure counted as lost."""

    def __init__(self, url: str, clients: int):
        self.url = url
        self.answers: dict[int, object] = {}
        self.lost: list = []
        self._xs = itertools.count()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Stream:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _client(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self._stop.is_set():
                with self._cond:
                    x = next(self._xs)
                try:
                    r = http.post(self.url, json={"x": x})
                    ok = r.status_code == 200
                    outcome = r.json()["rows"][0]["y"] if ok else (r.status_code, r.text[:200])
                except (httpx.HTTPError, ValueError, KeyError, IndexError) as e:
                    ok, outcome = False, repr(e)
                with self._cond:
                    if ok:
                        self.answers[x] = outcome
                    else:
                        self.lost.append((x, outcome))
                    self._cond.notify_all()

    def count(self) -> int:
        with self._cond:
            return len(self.answers) + len(self.lost)

    def wait_for(self, n: int, timeout: float = 60) -> None:
        """Block until ``n`` requests in all have their outcome."""
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.answers) + len(self.lost) >= n, timeout), (
                f"the stream to {self.url} stalled at {len(self.answers) + len(self.lost)} requests"
            )

    def wrong(self, flow: Flow) -> list:
        """(x, answer, what flow.run says) for every answer that is not the flow's."""
        xs = sorted(self.answers)
        want = flow.run([{"x": x} for x in xs])["y"].tolist() if xs else []
        return [(x, self.answers[x], w) for x, w in zip(xs, want) if self.answers[x] != w]


def test_a_plan_copied_over_a_flows_key_is_refused_on_restart_and_the_flow_keeps_serving(capsys):
    config = ClusterConfig(executors=2, threads=4, request_timeout_s=20, max_retries=3)
    with LocalCluster(config) as c:
        a1, a2, b = flows("bound-a", "bound-b")
        v1 = c.deploy(a1).version
        da = c.deploy(a2)
        db = c.deploy(b)
        v2, vb = da.version, db.version
        assert v1 < v2
        stages = {f.name: [s["name"] for s in httpx.get(f"{c.url}/flows/{f.name}").json()["stages"]] for f in (a2, b)}
        assert stages[a2.name] == stages[b.name], stages  # a copied plan would build: the test can fail
        key_a1, key_a2 = PLAN_KEY.format(flow=a2.name, version=v1), PLAN_KEY.format(flow=a2.name, version=v2)
        key_b = PLAN_KEY.format(flow=b.name, version=vb)
        raw = KVS.from_url(c.state["kvs_url"])  # an attacker's view: the password, not the cluster key
        logs = c.dir / "logs"
        genuine = c.kvs.get_bytes(key_a2)

        def crashed() -> int:
            return httpx.get(f"{c.url}/healthz").json().get("crashed", {}).get("cpu0", 0)

        def swap_and_kill(source: str) -> None:
            """Copy ``source``'s signed plan over A's current key, then kill -9 the executor
            cpu0 so that it restarts and builds A again from the store."""
            before, pid = crashed(), executor_pid(c, "cpu0")
            assert pid is not None
            raw.redis.set(key_a2, raw.get_bytes(source))
            os.kill(pid, signal.SIGKILL)
            wait_until("the gateway to see cpu0 die", lambda: crashed() > before, timeout=30)
            # back once its flows were built again (B), or refused (A: kept out of A's routing)
            wait_until("cpu0 to be back", lambda: httpx.get(f"{c.url}/healthz").json()["executors"] == 2, timeout=60)

        def refused(source: str) -> bool:
            return logged(logs.glob("*.log"), "ERROR", repr(key_a2), REFUSED, repr(source))

        try:
            with Stream(da.url, clients=3) as sa, Stream(db.url, clients=1) as sb:
                sa.wait_for(30)
                swap_and_kill(key_b)  # another flow's plan over A's
                sa.wait_for(sa.count() + 150)  # enough that the restarted cpu0 would take some
                swap_and_kill(key_a1)  # A's own older version over its current one
                sa.wait_for(sa.count() + 150)
                sb.wait_for(sb.count() + 20)
        finally:
            raw.close()
        wrong_a, wrong_b = sa.wrong(a2), sb.wrong(b)
        with capsys.disabled():
            print(
                f"\nswap+kill x2, flow A: {sa.count()} requests, {len(sa.answers) - len(wrong_a)} answered right, "
                f"{len(sa.lost)} lost, {len(wrong_a)} wrong; flow B: {sb.count()} requests, "
                f"{len(sb.lost)} lost, {len(wrong_b)} wrong"
            )
        assert not sa.lost and not sb.lost, (sa.lost[:3], sb.lost[:3])
        assert not wrong_a and not wrong_b, (wrong_a[:3], wrong_b[:3])
        assert httpx.get(f"{c.url}/flows/{a2.name}").json()["version"] == v2
        # and each refusal was logged as such, naming the key and where the plan came from
        wait_until("cpu0 to log that it refused B's plan as A's", lambda: refused(key_b))
        wait_until("cpu0 to log that it refused A v1's plan as v2's", lambda: refused(key_a1))
        # the gateway wrote A's genuine plan back: cpu0 builds A again and serves it
        wait_until("A's own plan written back", lambda: c.kvs.get_bytes(key_a2) == genuine, timeout=30)
        assert "writing it back" in (c.dir / "cluster.log").read_text()

        # cpu0 builds A again from it and answers A's requests (their trace names it)
        def served_by_cpu0() -> bool:
            with httpx.Client(timeout=30) as http, Stream(db.url, clients=2):  # keep cpu1 busy too
                for x in range(50):
                    r = http.post(da.url, json={"x": x})
                    assert r.status_code == 200 and r.json()["rows"][0]["y"] == x + 1, r.text
                    if "cpu0" in r.headers["x-flowserve-trace"]:
                        return True
            return False

        wait_until("cpu0 to serve A again", served_by_cpu0, timeout=60)


@pytest.fixture
def signed_procs(redis_server, tmp_path):
    with KVS.from_url(redis_server.url) as store:
        store.redis.flushall()
    key = os.urandom(32).hex()
    p = Procs(redis_server.url, tmp_path, env={KEY_ENV: key})  # every process gets the cluster key
    yield p, key
    p.stop()


def post(url: str, name: str, x: int) -> httpx.Response:
    return httpx.post(f"{url}/flows/{name}", json={"x": x}, timeout=30)


def test_gateways_refuse_a_copied_plan_and_a_registry_rolled_back(signed_procs, tmp_path):
    procs, key = signed_procs
    procs.executor("e0")
    procs.executor("e1")
    gw_a = procs.gateway("gw-a")
    wait_until("gw-a to find both executors", lambda: health(gw_a).get("executors") == 2)
    a1, a2, b = flows("roll-a", "roll-b")
    client = ClusterClient(gw_a, procs.redis_url, ADMIN, cluster_key=key)
    raw = KVS.from_url(procs.redis_url)
    try:
        v1, v2, vb = client.deploy(a1).version, client.deploy(a2).version, client.deploy(b).version
        key_a2 = PLAN_KEY.format(flow=a2.name, version=v2)
        genuine = raw.get_bytes(key_a2)

        # a gateway that starts while A's key holds B's plan does not serve A with it
        raw.redis.set(key_a2, raw.get_bytes(PLAN_KEY.format(flow=b.name, version=vb)))
        gw_b = procs.gateway("gw-b")
        wait_until("gw-b to serve B", lambda: b.name in health(gw_b).get("flows", []))

        def refused_copy() -> bool:
            return logged([tmp_path / "gw-b.log"], "ERROR", repr(key_a2), REFUSED)

        wait_until("gw-b to refuse A's plan, or serve it", lambda: refused_copy() or a2.name in health(gw_b)["flows"])
        assert post(gw_b, a2.name, 5).status_code == 404  # not served there, rather than B's code under A's name
        assert refused_copy()
        assert post(gw_a, a2.name, 5).json()["rows"][0]["y"] == 6  # gw-a serves A v2, built before the swap
        raw.redis.set(key_a2, genuine)  # the right plan back: gw-b serves A v2 too (its next try)
        wait_until("gw-b to serve A", lambda: a2.name in health(gw_b).get("flows", []), timeout=30)
        assert post(gw_b, a2.name, 5).json()["rows"][0]["y"] == 6

        # the registry pointed back at v1, whose plan is genuinely signed for its key: both
        # gateways served v2, and neither goes back to v1
        raw.redis.hdel(DEPLOYED_KEY, a2.name)
        for gw in (gw_a, gw_b):
            wait_until(f"{gw} to drop A", lambda gw=gw: a2.name not in health(gw).get("flows", []))
        raw.redis.hset(DEPLOYED_KEY, a2.name, str(v1))
        for name, gw in (("gw-a", gw_a), ("gw-b", gw_b)):

            def refused_rollback(name=name) -> bool:
                return logged([tmp_path / f"{name}.log"], "ERROR", f"refusing to load v{v1}, older than v{v2}")

            wait_until(
                f"{name} to refuse v{v1}, or serve it",
                lambda gw=gw, r=refused_rollback: r() or a2.name in health(gw)["flows"],
            )
            assert post(gw, a2.name, 5).status_code == 404  # never v1's answer (4)
            assert refused_rollback()
    finally:
        raw.close()
        client.close()
