"""``RedisServer``: start/stop, no orphans, restart, persistence, clear start errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from flow.configuration import ConfigError
from flow.errors import InternalError, UnreachableError
from kvs import KVS, RedisServer, find_server_binary
from kvs import server as server_module
from kvs.server import ENV_BINARY
from tests.kvs.helpers import SLOW_KEYS, SLOW_LOAD, wait_until

REPO = Path(__file__).resolve().parents[2]


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_session_fixture_serves(redis_server, kvs):
    assert redis_server.running and redis_server.url.startswith("redis://127.0.0.1:")
    kvs.put("k", 1)
    assert kvs.get("k") == 1


def test_start_stop_leaves_no_process_and_no_dir():
    server = RedisServer()
    server.start()
    pid, workdir = server.pid, server.dir
    assert pid_alive(pid) and workdir.is_dir()
    assert (workdir.stat().st_mode & 0o777) == 0o700  # the config may hold a password
    server.stop()
    assert not pid_alive(pid)
    assert not workdir.exists()
    assert server.pid is None and not server.running
    server.stop()  # idempotent


def test_binds_loopback_only_without_persistence(redis_server):
    with KVS.from_url(redis_server.url) as store:
        config = store.redis.config_get("*")
        modules = store.redis.module_list()
    assert config["bind"] == "127.0.0.1"
    assert config["protected-mode"] == "yes"
    assert config["appendonly"] == "no" and config["save"] == ""
    names = {m[b"name"].decode().lower() for m in modules}
    assert not names & {"graph", "falkordb"}  # FalkorDB's module ships beside it, never loaded


def test_version_is_at_least_6(redis_server):
    major = int(redis_server.version.split(".")[0])
    assert major >= 6


def test_restart_keeps_port_and_dir(tmp_path):
    with RedisServer(dir=tmp_path) as server:
        port, pid = server.port, server.pid
        server.restart()
        assert server.port == port and server.dir == tmp_path
        assert server.pid != pid and not pid_alive(pid)
        with KVS.from_url(server.url) as store:
            assert store.ping()
    assert tmp_path.is_dir()  # a directory we were given is kept


def test_appendonly_data_survives_a_restart(tmp_path):
    with RedisServer(dir=tmp_path, appendonly=True) as server:
        with KVS.from_url(server.url) as store:
            store.put("model", {"version": 3})
        server.restart()
        with KVS.from_url(server.url) as store:
            assert store.get("model") == {"version": 3}


def test_without_persistence_data_is_gone_after_restart(tmp_path):
    with RedisServer(dir=tmp_path) as server:
        with KVS.from_url(server.url) as store:
            store.put("k", 1)
            server.restart()
            assert store.get("k", None) is None


def slow_data(server: RedisServer) -> dict[str, bytes]:
    """Write SLOW_KEYS keys into the AOF's base file (the AOF rewritten), where
    ``key-load-delay`` applies when the server reads them back."""
    data = {f"k{i}": os.urandom(2048) for i in range(SLOW_KEYS)}  # incompressible: 2 KB a key on disk too
    r = redis.Redis.from_url(server.url)
    r.mset(data)
    r.bgrewriteaof()

    def rewritten():
        p = r.info("persistence")
        return not int(p["aof_rewrite_in_progress"]) and not int(p["aof_rewrite_scheduled"])

    assert wait_until(rewritten, timeout=30)
    r.close()
    return data


def loading(server: RedisServer) -> bool:
    """True while the server answers that it is loading its data."""
    with redis.Redis.from_url(server.url, socket_timeout=1) as r:
        try:
            r.ping()
        except redis.BusyLoadingError:
            return True
        except redis.RedisError:  # not up yet
            pass
    return False


def test_a_server_loading_its_data_for_longer_than_the_startup_timeout_comes_back_whole(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(server_module, "LOADING_REPORT_S", 0.5)
    told: list = []  # what on_loading was told: progress about once a second, then None
    slow = RedisServer(
        dir=tmp_path, appendonly=True, startup_timeout=1.0, extra_config=SLOW_LOAD, on_loading=told.append
    )
    with slow as server:
        data = slow_data(server)
        server.kill()  # a crash: the data comes back from the AOF
        started = time.monotonic()
        with caplog.at_level("INFO", logger="kvs.server"):
            server.restart()
        # the premise: it loaded for longer than the startup timeout, past which a silent server is killed
        assert time.monotonic() - started > 2 * server.startup_timeout
        r = redis.Redis.from_url(server.url)
        assert r.dbsize() == SLOW_KEYS and r.mget(list(data)) == list(data.values())
        r.close()
    assert "is loading its data" in caplog.text and "loaded its data in" in caplog.text
    assert told[-1] is None and len(told) >= 3, told  # the empty first start told nothing
    assert [r["percent"] for r in told[:-1]] == sorted(r["percent"] for r in told[:-1])
    assert all(0 <= r["percent"] <= 100 and r["eta_s"] >= 0 for r in told[:-1])


def test_a_read_while_the_server_loads_waits_for_it_within_the_retry_timeout(tmp_path):
    with RedisServer(dir=tmp_path, appendonly=True, extra_config=SLOW_LOAD) as server:
        data = slow_data(server)
        server.kill()
        with ThreadPoolExecutor(1) as pool, KVS.from_url(server.url, retry_timeout=60) as patient:
            back = pool.submit(server.restart)
            assert wait_until(lambda: loading(server), timeout=30), "the server never answered LOADING"
            assert patient.get_bytes("k7") == data["k7"]  # waited for the load, not failed
            back.result(timeout=60)


def test_a_read_that_outwaits_its_retry_timeout_while_the_server_loads_says_so(tmp_path):
    with RedisServer(dir=tmp_path, appendonly=True, extra_config=SLOW_LOAD) as server:
        slow_data(server)
        server.kill()
        with ThreadPoolExecutor(1) as pool, KVS.from_url(server.url, retry_timeout=0.2) as hasty:
            back = pool.submit(server.restart)
            assert wait_until(lambda: loading(server), timeout=30), "the server never answered LOADING"
            with pytest.raises(UnreachableError, match="is loading its data .* retry_timeout=0.2 s"):
                hasty.get_bytes("k7")
            back.result(timeout=60)


def test_two_servers_get_different_ports():
    with RedisServer() as a, RedisServer() as b:
        assert a.port != b.port


def test_server_dies_with_its_parent_process(tmp_path):
    """A process that started a server is SIGKILLed (no cleanup runs): the kernel must
    take the server down with it (PR_SET_PDEATHSIG)."""
    script = textwrap.dedent(f"""
        import sys, time
        from kvs import RedisServer
        server = RedisServer(dir={str(tmp_path)!r}).start()
        print(server.pid, flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        redis_pid = int(child.stdout.readline())
        assert pid_alive(redis_pid)
        child.kill()
        child.wait()
        assert wait_until(lambda: not pid_alive(redis_pid), timeout=5.0), "orphaned redis-server"
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_server_started_from_a_short_lived_thread_survives_the_thread():
    """PDEATHSIG fires when the forking *thread* exits; starting from a thread that
    then ends must not kill the server."""
    server = RedisServer()
    worker = threading.Thread(target=server.start)
    worker.start()
    worker.join()
    try:
        with KVS.from_url(server.url, retry_timeout=0.5) as store:
            assert store.ping()
            assert server.running
    finally:
        server.stop()


def test_die_with_parent_false_outlives_the_parent(tmp_path):
    script = textwrap.dedent(f"""
        from kvs import RedisServer
        server = RedisServer(dir={str(tmp_path)!r}, die_with_parent=False).start()
        print(server.pid, flush=True)
        import os; os._exit(0)   # no cleanup: like `flowserve up` returning to the shell
    """)
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=30,
    )
    redis_pid = int(out.stdout.split()[0])
    try:
        assert pid_alive(redis_pid)
    finally:
        os.kill(redis_pid, signal.SIGTERM)  # the server this test started, by its pid
        assert wait_until(lambda: not pid_alive(redis_pid), timeout=5.0)


