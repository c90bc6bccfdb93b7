"""The local cluster process: the KVS server, the executors, the gateway, a supervisor.

``flow.deploy()`` starts one of these as a child that dies with the caller; ``flowserve up``
starts one that outlives the shell. It writes ``<dir>/cluster.json`` (mode 0600: it holds
the KVS password and the admin token) once the gateway answers.

    python -m executors.daemon --dir /tmp/fs --config '{"executors": 2}'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import uvicorn

from executors.config import CONFIG_ENV, KEY_ENV, STATE_FILE, ClusterConfig, math_thread_env
from executors.dispatcher import Dispatcher
from executors.durability import StoreWatch, mark_started, registry_if_intact
from executors.gateway import Gateway, LoadFailed, make_app
from executors.membership import build_on
from executors.metrics import Metrics
from executors.scaling import ScalingLoop
from executors.serving import DrainingServer, drain, limited_protocol
from executors.watchdog import EXIT_RECYCLED, Blackbox
from kvs import KVS, RedisServer
from kvs.server import free_port, popen, terminate

log = logging.getLogger("flowserve.cluster")
LIVENESS_S = 1.0  # how often the supervisor pings its executors


class ExecutorProcess:
    """One executor child process; restarted by the supervisor when it dies."""

    def __init__(
        self, id_: str, address: str, device: str, kvs_url: str, config: ClusterConfig, logdir: Path, cluster_key: bytes
    ):
        self.id, self.address, self.device = id_, address, device
        self.kvs_url, self.config, self.logdir = kvs_url, config, logdir
        self.cluster_key = cluster_key
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.blackbox = logdir / f"{id_}.running"  # what its threads run: read after a crash

    def start(self) -> None:
        logfile = open(self.logdir / f"{self.id}.log", "ab")
        cmd = [
            sys.executable,
            "-m",
            "executors.executor",
            "--id",
            self.id,
            "--address",
            self.address,
            "--device",
            self.device,
            "--threads",
            str(self.config.threads),
            "--busy-poll-ms",
            repr(float(self.config.busy_poll_ms)),
            "--cache-bytes",
            str(self.config.executor_cache_bytes),
            "--stuck-grace-s",
            repr(float(self.config.stuck_grace_s)),
            "--blackbox",
            str(self.blackbox),
        ]
        # the KVS URL holds its password: through the environment (readable by this user only),
        # never the command line (any local user reads that with `ps`)
        env = dict(os.environ, FLOWSERVE_KVS_URL=self.kvs_url, **{KEY_ENV: self.cluster_key.hex()})
        env.pop(CONFIG_ENV, None)
        env.update(math_thread_env(self.config.executors + self.config.gpu_executors))
        self.proc = popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        logfile.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ClusterDaemon:
    def __init__(self, config: ClusterConfig, dir_: Path):
        self.config = config
        self.dir = dir_
        self.logdir = dir_ / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        os.chmod(dir_, 0o700)  # sockets and state are this user's only
        self.admin_token = secrets.token_urlsafe(24)
        # signs the plans this cluster unpickles; kept in the 0600 state file and the processes'
        # environment, never in the KVS (whoever can write there must not run code here)
        self.cluster_key = _cluster_key(dir_)
        self.redis = RedisServer(
            dir=dir_ / "redis", appendonly=config.persistence, password=secrets.token_urlsafe(24), die_with_parent=True
        )
        self.port = config.port or free_port()
        self.executors: list[ExecutorProcess] = []
        self.metrics = Metrics()
        self.dispatcher: Dispatcher | None = None
        self._supervisor: asyncio.Task | None = None
        self._liveness: asyncio.Task | None = None
        self._next_index = config.executors + config.gpu_executors
        self.scaling = (
            ScalingLoop(
                lambda: self.dispatcher,
                self,
                config.autoscaling,
                metrics=self.metrics,
                max_executors=config.max_executors,
            )
            if config.autoscaling is not None
            else None
        )
        if self.scaling is None:  # flows served under an SLO are tuned even without a policy
            self.scaling = ScalingLoop(
                lambda: self.dispatcher, self, None, metrics=self.metrics, max_executors=config.max_executors
            )
        self._scaling_task: asyncio.Task | None = None
        self._store_watch: asyncio.Task | None = None

    def run(self) -> None:
        self.redis.start()
        kvs_url = self.redis.url
        self.store = KVS.from_url(kvs_url, signing_key=self.cluster_key)
        mark_started(self.store.redis)  # kvs/markers.py: how a store that lost its data is told apart
        for i in range(self.config.executors + self.config.gpu_executors):
            device = "cpu" if i < self.config.executors else "gpu"
            ex = ExecutorProcess(
                f"{device}{i}",
                f"ipc://{self.dir}/e{i}.ipc",
                device,
                kvs_url,
                self.config,
                self.logdir,
                self.cluster_key,
            )
            ex.start()
            self.executors.append(ex)
        app = self._app()
        server = DrainingServer(
            uvicorn.Config(
                app,
                host=self.config.host,
                port=self.port,
                log_level="warning",
                lifespan="on",
                timeout_graceful_shutdown=30,
                access_log=False,
                proxy_headers=False,
                http=limited_protocol(self.config.http_limits()),
            ),
            self.gateway,
            drain_s=self.config.request_timeout_s,
        )
        try:
            server.run()
        finally:
            self._shutdown()

    def _app(self):
        self.dispatcher = Dispatcher(
            f"ipc://{self.dir}/gateway.ipc",
            self.config.max_retries,
            self.metrics,
            colocate=self.config.colocate,
            busy_poll_ms=self.config.busy_poll_ms,
        )
        for ex in self.executors:
            self.dispatcher.add_executor(ex.id, ex.address, ex.device)
        self.dispatcher.wait_for_restarts = self.config.restart_executors
        self.gateway = Gateway(
            self.dispatcher,
            self.store,
            token=self.config.token,
            admin_token=self.admin_token,
            max_body_bytes=self.config.max_body_bytes,
            request_timeout_s=self.config.request_timeout_s,
            max_request_timeout_s=self.config.max_request_timeout_s,
            load_timeout_s=self.config.load_timeout_s,
            metrics=self.metrics,
            public_metrics=self.config.public_metrics,
            max_rows=self.config.max_rows,
        )
        if self.scaling is not None:
            self.gateway.shape_placement = self.scaling.initial_placement
            self.gateway.scaling_status = self.scaling.status
            self.scaling.monitor = self.gateway.slo
            self.scaling.serve_replan = self.gateway.serve_replan  # the tuner's re-plans
        return make_app(self.gateway, on_startup=[self._started], on_shutdown=[self._stopping])

    async def _started(self) -> None:
        self.dispatcher.start()
        await self._wait_executors()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise())
        self._liveness = asyncio.get_running_loop().create_task(self._watch_liveness())
        self._store_watch = asyncio.get_running_loop().create_task(self._watch_store())
        if self.scaling is not None:
            self._scaling_task = asyncio.get_running_loop().create_task(self.scaling.run())
        await self._restore_flows()
        self._write_state()
        log.info("local cluster ready at http://%s:%s", self.config.host, self.port)

    async def _restore_flows(self) -> None:
        """Serve again what the registry lists: a cluster restarted on a persisted store
        (`flowserve down` then `up`) comes back with its flows. A flow that cannot be built
        any more (its code changed underneath, a model is gone) is logged and skipped."""
        registry = await asyncio.to_thread(registry_if_intact, self.store.redis)
        for name, version in sorted((registry or {}).items()):
            try:
                await self.gateway.load_flow(name, version)
                log.info("flow %s v%s restored from the store", name, version)
            except LoadFailed as e:
                log.warning("flow %s v%s is registered but could not be restored: %s", name, version, e.message)

    async def _wait_executors(self) -> None:
        for ex in self.executors:
            if not await self._ping(ex, timeout=60):
                raise RuntimeError(f"executor {ex.id} did not start; see {self.logdir / (ex.id + '.log')}")

    async def _ping(self, ex: ExecutorProcess, timeout: float) -> bool:
        return await self.dispatcher.ping(ex.address, timeout, still_worth_it=ex.alive) is not None

    async def _supervise(self) -> None:
        """Restart dead executors and rebuild their flows (requests in flight are re-run),
        and restart the KVS server on its port if it died (clients reconnect by themselves;
        with persistence its data survives)."""
        while True:
            await asyncio.sleep(0.1)
            if not self.redis.running and self.gateway.accepting:
                log.warning("the KVS server died; restarting it on port %s", self.redis.port)
                try:
                    await asyncio.get_running_loop().run_in_executor(None, self.redis.restart)
                except Exception:
                    log.exception("restarting the KVS server failed; will retry")
            for ex in self.executors:
                if ex.alive() or not self.gateway.accepting:
                    continue
                if self.dispatcher.executors[ex.id].alive:
                    self._executor_exited(ex)
                if not self.config.restart_executors:
                    continue
                log.warning("restarting executor %s", ex.id)
                ex.restarts += 1
                ex.start()
                if await self._ping(ex, timeout=60):
                    # the stages placed on it (its placement was kept): meanwhile requests
                    # avoid it for a flow whose build failed (not in ``loaded``)
                    await build_on(self.dispatcher, ex.id, partial(_placed_on, ex.id), self.config.load_timeout_s)
                    self.dispatcher.executor_back(ex.id)

    async def _watch_liveness(self) -> None:
        """Kill an executor that stops answering pings for ``stuck_grace_s``. Its own watchdog
        handles stuck threads, but a C call that never releases the interpreter lock (a
        regular expression backtracking for ever) stops that watchdog too; killed, it goes
        the crash path: the supervisor restarts it and blames what it was running."""
        while True:
            await asyncio.sleep(LIVENESS_S)
            checks = [
                ex
                for ex in self.executors
                if ex.alive() and getattr(self.dispatcher.executors.get(ex.id), "alive", False)
            ]
            pongs = await asyncio.gather(
                *(self.dispatcher.ping(ex.address, self.config.stuck_grace_s, still_worth_it=ex.alive) for ex in checks)
            )
            for ex, pong in zip(checks, pongs):
                if pong is None and ex.alive() and self.gateway.accepting:
                    log.error(
                        "executor %s answered no ping for %.0f s (a thread holds the interpreter); killing it",
                        ex.id,
                        self.config.stuck_grace_s,
                    )
                    ex.proc.kill()

    def _executor_exited(self, ex: ExecutorProcess) -> None:
        """Tell the dispatcher why an executor's process ended: it recycled itself (a stuck
        thread: nothing to blame) or it crashed (its blackbox says which requests were
        running: those are the suspects of a poison input)."""
        code = ex.proc.returncode
        info = self.dispatcher.executors[ex.id]
        if code == EXIT_RECYCLED:
            log.warning("executor %s recycled itself (a thread was stuck)", ex.id)
            info.recycled += 1
            self.metrics.recycles.labels(ex.id, "stuck").inc()
            self.dispatcher.executor_died(ex.id, reason="recycled")
            return
        running = Blackbox.read(ex.blackbox)
        how = f"signal {-code}" if code is not None and code < 0 else f"exit {code}"
        if running:
            for r in running:
                log.error(
                    "executor %s crashed (%s) while running flow %s operator %r (stage %s) for request(s) %s, qid %s",
                    ex.id,
                    how,
                    r["flow"],
                    r["operator"],
                    r["stage"],
                    ",".join(str(q) for q, _ in r["requests"]),
                    r["qid"],
                )
        else:
            log.warning("executor %s died (%s) while running no request", ex.id, how)
        info.crashed += 1
        self.metrics.crashes.labels(ex.id).inc()
        self.dispatcher.executor_died(ex.id, running=running)

    async def _watch_store(self) -> None:
        """Re-publish the served flows if the KVS restarted empty, and build flows again on
        executors whose load failed (their restart met an empty store): durability.py."""
        await StoreWatch(self.store, self.dispatcher, self.config.load_timeout_s).run()

    async def add_executor(self, device: str) -> str | None:
        """Start one more executor process (the autoscaler's local backend)."""
        i = self._next_index
        self._next_index += 1
        ex = ExecutorProcess(
            f"{device}{i}",
            f"ipc://{self.dir}/e{i}.ipc",
            device,
            self.redis.url,
            self.config,
            self.logdir,
            self.cluster_key,
        )
        ex.start()
        self.executors.append(ex)
        self.dispatcher.add_executor(ex.id, ex.address, device)
        if not await self._ping(ex, timeout=60):
            log.warning("new executor %s did not start", ex.id)
            await self.remove_executor(ex.id)
            return None
        log.warning("started executor %s for the autoscaler", ex.id)
        return ex.id

    def removable(self) -> list[str]:
        return [ex.id for ex in self.executors[self.config.executors + self.config.gpu_executors :]]

    async def remove_executor(self, executor_id: str) -> None:
        """Stop an executor the autoscaler no longer needs (it hosts nothing)."""
        ex = next((e for e in self.executors if e.id == executor_id), None)
        if ex is None:
            return
        self.executors.remove(ex)
        self.dispatcher.remove_executor(ex.id)
        if ex.proc is not None:
            ex.proc.terminate()
            await asyncio.get_running_loop().run_in_executor(None, terminate, ex.proc, 10)
        log.warning("stopped idle executor %s", ex.id)

    async def _stopping(self) -> None:
        """Graceful stop: refuse new requests, let in-flight ones finish (bounded)."""
        await drain(self.gateway, self.config.request_timeout_s)
        for task in (self._supervisor, self._liveness, self._scaling_task, self._store_watch):
            if task is not None:
                task.cancel()

    def _write_state(self) -> None:
        state = {
            "url": f"http://{self.config.host}:{self.port}",
            "kvs_url": self.redis.url,
            "admin_token": self.admin_token,
            "token": self.config.token,
            "cluster_key": self.cluster_key.hex(),
            "pid": os.getpid(),
            "executors": [e.id for e in self.executors],
            "started": time.time(),
        }
        path = self.dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f)
        os.replace(tmp, path)

    def _shutdown(self) -> None:
        for ex in self.executors:
            if ex.proc is not None and ex.proc.poll() is None:
                ex.proc.terminate()
        for ex in self.executors:
            if ex.proc is not None:
                terminate(ex.proc, 10)
        self.store.close()
        self.redis.stop()
        (self.dir / STATE_FILE).unlink(missing_ok=True)


def _placed_on(executor_id: str, flow) -> list[str]:
    """The stages of ``flow`` placed on ``executor_id``."""
    return [stage for stage, ids in flow.placement.items() if executor_id in ids]


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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m executors.daemon", description="Run a FlowServe local cluster.")
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
        handlers=[logging.FileHandler(dir_ / "cluster.log"), logging.StreamHandler()],
    )
    config = ClusterConfig.from_json({**json.loads(args.config), **json.loads(os.environ.get(CONFIG_ENV) or "{}")})
    daemon = ClusterDaemon(config, dir_)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))  # uvicorn stops on SIGINT
    try:
        daemon.run()
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the SIGINT it stopped on, once it has shut down: a clean stop


if __name__ == "__main__":
    main()
