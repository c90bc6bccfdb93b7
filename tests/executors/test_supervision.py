"""The local cluster's supervision, met as users meet its faults, on real processes: the
gateway process killed (kill -9, SIGSEGV) under load, an executor that cannot start, an
executor that stops answering, executors gone when a deploy comes, and a read-only or a
full cluster directory (a small tmpfs; mounting one needs root, as on the CI machine).

Each load test counts what its clients saw: answered, lost (a connection the killed
gateway held) and wrong (an answer that is not the flow's).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from executors.errors import NoExecutorError
from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow
from flow.errors import RetryableError
from kvs.errors import StoreWriteError
from tests.executors.processes import wait_until
from tests.executors.test_runtime_paths import _executor_pids


def double(row):
    return row.x * 2


def triple(row):
    return row.x * 3


def _deploy(c: LocalCluster, name: str, fn=double):
    f = Flow(name, schema={"x": int})
    f.map(fn, names=["y"])
    return c.deploy(f)


def _health(c: LocalCluster) -> dict:
    return httpx.get(f"{c.url}/healthz", timeout=10).json()


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for child in children.get(p, ()):
            out.add(child)
            todo.append(child)
    return out


class Load:
    """Closed-loop clients calling ``url`` (a doubling flow) until stopped; each answer is
    checked. Connection errors are counted, not raised: a client keeps going."""

    def __init__(self, url: str, clients: int = 4):
        self.url = url
        self.answered = 0
        self.wrong: list = []
        self.lost: list[str] = []  # the error type of each request that got no answer
        self.times: list[float] = []  # when each answer came (monotonic)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(k,)) for k in range(clients)]

    def _client(self, k: int) -> None:
        i = 0
        with httpx.Client(timeout=60) as http:
            while not self._stop.is_set():
                x = k * 1_000_000 + i
                i += 1
                try:
                    r = http.post(self.url, json={"x": x})
                except httpx.TransportError as e:
                    with self._lock:
                        self.lost.append(type(e).__name__)
                    continue
                with self._lock:
                    if r.status_code == 200 and r.json()["rows"][0]["y"] == 2 * x:
                        self.answered += 1
                        self.times.append(time.monotonic())
                    else:
                        self.wrong.append((x, r.status_code, r.text[:200]))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(120)

    def more(self, n: int, timeout: float = 60) -> None:
        start = self.answered
        wait_until(f"{n} more answers", lambda: self.answered >= start + n, timeout=timeout)


def _gateway_pid(c: LocalCluster) -> int:
    return _health(c)["gateway"]["pid"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["kill-9", "segv"])
def test_a_gateway_that_dies_under_load_is_replaced_and_nothing_else_restarts(sig):
    with LocalCluster(ClusterConfig(executors=2)) as c:
        d = _deploy(c, "double")
        gateway = _gateway_pid(c)
        others = _descendants(c.proc.pid) - {gateway} - _descendants(gateway)
        with Load(d.url) as load:
            load.more(50)
            killed_at = time.monotonic()
            os.kill(gateway, sig)
            load.more(100)
        first_after = min(t for t in load.times if t > killed_at)
        print(f"\n{sig.name}: answered {load.answered}, lost {len(load.lost)} {load.lost}, wrong {len(load.wrong)}")
        print(f"first answer {first_after - killed_at:.2f} s after the kill")
        assert not load.wrong, load.wrong[:3]
        # only requests in flight on the killed process's connections go unanswered, and
        # no connection is refused: the listening socket outlives the gateway
        assert len(load.lost) <= 4 and "ConnectError" not in load.lost, load.lost
        assert first_after - killed_at < 10
        h = _health(c)
        assert h["gateway"]["restarts"] == 1 and h["gateway"]["pid"] != gateway
        assert h["gateway"]["last_exit"] == f"signal {sig.value} ({sig.name})"
        assert h["executors"] == 2 and h["flows"] == ["double"] and not h["crashed"]
        # the executors and the store are the processes they were
        assert others <= _descendants(c.proc.pid), "an executor or the store was restarted with the gateway"
        status = subprocess.run(
            [sys.executable, "-m", "flowserve.cli", "--dir", str(c.dir), "status"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"the gateway process was restarted 1 time(s); it last ended with signal {sig.value}" in status.stdout
        if sig == signal.SIGSEGV:  # the crash left the Python stack where an operator looks
            assert "Segmentation fault" in (c.dir / "logs" / "gateway.log").read_text()


def test_an_executor_that_cannot_start_is_retried_while_the_others_are_supervised():
    """Its socket path is taken by a directory, so each start fails at once: the supervisor
    retries with a growing backoff, logging why, and goes on restarting the others."""
    with LocalCluster(ClusterConfig(executors=2)) as c:
        d = _deploy(c, "double")
        rundir = Path(c.state["rundir"])
        cpu0, cpu1 = (int(p) for p in _executor_pids(c))  # started in order
        with Load(d.url) as load:
            load.more(20)
            (rundir / "e0.ipc").unlink()
            (rundir / "e0.ipc").mkdir()  # what the next cpu0 must bind: it exits at once
            os.kill(cpu0, signal.SIGKILL)
            wait_until("cpu0 reported down", lambda: "cpu0" in _health(c).get("down", {}), timeout=30)
            wait_until(
                "a failed restart of cpu0 logged with its reason",
                lambda: "starting it again in" in (c.dir / "cluster.log").read_text(),
                timeout=30,
            )
            # another executor dying meanwhile is still restarted
            os.kill(cpu1, signal.SIGKILL)
            wait_until("cpu1 back", lambda: "cpu1" not in _health(c).get("down", {}), timeout=30)
            load.more(20)
            h = _health(c)
            assert h["executors"] == 1 and "cpu0" in h["down"], h
            # cpu0 can start once its path is free again, after its backoff (at most 10 s)
            (rundir / "e0.ipc").rmdir()
            wait_until("cpu0 back", lambda: _health(c)["executors"] == 2, timeout=30)
            load.more(20)
        assert not load.wrong, load.wrong[:3]
        log = (c.dir / "cluster.log").read_text()
        assert "executor cpu0 ended (exit 1)" in log and "IsADirectoryError" in log, log[-3000:]


def test_health_and_readiness_count_only_executors_that_answer():
    """A frozen executor (SIGSTOP) still has a process: it is not counted as serving."""
    with LocalCluster(ClusterConfig(executors=2, stuck_grace_s=60)) as c:
        _deploy(c, "double")
        assert _health(c)["executors"] == 2
        assert httpx.get(f"{c.url}/readyz").json()["ready"] is True
        pids = _executor_pids(c)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            wait_until("no executor counted", lambda: _health(c)["executors"] == 0, timeout=30)
            assert _health(c)["status"] == "degraded"
            r = httpx.get(f"{c.url}/readyz")
            assert r.status_code == 503 and "no executor answers pings" in r.json()["missing"]
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        wait_until("both counted again", lambda: _health(c)["executors"] == 2, timeout=30)
        assert httpx.get(f"{c.url}/readyz").status_code == 200


def test_a_deploy_fails_at_once_when_no_executor_can_take_it():
    with LocalCluster(ClusterConfig(executors=1, restart_executors=False)) as c:
        _deploy(c, "double")
        for pid in _executor_pids(c):
            os.kill(pid, signal.SIGKILL)
        wait_until("the executor reported down", lambda: _health(c)["executors"] == 0, timeout=30)
        t0 = time.monotonic()
        with pytest.raises(NoExecutorError, match=r"\(503\).*no executor answers to build it on \(cpu0: signal 9") as e:
            _deploy(c, "later", triple)
        assert isinstance(e.value, RetryableError) and e.value.status == 503
        assert time.monotonic() - t0 < 5


# -- the cluster directory on a disk that is read-only or full ------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str):
    """A tmpfs of ``size`` mounted on ``path`` (over what is there) for the block."""
    path.mkdir(parents=True, exist_ok=True)
    opts = ",".join([f"size={size}", *options])
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield path
    finally:
        unmount(path)


def unmount(path: Path) -> None:
    deadline = time.monotonic() + 30
    while subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)  # lazily, not to leave it
            return
        time.sleep(0.1)  # a process that held a file there is still exiting


def test_executors_restart_and_serve_when_their_log_directory_is_read_only(tmp_path):
    with LocalCluster(ClusterConfig(dir=str(tmp_path / "cluster"), executors=2)) as c:
        d = _deploy(c, "double")
        logs = c.dir / "logs"
        with Load(d.url) as load:
            load.more(20)
            # a read-only file system over the log directory: the running executors keep
            # their open files, a restarted one cannot open its log or its running-record
            with tmpfs(logs, "1m", "ro"):
                for n, pid in enumerate(_executor_pids(c), start=1):
                    os.kill(pid, signal.SIGKILL)
                    # the gateway saw it die (until then it still counts it), then it is back
                    wait_until("the crash seen", lambda n=n: _crashes(c) >= n, timeout=30)
                    wait_until("both executors answering", lambda: _health(c)["executors"] == 2, timeout=30)
                load.more(50)
                assert sum(_health(c)["crashed"].values()) == 2
                assert not _health(c).get("down")
            # writable again: a restart logs to its file as before
            os.kill(_executor_pids(c)[0], signal.SIGKILL)
            wait_until("both executors answering", lambda: _health(c)["executors"] == 2, timeout=30)
            load.more(20)
        assert not load.wrong and not load.lost, (load.wrong[:3], load.lost)
        assert "cannot open its log" in (c.dir / "cluster.log").read_text()
        print(f"\nread-only logs: answered {load.answered}, lost {len(load.lost)}, wrong {len(load.wrong)}")


def test_a_full_cluster_disk_keeps_serving_refuses_writes_clearly_and_recovers(tmp_path):
    root = tmp_path / "cluster"
    with tmpfs(root, "24m"):
        with LocalCluster(ClusterConfig(dir=str(root), executors=2, persistence=True)) as c:
            d = _deploy(c, "double")
            filler = root / "filler"
            with Load(d.url) as load:
                load.more(20)
                with open(filler, "wb") as f:  # fill the disk
                    chunk = b"\0" * (1 << 20)
                    with contextlib.suppress(OSError):
                        while True:
                            f.write(chunk)
                            f.flush()
                load.more(50)  # serving goes on from memory
                # an executor restarted on the full disk serves (no SIGBUS from its record)
                for n, pid in enumerate(_executor_pids(c), start=1):
                    os.kill(pid, signal.SIGKILL)
                    # the gateway saw it die (until then it still counts it), then it is back
                    wait_until("the crash seen", lambda n=n: _crashes(c) >= n, timeout=30)
                    wait_until("both executors answering", lambda: _health(c)["executors"] == 2, timeout=30)
                load.more(50)
                # writes fail with an error that says what is wrong
                with pytest.raises(StoreWriteError, match="cannot write to its disk") as refused:
                    wait_until("the store to refuse writes", lambda: c.kvs.put("probe", 1) and False, timeout=30)
                assert f"the store's data directory: {root / 'redis'}" in str(refused.value)
                # StoreWriteError from the client's own write, or the gateway's 503 (UnavailableError)
                with pytest.raises(RetryableError, match="cannot write to its disk") as failed:
                    _deploy(c, "later", triple)
                print(f"\nthe deploy on a full disk: {failed.value}")
                assert "later" not in _health(c)["flows"]  # not served unregistered
                filler.unlink()  # space again: the store takes writes by itself
                wait_until("the store to take writes", lambda: _put_works(c), timeout=60)
                later = _deploy(c, "later", triple)
                assert later.invoke({"x": 2}).to_pylist()[0]["y"] == 6
                load.more(20)
            assert not load.wrong and not load.lost, (load.wrong[:3], load.lost)
            print(f"answered {load.answered}, lost {len(load.lost)}, wrong {len(load.wrong)}")


def _crashes(c: LocalCluster) -> int:
    return sum(_health(c)["crashed"].values())


def _put_works(c: LocalCluster) -> bool:
    try:
        c.kvs.put("probe", 1)
        return True
    except StoreWriteError:
        return False


def test_a_registry_rolled_back_is_not_served_after_a_gateway_restart():
    """Anyone with the store's password can point the registry at an older version (its
    plan is genuinely signed for its own key). The cluster remembers the newest version
    it served, outside the store: a new gateway serves that one and logs the rollback."""
    from executors.plans import DEPLOYED_KEY

    with LocalCluster(ClusterConfig(executors=1)) as c:
        v1 = _deploy(c, "moving", double)
        v2 = _deploy(c, "moving", triple)
        assert v2.version > v1.version
        c.kvs.redis.hset(DEPLOYED_KEY, "moving", v1.version)
        os.kill(_gateway_pid(c), signal.SIGKILL)
        wait_until("a new gateway", lambda: _health_or_none(c, "gateway", "restarts") == 1, timeout=30)
        wait_until("the flow served again", lambda: "moving" in _health(c)["flows"], timeout=30)
        assert httpx.post(v2.url, json={"x": 2}).json()["rows"][0]["y"] == 6  # v2's code, not v1's
        assert httpx.get(f"{c.url}/flows/moving").json()["version"] == v2.version
        assert "a registry rolled back" in (c.dir / "cluster.log").read_text()


def _health_or_none(c: LocalCluster, *path):
    try:
        value = _health(c)
    except httpx.HTTPError:
        return None
    for key in path:
        value = value[key]
    return value
