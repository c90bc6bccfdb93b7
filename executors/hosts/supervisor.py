"""The local cluster's root process: it starts the KVS server, the executors and the
gateway, and restarts whichever of them dies, for as long as the cluster runs.

``flow.deploy()`` starts one of these as a child that dies with the caller; ``flowserve up``
starts one that outlives the shell. It writes ``<dir>/cluster.json`` (mode 0600: it holds
the KVS password and the admin token) once the gateway first answers.

Why the gateway is a process of its own: it reads untrusted bytes (HTTP heads and bodies)
with C code (httptools, Arrow, orjson). If that ever crashes the process, the executors,
the store and the flows built on them live on in their own processes, and this one starts
a new gateway on the same listening socket, which it holds across gateway restarts:
connections that arrive meanwhile wait in the socket's backlog instead of being refused.
The gateway keeps what requests need (routing, flows, pings); this process keeps only
processes, so there is little here that can fail (executors/hosts/control.py is how they talk).

With ``ClusterConfig.gateways`` above 1 it runs that many gateway processes, all accepting
on the one listening socket (the kernel hands each new connection to one of them), each
with a control channel of its own: events go to every gateway, a reply to the caller. One
of them, the holder of the store's lease (executors/hosts/leadership.py), runs the
autoscaler; a start or stop of an executor it asks for is carried out only if its fencing
token is still the current one.

Nothing is given up on: a process that fails to start, or dies soon after it started, is
started again after a backoff (0.1 s doubling to 10 s), each failure logged with its
reason, while every other process stays supervised.

    python -m executors.hosts.supervisor --dir /tmp/fs --config '{"executors": 2}'
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from executors.gateway.durability import mark_started
from executors.hosts.cluster_config import CONFIG_ENV, STARTING_FILE, STATE_FILE, ClusterConfig, math_thread_env
from executors.hosts.control import Channel
from executors.hosts.leadership import Fence
from executors.plans import KEY_ENV
from executors.worker.gpu import gpu_for_executor
from executors.worker.watchdog import EXIT_RECYCLED, Blackbox
from flow.configuration import ConfigError
from kvs import KVS, RedisServer
from kvs.retry import Backoff
from kvs.server import popen, terminate

log = logging.getLogger("flowserve.cluster")

SERVED_FILE = "served.json"  # flow -> the newest version served (see _note_served)
STABLE_S = 10.0  # a process that ran this long before it died is restarted at once
RESTART_BACKOFF = (0.1, 10.0)  # otherwise: after these delays, doubling (kvs.retry.Backoff)
ADMIN_TOKEN_ENV = "FLOWSERVE_ADMIN_TOKEN"


def exit_reason(code: int | None) -> str:
    """A process's return code in words: "signal 9 (SIGKILL)", "exit 1"."""
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit {code}"


class Supervised:
    """A child process the supervisor keeps running: its restarts, its backoff, and why
    it last stopped."""

    def __init__(self, name: str, logfile: Path):
        self.name = name
        self.logfile = logfile
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.backoff = Backoff(*RESTART_BACKOFF)
        self.last_exit: str | None = None  # "signal 11 (SIGSEGV)", "exit 1", or why it could not start
        self.restart_at: float | None = None  # when the next start is due (monotonic), if it is down

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def open_log(self):
        """The process's log file for appending, or None (its output then goes where the
        supervisor's own goes) when the directory cannot take it: a full or read-only disk
        must not stop a process from starting."""
        try:
            return open(self.logfile, "ab")
        except OSError as e:
            log.warning(
                "%s: cannot open its log %s (%s); its output goes to the cluster's own", self.name, self.logfile, e
            )
            return None

    def delay_after_exit(self) -> float:
        """Seconds to wait before starting it again: none after a long run, a growing
        backoff while it keeps dying young."""
        if time.monotonic() - self.started_at >= STABLE_S:
            self.backoff.reset()
            return 0.0
        return self.backoff.next()


class GatewayProcess(Supervised):
    """One of the gateway processes (``slot`` of ``ClusterConfig.gateways``). Each start is
    a new ``incarnation``, with its own range of request ids and its own answer address."""

    def __init__(self, slot: int, logdir: Path):
        super().__init__("gateway" if slot == 0 else f"gateway {slot}", logdir / _gateway_log(slot))
        self.slot = slot
        self.incarnation = -1
        self.channel: Channel | None = None
        self.ready = False