def test_start_failure_reports_the_log_tail(tmp_path):
    server = RedisServer(dir=tmp_path, maxmemory="not-a-size")
    with pytest.raises(InternalError, match="log tail") as info:
        server.start()
    assert "not-a-size" in str(info.value)  # only the server's own log says that
    assert not server.running


def test_server_that_never_answers_times_out_and_is_killed(tmp_path, monkeypatch):
    fake = tmp_path / "fake-redis"
    pidfile = tmp_path / "fake.pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\necho 'fake server warming up'\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv(ENV_BINARY, str(fake))
    server = RedisServer(dir=tmp_path / "work", startup_timeout=0.5)
    with pytest.raises(InternalError, match="did not answer PING") as info:
        server.start()
    assert "fake server warming up" in str(info.value)
    assert not pid_alive(int(pidfile.read_text()))


def test_binary_lookup_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_BINARY, str(tmp_path / "missing-redis"))
    with pytest.raises(ConfigError, match="missing-redis"):
        find_server_binary()
    monkeypatch.delenv(ENV_BINARY)
    assert os.access(find_server_binary(), os.X_OK)


@pytest.mark.parametrize(
    "kwargs, quoted", [({"port": 70000}, "70000"), ({"port": "6379"}, "'6379'"), ({"startup_timeout": 0}, "0")]
)
def test_bad_arguments_quote_the_value(kwargs, quoted):
    with pytest.raises(ValueError, match=quoted):
        RedisServer(**kwargs)


def test_server_url_quotes_the_password(tmp_path):
    with RedisServer(dir=tmp_path, password="p@ss:word/") as server:
        assert "p%40ss%3Aword%2F" in server.url
        with KVS.from_url(server.url) as store:
            assert store.ping()


def test_popen_helper_children_survive_their_calling_thread():
    from kvs.server import popen, terminate

    procs = []
    worker = threading.Thread(target=lambda: procs.append(popen(["sleep", "30"])))
    worker.start()
    worker.join()
    try:
        assert procs[0].poll() is None  # the calling thread ended; the child lives on
    finally:
        terminate(procs[0], 5.0)
    assert procs[0].poll() is not None
