"""The local cluster's gateway process: HTTP, routing and the flows, over executors that
the supervisor (executors/hosts/supervisor.py) starts and restarts.

It is started by the supervisor with the listening socket and its end of the control
channel (executors/hosts/control.py) as inherited descriptors, and learns the executors from the
supervisor's hello. A gateway that replaces one that died serves the flows the registry
lists again: the executors still hold them built, so that takes milliseconds. Its request
ids, query ids and answer address are its own (``incarnation``): an answer that an
executor sends for a request of the gateway before it reaches nobody, never a request of
this one.

A cluster may run several of these at once (``ClusterConfig.gateways``), all accepting on
the one socket. Each serves every flow the registry lists (a deploy taken by one reaches
the others within ``REGISTRY_POLL_S``); the one holding the store's lease
(executors/hosts/leadership.py) runs the autoscaler, and the others serve the placements it
posts (executors/hosts/scaling_board.py).

    python -m executors.hosts.local_gateway --dir D --rundir R --incarnation 0 --listen-fd 3 --control-fd 4
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import logging
import os
import signal
import socket
import time
from functools import partial
from pathlib import Path

from executors import tracing
from executors.gateway.app import Gateway, make_app
from executors.gateway.builds import build_on
from executors.gateway.deploys import LoadFailed
from executors.gateway.dispatcher import Dispatcher
from executors.gateway.durability import StoreWatch, registry_if_intact
from executors.gateway.http_server import drain, serve
from executors.gateway.liveness import watch_liveness
from executors.gateway.metrics import Metrics
from executors.hosts.cluster_config import CONFIG_ENV, ClusterConfig
from executors.hosts.control import Channel
from executors.hosts.leadership import StoreLease, identity
from executors.hosts.registry_follow import RegistryFollower
from executors.hosts.scaling import ScalingLoop
from executors.hosts.scaling_board import ScalingBoard
from executors.hosts.supervisor import ADMIN_TOKEN_ENV, exit_reason, log_handlers
from executors.plans import cluster_key
from executors.wire.frames import WireError
from executors.worker.watchdog import EXIT_RECYCLED
from kvs import KVS

log = logging.getLogger("flowserve.cluster")
QID_BLOCK = 1 << 40  # each gateway start takes its own range of request and query ids
HELLO_TIMEOUT_S = 30.0
REGISTRY_POLL_S = 0.5  # several gateways: how often each reads the registry for the others' deploys


class ClusterGateway:
    def __init__(
        self,
        config: ClusterConfig,
        *,
        dir_: Path,
        rundir: Path,
        incarnation: int,
        kvs_url: str,
        admin_token: str,
        control: socket.socket,
    ):
        self.config = config
        self.dir = dir_
        self.logdir = dir_ / "logs"
        self.incarnation = incarnation
        tracing.setup(config.tracing, "flowserve-gateway")  # None: off (executors/tracing.py)
        self.store = KVS.from_url(kvs_url, signing_key=cluster_key())
        self.metrics = Metrics()
        first = incarnation * QID_BLOCK + 1
        self.dispatcher = Dispatcher(
            f"ipc://{rundir}/gateway-{incarnation}.ipc",
            config.max_retries,
            self.metrics,
            colocate=config.colocate,
            busy_poll_ms=config.busy_poll_ms,
            first_id=first,
        )
        self.dispatcher.next_qid = incarnation * QID_BLOCK  # the first gateway's from 0, as flow.run's
        self.dispatcher.wait_for_restarts = config.restart_executors
        self.gateway = Gateway(
            self.dispatcher,
            self.store,
            admin_token=admin_token,
            metrics=self.metrics,
            **config.gateway_options(),
        )
        self.gateway.host_status = self.status
        self.gateway.deploys.on_served = lambda name, version: self.channel.send(
            {"served": {"flow": name, "version": version}}
        )
        # one of the cluster's gateways runs the control loop: the one holding this lease
        self.lease = StoreLease(self.store.redis, identity(f"gateway{incarnation}"))
        self.scaling = ScalingLoop(
            lambda: self.dispatcher,
            self,
            config.autoscaling,  # None: only flows served under an SLO are tuned
            metrics=self.metrics,
            max_executors=config.max_executors,
            lease=self.lease,
            board=ScalingBoard(self.store.redis),
            gateway_id=self.lease.identity,
        )
        self.follower = RegistryFollower(self.gateway)
        self.gateway.shape_placement = self.scaling.initial_placement
        self.gateway.scaling_status = self.scaling.status
        self.scaling.monitor = self.gateway.slo
        self.scaling.serve_replan = self.gateway.deploys.serve_replan  # the tuner's re-plans
        self.channel = Channel(control, self._on_control)
        self.procs: dict[str, dict] = {}  # executor id -> what the supervisor said of its process
        self.extras: list[str] = []  # executors started for the autoscaler
        self.hello: dict = {}
        self._hello = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._leading: list[asyncio.Task] = []  # the lease and the control loop

    def run(self, listener: socket.socket) -> None:
        app = make_app(self.gateway, on_startup=[self._started], on_shutdown=[self._stopping])
        try:
            serve(app, self.gateway, self.config, sockets=[listener])
        finally:
            self.store.close()

    async def _started(self) -> None:
        loop = asyncio.get_running_loop()
        self.dispatcher.start()
        self._tasks.append(loop.create_task(self._control()))
        await asyncio.wait_for(self._hello.wait(), HELLO_TIMEOUT_S)
        for ex in self.hello["executors"]:
            self.dispatcher.add_executor(ex["id"], ex["address"], ex["device"])
            self.procs[ex["id"]] = ex
            if ex["extra"]:
                self.extras.append(ex["id"])
            if not ex["alive"]:
                self.dispatcher.executors[ex["id"]].alive = False
        # the newest version of each flow this cluster has served: a registry rolled back to
        # an older one (by someone with the store's password) is not served after a restart
        self.gateway.deploys.served_high.update(self.hello.get("served", {}))
        await self._wait_executors()
        self._tasks.append(
            loop.create_task(
                watch_liveness(
                    self.dispatcher,
                    self.config.stuck_grace_s,
                    on_silent=self._silent,
                    running=self._running,
                    still=lambda: self.gateway.accepting,
                )
            )
        )
        self._tasks.append(
            loop.create_task(StoreWatch(self.store, self.dispatcher, self.config.load_timeout_s).run())
        )  # durability.py: re-publish into a store that restarted empty
        self._leading = [loop.create_task(self.lease.run()), loop.create_task(self.scaling.run())]
        await self._restore_flows()
        if self.hello.get("gateways", 1) > 1:
            self._tasks.append(loop.create_task(self._follow_registry()))
        self.gateway.ready = True
        self.channel.send({"ready": True})
        log.info(
            "gateway %d (pid %d) serving: %d executors, %d flows",
            self.incarnation,
            os.getpid(),
            len(self.dispatcher.executors),
            len(self.dispatcher.flows),
        )

    async def _control(self) -> None:
        await self.channel.run()
        if self.gateway.accepting:
            # the supervisor is gone (it never leaves its gateway behind on purpose)
            log.error("the cluster's supervisor is gone; stopping")
            os.kill(os.getpid(), signal.SIGTERM)

    def _running(self, id_: str) -> bool:
        return bool(self.procs.get(id_, {}).get("alive"))

    async def _wait_executors(self) -> None:
        """Wait (bounded) for the executors to answer. One that does not is left to the
        liveness watch, which has it killed and restarted: never a reason not to serve."""
        ids = [i for i in self.dispatcher.executors if self._running(i)]
        pongs = await asyncio.gather(
            *(
                self.dispatcher.ping(self.dispatcher.executors[i].address, 60, still_worth_it=partial(self._running, i))
                for i in ids
            )
        )
        for id_, pong in zip(ids, pongs):
            if pong is None:
                log.error("executor %s did not answer within 60 s; see %s", id_, self.logdir / f"{id_}.log")
                self.dispatcher.executors[id_].alive = False

    async def _restore_flows(self) -> None:
        """Serve what the registry lists: after a gateway restart the executors still hold
        the flows built (a Load of a built stage is a no-op there); after `flowserve down`
        then `up` on a persisted store they build them again. A flow that cannot be built
        any more (its code changed underneath, a model is gone) is logged and skipped."""
        read_at = time.monotonic()
        registry = await asyncio.to_thread(registry_if_intact, self.store.redis)
        for name, version in sorted((registry or {}).items()):
            high = self.gateway.deploys.served_high.get(name, version)
            if version < high:
                log.error(
                    "the registry names flow %s v%s, older than v%s which this cluster served: a registry "
                    "rolled back by someone with the store's password? serving v%s",
                    name,
                    version,
                    high,
                    high,
                )
                version = high
            try:
                await self.gateway.deploys.load_flow(name, version)
                log.info("flow %s v%s restored from the store", name, version)
            except LoadFailed as e:
                log.warning("flow %s v%s is registered but could not be restored: %s", name, version, e.message)
        if registry is not None:  # and the canaries and shadows the store records (rollouts.py)
            await self.gateway.deploys.registry_seen(registry, read_at)

    async def _follow_registry(self) -> None:
        """Serve what the other gateways deploy and undeploy (they share the registry)."""
        failing = False
        while True:
            await asyncio.sleep(REGISTRY_POLL_S)
            try:
                read_at = time.monotonic()
                registry = await asyncio.to_thread(registry_if_intact, self.store.redis)
                if registry is None:
                    continue  # the store restarted empty: StoreWatch re-publishes, then it is read again
                await self.follower.changed(registry, read_at)
                await self.gateway.deploys.registry_seen(registry, read_at)
                failing = False
            except Exception as e:  # the store may be restarting: keep serving what is served
                if not failing:
                    log.warning("reading the registry failed (%s); retrying", e)
                failing = True

    async def _stopping(self) -> None:
        """Graceful stop: hand the control loop over, refuse new requests, let in-flight
        ones finish (bounded)."""
        for task in self._leading:
            task.cancel()
        await self.lease.resign()
        await drain(self.gateway, self.config.request_timeout_s)
        for task in self._tasks:
            task.cancel()

    # -- what the supervisor says -----------------------------------------------------------------

    async def _on_control(self, msg: dict) -> None:
        if "hello" in msg:
            self.hello = msg["hello"]
            self._hello.set()
            return
        event, id_ = msg.get("event"), msg.get("id")
        if event == "exited":
            self.procs.setdefault(id_, {}).update(alive=False, last_exit=exit_reason(msg.get("code")))
            if getattr(self.dispatcher.executors.get(id_), "alive", False):
                self._executor_exited(id_, msg.get("code"), msg.get("running") or [])
        elif event == "started":
            proc = self.procs.setdefault(id_, {})
            proc.update(alive=True, restarts=proc.get("restarts", 0) + 1)
            if id_ in self.dispatcher.executors:  # a restart (a new one is added by add_executor)
                asyncio.get_running_loop().create_task(self._rejoin(id_))
        elif event == "start_failed":
            self.procs.setdefault(id_, {}).update(alive=False, last_exit=msg.get("reason"))
        elif event == "added":  # started for the autoscaler, at any gateway's call
            self._added(msg["executor"])
        elif event == "removed":
            self._removed(id_)

    def _added(self, ex: dict) -> None:
        id_ = ex["id"]
        if id_ in self.dispatcher.executors:
            return
        self.procs[id_] = {"alive": True, "device": ex["device"], "restarts": 0}
        if id_ not in self.extras:
            self.extras.append(id_)
        self.dispatcher.add_executor(id_, ex["address"], ex["device"])

    def _removed(self, id_: str) -> None:
        """An extra executor stopped (the leader found it idle): requests of this gateway
        still on it, if any, re-run on the others."""
        if id_ in self.extras:
            self.extras.remove(id_)
        self.procs.pop(id_, None)
        if id_ in self.dispatcher.executors:
            self.dispatcher.executor_died(id_, reason="stopped")
            self.dispatcher.remove_executor(id_)

    def _executor_exited(self, id_: str, code: int | None, running: list) -> None:
        """Tell the dispatcher why an executor's process ended: it recycled itself (a stuck
        thread: nothing to blame) or it crashed (its blackbox says which requests were
        running: those are the suspects of a poison input)."""
        info = self.dispatcher.executors[id_]
        if code == EXIT_RECYCLED:
            log.warning("executor %s recycled itself (a thread was stuck)", id_)
            info.recycled += 1
            self.metrics.recycles.labels(id_, "stuck").inc()
            self.dispatcher.executor_died(id_, reason="recycled")
            return
        how = exit_reason(code)
        if running:
            for r in running:
                log.error(
                    "executor %s crashed (%s) while running flow %s operator %r (stage %s) for request(s) %s, qid %s",
                    id_,
                    how,
                    r["flow"],
                    r["operator"],
                    r["stage"],
                    ",".join(str(q) for q, _ in r["requests"]),
                    r["qid"],
                )
        else:
            log.warning("executor %s died (%s) while running no request", id_, how)
        info.crashed += 1
        self.metrics.crashes.labels(id_).inc()
        self.dispatcher.executor_died(id_, running=running)

    async def _rejoin(self, id_: str) -> None:
        """A restarted executor: once it answers, build the stages placed on it again (its
        placement was kept; meanwhile requests avoid it for a flow whose build failed)."""
        info = self.dispatcher.executors.get(id_)
        if info is None or not await self.dispatcher.ping(info.address, 60, still_worth_it=partial(self._running, id_)):
            return
        await build_on(self.dispatcher, id_, partial(_placed_on, id_), self.config.load_timeout_s)
        self.dispatcher.executor_back(id_)

    async def _silent(self, id_: str) -> None:
        """An executor answered no ping for ``stuck_grace_s``: a C call that never releases
        the interpreter lock (a regular expression backtracking for ever) stops its own
        watchdog too. Killed, it goes the crash path: restarted, what it ran blamed."""
        log.error(
            "executor %s answered no ping for %.0f s (a thread holds the interpreter); killing it",
            id_,
            self.config.stuck_grace_s,
        )
        try:
            await self.channel.call("kill", id=id_, silent_s=self.config.stuck_grace_s)
        except (WireError, asyncio.TimeoutError) as e:
            log.error("could not have executor %s killed: %s", id_, e)

    # -- the autoscaler's backend (executors/hosts/scaling.py) --------------------------------------------

    async def add_executor(self, device: str) -> str | None:
        """Have the supervisor start one more executor, under this gateway's fencing token
        (the supervisor refuses a token that is not the current one); its id once it answers."""
        token = self.lease.fence()
        if token is None:
            return None  # another gateway leads now
        try:
            reply = await self.channel.call("add", device=device, fence=token)
        except (WireError, asyncio.TimeoutError) as e:
            log.warning("could not start an executor for the autoscaler: %s", e)
            return None
        id_ = reply["id"]
        self._added({"id": id_, "address": reply["address"], "device": device})
        if not await self.dispatcher.ping(reply["address"], 60, still_worth_it=partial(self._running, id_)):
            log.warning("new executor %s did not start", id_)
            await self.remove_executor(id_)
            return None
        log.warning("started executor %s for the autoscaler", id_)
        return id_

    def removable(self) -> list[str]:
        return list(self.extras)

    async def remove_executor(self, executor_id: str) -> None:
        """Stop an executor the autoscaler no longer needs (it hosts nothing)."""
        if executor_id not in self.extras:
            return
        try:
            await self.channel.call("remove", id=executor_id, fence=self.lease.fence())
        except (WireError, asyncio.TimeoutError) as e:
            log.warning("could not stop executor %s: %s", executor_id, e)
            return
        self._removed(executor_id)
        log.warning("stopped idle executor %s", executor_id)

    # -- status -------------------------------------------------------------------------------

    def status(self) -> dict:
        """What /healthz adds about this cluster's processes."""
        return {
            "gateway": {
                "pid": os.getpid(),
                "slot": self.hello.get("slot", 0),
                "incarnation": self.incarnation,
                "restarts": self.hello.get("restarts", 0),
                "last_exit": self.hello.get("last_exit"),
            },
            "gateways": self.hello.get("gateways", 1),
            "control": self.lease.status(),  # whether this gateway runs the control loop
            # executors not serving (dead, or restarted and not answering yet), and why
            "down": {
                id_: self.procs.get(id_, {}).get("last_exit") or "starting"
                for id_, info in self.dispatcher.executors.items()
                if not info.alive
            },
        }