def _gateway_log(slot: int) -> str:
    return "gateway.log" if slot == 0 else f"gateway-{slot}.log"


class ExecutorProcess(Supervised):
    """One executor child process."""

    def __init__(self, id_: str, address: str, device: str, logdir: Path, extra: bool = False, gpu: str | None = None):
        super().__init__(f"executor {id_}", logdir / f"{id_}.log")
        self.id, self.address, self.device = id_, address, device
        self.gpu = gpu  # its CUDA_VISIBLE_DEVICES on a machine of several GPUs
        self.extra = extra  # started for the autoscaler: it may stop it again
        self.blackbox = logdir / f"{id_}.running"  # what its threads run: read after a crash

    def describe(self) -> dict:
        return {
            "id": self.id,
            "address": self.address,
            "device": self.device,
            "alive": self.alive(),
            "extra": self.extra,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }


class ClusterSupervisor:
    def __init__(self, config: ClusterConfig, dir_: Path):
        self.config = config
        self.dir = dir_
        self.logdir = dir_ / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        os.chmod(dir_, 0o700)  # state and logs are this user's only
        # sockets live apart from the cluster directory, so a full or read-only disk there
        # does not stop an executor from listening again after a restart
        self.rundir = Path(tempfile.mkdtemp(prefix="flowserve-run-"))
        self.admin_token = secrets.token_urlsafe(24)
        # signs the plans this cluster unpickles; kept in the 0600 state file and the processes'
        # environment, never in the KVS (whoever can write there must not run code here)
        self.cluster_key = _cluster_key(dir_)
        # the store: the cluster's own Redis, or none when it uses an external one (kvs_url)
        self.redis: RedisServer | None = None
        if config.kvs_url is None:
            self.redis = RedisServer(
                dir=dir_ / "redis",
                appendonly=config.persistence,
                password=secrets.token_urlsafe(24),
                die_with_parent=True,
                on_loading=self._store_loading,
            )
        self.kvs_url: str | None = config.kvs_url  # the cluster's own store's, once it runs
        self.store_backoff = Backoff(*RESTART_BACKOFF)
        self.store_restarting = False
        self.executors: list[ExecutorProcess] = []
        self._next_index = 0
        self.gateways = [GatewayProcess(i, self.logdir) for i in range(config.gateways)]
        self._incarnations = 0  # each gateway start, whichever slot, takes the next one
        self.fence: Fence | None = None  # the autoscaler's fencing counter, in the store
        self._fence_store: KVS | None = None
        self.listener: socket.socket | None = None
        self.port = 0
        self.stopping = False
        self.ready = False
        self.served_file = dir_ / SERVED_FILE
        self.served: dict[str, int] = _read_served(self.served_file)
        self._stopped: asyncio.Event | None = None

    # -- the whole cluster -------------------------------------------------------------------

    def run(self) -> None:
        try:
            self.listener = _listen(self.config.host, self.config.port)
            self.port = self.listener.getsockname()[1]
            asyncio.run(self._main())
        finally:
            self._shutdown()

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        if self.redis is not None:
            await asyncio.to_thread(self.redis.start)
            self.kvs_url = self.redis.url  # its port is known once it runs
        store = KVS.from_url(self.kvs_url, signing_key=self.cluster_key)
        try:
            await asyncio.to_thread(mark_started, store.redis)  # kvs/markers.py: a store that lost its data
        except BaseException:
            store.close()
            raise
        # kept open: every executor start or stop the autoscaler asks for checks its token here
        self._fence_store = store
        self.fence = Fence(store.redis)
        for i in range(self.config.executors + self.config.gpu_executors):
            self._new_executor("cpu" if i < self.config.executors else "gpu")
        for g in self.gateways:
            self._start_gateway(g)
        sweep = loop.create_task(self._sweep())
        await self._stopped.wait()
        sweep.cancel()
        await asyncio.gather(*(self._stop_gateway(g) for g in self.gateways))

    def _on_signal(self) -> None:
        if self.stopping:  # a second signal: stop now
            log.warning("second stop signal: stopping at once")
            for g in self.gateways:
                if g.alive():
                    g.proc.kill()
        self.stopping = True
        self._stopped.set()

    async def _sweep(self) -> None:
        """Notice processes that ended and start those whose backoff has passed. A child's
        end is seen within this period; the restart itself waits for its backoff."""
        while True:
            await asyncio.sleep(0.05)
            if self.stopping:
                return
            now = time.monotonic()
            self._check_store()
            for ex in list(self.executors):
                self._check_executor(ex, now)
            for g in self.gateways:
                self._check_gateway(g, now)

    # -- the KVS server ----------------------------------------------------------------------

    def _check_store(self) -> None:
        if self.redis is None or self.redis.running or self.store_restarting:  # an external store is its own
            return
        self.store_restarting = True
        asyncio.get_running_loop().create_task(self._restart_store())

    def _store_loading(self, progress: dict | None) -> None:
        """The store's progress through its data as it starts (RedisServer.on_loading), in
        STARTING_FILE for LocalCluster.start, which waits as long as it moves on."""
        path = self.dir / STARTING_FILE
        if progress is None:
            path.unlink(missing_ok=True)
            return
        _write_private(path, json.dumps({"step": "the store is loading its data", **progress}))

    async def _restart_store(self) -> None:
        """Start the KVS server again on its port (clients reconnect by themselves; with
        persistence its data survives), with a growing backoff while it fails."""
        try:
            while not self.stopping:
                log.warning("the KVS server is down; starting it again on port %s", self.redis.port)
                try:
                    await asyncio.to_thread(self.redis.restart)
                    self.store_backoff.reset()
                    return
                except Exception as e:  # the store must come back: any failure is logged and tried again
                    delay = self.store_backoff.next()
                    log.error("starting the KVS server failed (%s); trying again in %.1f s", e, delay)
                    await asyncio.sleep(delay)
        finally:
            self.store_restarting = False

    # -- executors ---------------------------------------------------------------------------

    def _new_executor(self, device: str, extra: bool = False) -> ExecutorProcess:
        i = self._next_index
        self._next_index += 1
        gpu = None
        if device == "gpu":
            gpu = gpu_for_executor(sum(1 for e in self.executors if e.device == "gpu"))
        ex = ExecutorProcess(f"{device}{i}", f"ipc://{self.rundir}/e{i}.ipc", device, self.logdir, extra, gpu)
        self.executors.append(ex)
        self._start_executor(ex)
        return ex

    def _start_executor(self, ex: ExecutorProcess) -> bool:
        cmd = [
            sys.executable,
            "-m",
            "executors.worker.executor",
            "--id",
            ex.id,
            "--address",
            ex.address,
            "--device",
            ex.device,
            "--threads",
            str(self.config.threads),
            "--busy-poll-ms",
            repr(float(self.config.busy_poll_ms)),
            "--cache-bytes",
            str(self.config.executor_cache_bytes),
            "--stuck-grace-s",
            repr(float(self.config.stuck_grace_s)),
            "--blackbox",
            str(ex.blackbox),
        ]
        # the KVS URL holds its password: through the environment (readable by this user only),
        # never the command line (any local user reads that with `ps`)
        env = dict(os.environ, FLOWSERVE_KVS_URL=self.kvs_url, **{KEY_ENV: self.cluster_key.hex()})
        env.pop(CONFIG_ENV, None)
        env.update(math_thread_env(self.config.executors + self.config.gpu_executors))
        env.update(self.config.tracing_env())  # FLOWSERVE_TRACING (executors/tracing.py); nothing when off
        if ex.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = ex.gpu
        if self._spawn(ex, cmd, env):
            self.send({"event": "started", "id": ex.id})
            return True
        self.send({"event": "start_failed", "id": ex.id, "reason": ex.last_exit})
        return False

    def _spawn(self, p: Supervised, cmd: list, env: dict, pass_fds=()) -> bool:
        """Start ``p``'s process; on failure log why and schedule the next try."""
        out = p.open_log()
        try:
            # a session of its own: a Ctrl-C in the terminal reaches this process, which
            # stops the others in order, not every process of the cluster at once
            p.proc = popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                stdin=subprocess.DEVNULL,
                env=env,
                pass_fds=pass_fds,
                start_new_session=True,
            )
        except OSError as e:
            p.proc = None
            delay = p.backoff.next()
            p.last_exit = f"could not start: {e}"
            p.restart_at = time.monotonic() + delay
            log.error("%s could not be started (%s); trying again in %.1f s", p.name, e, delay)
            return False
        finally:
            if out is not None:
                out.close()
        p.started_at = time.monotonic()
        p.restart_at = None
        return True

    def _check_executor(self, ex: ExecutorProcess, now: float) -> None:
        if ex.proc is not None and ex.proc.poll() is not None:
            code = ex.proc.returncode
            ex.proc = None
            ex.last_exit = "recycled (a thread was stuck)" if code == EXIT_RECYCLED else exit_reason(code)
            # read what it was running before a new process of it truncates the record
            running = [] if code == EXIT_RECYCLED else Blackbox.read(ex.blackbox)
            self.send({"event": "exited", "id": ex.id, "code": code, "running": running})
            if not self.config.restart_executors:
                log.warning("executor %s ended (%s); not restarted (restart_executors is off)", ex.id, ex.last_exit)
                return
            delay = ex.delay_after_exit()
            ex.restart_at = now + delay
            if delay:
                log.error(
                    "executor %s ended (%s) %.1f s after it started; starting it again in %.1f s%s",
                    ex.id,
                    ex.last_exit,
                    now - ex.started_at,
                    delay,
                    _tail(ex.logfile),
                )
        if ex.proc is None and ex.restart_at is not None and now >= ex.restart_at:
            ex.restarts += 1
            log.warning("restarting executor %s (restart %d; it ended: %s)", ex.id, ex.restarts, ex.last_exit)
            self._start_executor(ex)

    # -- the gateway -------------------------------------------------------------------------

    def _start_gateway(self, g: GatewayProcess) -> None:
        g.incarnation = self._incarnations
        self._incarnations += 1
        g.ready = False
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd = [
            sys.executable,
            "-m",
            "executors.hosts.local_gateway",
            "--dir",
            str(self.dir),
            "--rundir",
            str(self.rundir),
            "--incarnation",
            str(g.incarnation),
            "--listen-fd",
            str(self.listener.fileno()),
            "--control-fd",
            str(theirs.fileno()),
        ]
        env = dict(
            os.environ,
            FLOWSERVE_KVS_URL=self.kvs_url,
            **{KEY_ENV: self.cluster_key.hex(), ADMIN_TOKEN_ENV: self.admin_token},
        )
        env[CONFIG_ENV] = json.dumps(self.config.to_json())
        started = self._spawn(g, cmd, env, pass_fds=(self.listener.fileno(), theirs.fileno()))
        theirs.close()
        if not started:
            mine.close()
            return
        g.channel = Channel(mine, functools.partial(self._on_gateway_message, g))
        asyncio.get_running_loop().create_task(g.channel.run())
        g.channel.send(
            {
                "hello": {
                    "executors": [ex.describe() for ex in self.executors],
                    "incarnation": g.incarnation,
                    "slot": g.slot,
                    "gateways": len(self.gateways),
                    "restarts": g.restarts,
                    "last_exit": g.last_exit,
                    "supervisor_pid": os.getpid(),
                    "served": self.served,
                }
            }
        )

    def _check_gateway(self, g: GatewayProcess, now: float) -> None:
        if g.proc is not None and g.proc.poll() is not None:
            g.last_exit = exit_reason(g.proc.returncode)
            g.proc = None
            delay = g.delay_after_exit()
            g.restart_at = now + delay
            log.error(
                "the %s process ended (%s); starting a new one%s; executors, the store and the other gateways "
                "keep running%s",
                g.name,
                g.last_exit,
                f" in {delay:.1f} s" if delay else "",
                _tail(g.logfile),
            )
        if g.proc is None and g.restart_at is not None and now >= g.restart_at:
            g.restarts += 1
            self._start_gateway(g)

    async def _stop_gateway(self, g: GatewayProcess) -> None:
        """Graceful stop: the gateway refuses new requests and answers those in flight
        (bounded by the request timeout), then everything else stops."""
        proc = g.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        limit = self.config.request_timeout_s + 15
        try:
            await asyncio.to_thread(proc.wait, limit)
        except subprocess.TimeoutExpired:
            log.error("the %s did not stop within %.0f s; killing it", g.name, limit)
            proc.kill()
            await asyncio.to_thread(proc.wait)

    # -- the control channel -----------------------------------------------------------------

    def send(self, msg: dict) -> None:
        """An event, to every gateway."""
        for g in self.gateways:
            if g.channel is not None:
                g.channel.send(msg)

    async def _on_gateway_message(self, g: GatewayProcess, msg: dict) -> None:
        if msg.get("ready"):
            self._gateway_ready(g)
            return
        if "served" in msg:
            self._note_served(msg["served"]["flow"], int(msg["served"]["version"]))
            return
        channel = g.channel
        op = msg.get("op")
        if op in ("add", "remove"):
            refusal = await self._fenced(g, op, msg.get("fence"))
            if refusal is not None:
                channel.reply(msg, error=refusal)
                return
        if op == "add":
            ex = self._new_executor(msg.get("device", "cpu"), extra=True)
            log.warning("autoscaler: started executor %s for %s (fencing token %s)", ex.id, g.name, msg.get("fence"))
            self.send({"event": "added", "executor": ex.describe()})
            channel.reply(msg, id=ex.id, address=ex.address, device=ex.device)
        elif op == "remove":
            ex = self._executor(msg.get("id"))
            if ex is not None:
                self.executors.remove(ex)
                proc, ex.proc = ex.proc, None
                if proc is not None:
                    await asyncio.to_thread(terminate, proc, 10)
                log.warning(
                    "autoscaler: stopped executor %s for %s (fencing token %s)", ex.id, g.name, msg.get("fence")
                )
                self.send({"event": "removed", "id": ex.id})
            channel.reply(msg, removed=ex is not None)
        elif op == "kill":
            ex = self._executor(msg.get("id"))
            silent_s = float(msg.get("silent_s") or 0.0)
            # several gateways may find one executor silent: a process started after the
            # silence began is its replacement, not the silent one
            fresh = ex is not None and time.monotonic() - ex.started_at < silent_s
            if ex is not None and ex.alive() and not fresh:
                ex.proc.kill()  # the sweep sees it end and restarts it, as after a crash
            channel.reply(msg, killed=ex is not None and not fresh)
        else:
            channel.reply(msg, error=f"unknown control call {op!r}")

    async def _fenced(self, g: GatewayProcess, op: str, token) -> str | None:
        """Why a start or stop of an executor asked for under fencing ``token`` is refused,
        or None: the token must be the store's current one (no gateway took the lease
        since). An unreachable store refuses too: the autoscaler tries again later."""
        try:
            if isinstance(token, int) and await asyncio.to_thread(self.fence.admits, token):
                return None
            current = await asyncio.to_thread(self.fence.current)
        except Exception as e:  # the store is restarting: no scale action can be checked now
            return f"{op} refused: the store cannot check the fencing token now ({type(e).__name__}: {e})"
        log.warning(
            "autoscaler: refused %s from %s: fencing token %r is not the current one (%s)", op, g.name, token, current
        )
        return f"{op} refused: fencing token {token!r} is not the current one ({current}): another gateway leads"

    def _note_served(self, flow: str, version: int) -> None:
        """Keep the newest version of each flow the gateway has served, in the cluster's
        directory (0600): a gateway started later, after a restart or `flowserve down` and
        `up`, refuses older ones whatever the store's registry says."""
        if version <= self.served.get(flow, 0):
            return
        self.served[flow] = version
        try:
            _write_private(self.served_file, json.dumps(self.served))
        except OSError as e:
            log.error("could not write %s (%s): the versions served are kept in memory only", self.served_file, e)

    def _executor(self, id_) -> ExecutorProcess | None:
        return next((e for e in self.executors if e.id == id_), None)

    def _gateway_ready(self, g: GatewayProcess) -> None:
        g.backoff.reset()
        g.ready = True
        if not self.ready:
            if all(x.ready for x in self.gateways):  # every gateway serves: the cluster does
                self.ready = True
                self._write_state()
                log.info("local cluster ready at http://%s:%s", self.config.host, self.port)
        else:
            log.warning(
                "a new %s serves at http://%s:%s (restart %d)",
                g.name,
                self.config.host,
                self.port,
                g.restarts,
            )

    def _write_state(self) -> None:
        state = {
            "url": f"http://{self.config.host}:{self.port}",
            "kvs_url": self.kvs_url,
            "admin_token": self.admin_token,
            "token": self.config.token,
            "cluster_key": self.cluster_key.hex(),
            "pid": os.getpid(),
            "rundir": str(self.rundir),
            "executors": [e.id for e in self.executors],
            "started": time.time(),
        }
        path = self.dir / STATE_FILE
        try:
            _write_private(path, json.dumps(state))
        except OSError as e:
            # the cluster serves; only clients that look for it by directory cannot find it
            log.error("could not write %s (%s): `flowserve` commands will not find this cluster", path, e)

    def _shutdown(self) -> None:
        self.stopping = True
        for g in self.gateways:
            if g.alive():
                g.proc.terminate()
        for g in self.gateways:
            if g.proc is not None:
                terminate(g.proc, 10)
        for ex in self.executors:
            if ex.alive():
                ex.proc.terminate()
        for ex in self.executors:
            if ex.proc is not None:
                terminate(ex.proc, 10)
        if self._fence_store is not None:
            self._fence_store.close()
        if self.redis is not None:
            self.redis.stop()
        if self.listener is not None:
            self.listener.close()
        shutil.rmtree(self.rundir, ignore_errors=True)
        (self.dir / STATE_FILE).unlink(missing_ok=True)


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, readable by this user only, never half written."""
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _read_served(path: Path) -> dict[str, int]:
    try:
        return {str(k): int(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _listen(host: str, port: int) -> socket.socket:
    """The gateway's listening socket, bound here once and handed to every gateway process:
    a port in use fails the start at once, with a clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ConfigError(  # the address is the config's (--host, --port): choose another
                f"port {port} on {host} is in use by another process; choose another with --port"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)  # connections wait here while a new gateway starts
    sock.set_inheritable(True)
    return sock


def _tail(path: Path, n: int = 8) -> str:
    """The last lines of a log, to show beside why a process ended."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode("utf-8", "replace").splitlines()[-n:]
    except OSError:
        return ""
    return "; its log ends:\n  " + "\n  ".join(lines) if lines else ""


def _cluster_key(dir_: Path) -> bytes:
    """The cluster's key, kept in its directory (mode 0600) so a cluster restarted on its
    persisted store (`flowserve down`, `up`) still reads the plans it signed."""
    path = dir_ / "cluster.key"
    try:
        key = bytes.fromhex(path.read_text().strip())
        if len(key) >= 16:
            return key
    except (OSError, ValueError):
        pass
    key = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex())
    return key


def log_handlers(path: Path) -> list[logging.Handler]:
    """Log to ``path`` and stderr; to stderr only when ``path`` cannot be opened (a full or
    read-only disk must not stop a cluster's process from starting)."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    try:
        handlers.insert(0, logging.FileHandler(path))
    except OSError as e:
        print(f"[flowserve] cannot open {path} ({e}); logging to stderr only", file=sys.stderr)
    return handlers


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m executors.hosts.supervisor", description="Run a FlowServe local cluster."
    )
    p.add_argument("--dir", required=True, help="state, logs and sockets directory")
    p.add_argument(
        "--config",
        default="{}",
        help=f"ClusterConfig fields as JSON; fields with secrets (token) go in ${CONFIG_ENV} instead, "
        "which is merged over this",
    )
    args = p.parse_args(argv)
    dir_ = Path(args.dir).resolve()
    dir_.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=os.environ.get("FLOWSERVE_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        handlers=log_handlers(dir_ / "cluster.log"),
    )
    config = ClusterConfig.from_json({**json.loads(args.config), **json.loads(os.environ.get(CONFIG_ENV) or "{}")})
    supervisor = ClusterSupervisor(config, dir_)
    try:
        supervisor.run()
    except ConfigError as e:  # a port in use, an address not this machine's: said, not a traceback
        log.error("%s", e)
        sys.exit(2)


if __name__ == "__main__":
    main()