def _placed_on(executor_id: str, flow) -> list[str]:
    """The stages of ``flow`` placed on ``executor_id``."""
    return [stage for stage, ids in flow.placement.items() if executor_id in ids]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m executors.hosts.local_gateway", description="The gateway process of a local cluster."
    )
    p.add_argument("--dir", required=True, help="the cluster's directory (logs)")
    p.add_argument("--rundir", required=True, help="the cluster's socket directory")
    p.add_argument("--incarnation", type=int, required=True, help="which start of the gateway this is (0: the first)")
    p.add_argument("--listen-fd", type=int, required=True, help="the inherited listening socket")
    p.add_argument("--control-fd", type=int, required=True, help="the inherited end of the control channel")
    args = p.parse_args(argv)
    dir_ = Path(args.dir)
    faulthandler.enable()  # a crash in C code leaves the Python stack in the gateway's log
    logging.basicConfig(
        level=os.environ.get("FLOWSERVE_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        handlers=log_handlers(dir_ / "cluster.log")[:1],
    )
    config = ClusterConfig.from_json(json.loads(os.environ.get(CONFIG_ENV) or "{}"))
    listener = socket.socket(fileno=args.listen_fd)
    control = socket.socket(fileno=args.control_fd)
    gw = ClusterGateway(
        config,
        dir_=dir_,
        rundir=Path(args.rundir),
        incarnation=args.incarnation,
        kvs_url=os.environ["FLOWSERVE_KVS_URL"],
        admin_token=os.environ[ADMIN_TOKEN_ENV],
        control=control,
    )
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))  # uvicorn stops on SIGINT
    t0 = time.monotonic()
    try:
        gw.run(listener)
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the SIGINT it stopped on, once it has shut down: a clean stop
    log.info("gateway %d stopped after %.0f s", args.incarnation, time.monotonic() - t0)


if __name__ == "__main__":
    main()
