"""A gateway that starts nothing: it finds its executors, and the flows to serve, in the KVS.

This is the gateway of a Kubernetes deployment (or of any cluster whose executors are
not the gateway's children). Executors register themselves (``membership.py``); every
``poll_s`` the gateway adds the ones that joined (after a ping), builds the deployed
flows' stages on them, and drops the ones whose registration expired, re-running the
requests they held. It loads every flow the registry lists, so gateway replicas behind
one Service all serve the same flows, whichever of them took the deploy. If the KVS
restarts empty, it re-publishes the flows it serves (durability.py) instead of reading
the empty registry as "everything was undeployed".

With ``--autoscale`` every replica runs the control loop and one decides: the holder of a
lease (executors/hosts/leadership.py), by default a lock in the KVS (``--leader-election
store``); a deploy target may offer its own (``k8s``: a coordination.k8s.io Lease). The
others follow the placements it posts (executors/hosts/scaling_board.py), and its executor
backend acts only under its current fencing token (``FencedBackend``).

    FLOWSERVE_ADMIN_TOKEN=... python -m executors.hosts.standalone --host 0.0.0.0 --port 8000 \\
        --address tcp://10.0.0.7:5556 --kvs redis://:pw@kvs:6379/0 --membership kvs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping

from executors import tracing
from executors.gateway.app import Gateway, make_app
from executors.gateway.builds import build_on
from executors.gateway.dispatcher import Dispatcher
from executors.gateway.durability import mark_started, registry_if_intact, republish
from executors.gateway.http_server import drain, serve
from executors.gateway.liveness import watch_liveness
from executors.gateway.metrics import Metrics
from executors.gateway.placement import place
from executors.hosts.autoscale import AutoscalingConfig
from executors.hosts.cluster_config import ClusterConfig
from executors.hosts.leadership import Fence, Lease, StoreLease, identity
from executors.hosts.registry_follow import RegistryFollower
from executors.hosts.scaling import FencedBackend, FixedExecutors, ScalingLoop
from executors.hosts.scaling_board import ScalingBoard
from executors.plans import cluster_key
from executors.wire.membership import GATEWAYS_KEY, Absence, live_members
from kvs import KVS
from kvs.retry import Backoff, retry_async

log = logging.getLogger("flowserve.gateway")
QID_BLOCK = 1 << 40  # each gateway start takes its own range of query ids

# How a deploy target plugs its executors into the autoscaler: given the gateway's
# dispatcher, the backend that adds and removes executors (executors/hosts/scaling.py's
# interface). k8s/gateway.py passes Kubernetes' one; the runtime never imports a target.
ScalerFactory = Callable[[Dispatcher], object]
ScalerOption = Callable[[argparse.Namespace], ScalerFactory]
# How a deploy target offers a lease to elect the replica that runs the control loop: given
# this process's identity and the store's fencing counter, the lease (blocking: it may
# read its credentials). k8s/gateway.py offers Kubernetes' Lease.
LeaseFactory = Callable[[str, Fence], Lease]
LeaseOption = Callable[[argparse.Namespace], LeaseFactory]


class StandaloneGateway:
    def __init__(
        self,
        config: ClusterConfig,
        *,
        kvs_url: str,
        address: str,
        admin_token: str,
        autoscaling: AutoscalingConfig | None = None,
        scaler: ScalerFactory | None = None,
        lease: LeaseFactory | None = None,
        poll_s: float = 0.5,
        grace_s: float = 1.5,
    ):
        self.config = config
        self.address = address
        self.store = KVS.from_url(kvs_url, signing_key=cluster_key())  # $FLOWSERVE_CLUSTER_KEY, if set
        self.metrics = Metrics()
        self.poll_s = poll_s
        self.absence = Absence(grace_s)
        self.incarnations: dict[str, str] = {}  # executor id -> the process it was when it joined
        self.dispatcher = Dispatcher(
            address, config.max_retries, self.metrics, colocate=config.colocate, busy_poll_ms=config.busy_poll_ms
        )
        self.gateway = Gateway(
            self.dispatcher,
            self.store,
            admin_token=admin_token,
            metrics=self.metrics,
            **config.gateway_options(),
        )
        self.scaler = scaler
        self.lease_factory = lease  # None: a lock in the KVS
        self.lease: Lease | None = None
        self.follower = RegistryFollower(self.gateway)
        self.scaling = None
        if autoscaling is not None:
            self.scaling = ScalingLoop(
                lambda: self.dispatcher,
                FixedExecutors(),
                autoscaling,
                metrics=self.metrics,
                max_executors=config.max_executors,
                board=ScalingBoard(self.store.redis),
            )
            self.gateway.shape_placement = self.scaling.initial_placement
            self.gateway.scaling_status = self.scaling.status
            self.scaling.monitor = self.gateway.slo  # SLO flows: the tuner's arrival envelope
            self.scaling.serve_replan = self.gateway.deploys.serve_replan  # the tuner's re-plans
            self.gateway.host_status = lambda: {"control": self.lease.status() if self.lease is not None else None}
        self._tasks: list[asyncio.Task] = []
        self._control: list[asyncio.Task] = []  # the lease and the control loop

    def app(self):
        return make_app(self.gateway, on_startup=[self._started], on_shutdown=[self._stopping])

    def run(self, host: str, port: int) -> None:
        try:
            serve(self.app(), self.gateway, self.config, host=host, port=port)
        finally:
            self.store.close()

    async def _started(self) -> None:
        self.dispatcher.start()
        await self._when_kvs_answers(lambda: mark_started(self.store.redis))  # kvs/markers.py
        # query ids stay unique across gateway replicas and restarts
        block = await self._when_kvs_answers(lambda: self.store.redis.incr(GATEWAYS_KEY))
        self.dispatcher.next_qid = int(block) * QID_BLOCK
        await self._when_kvs_answers(self.sync)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._watch()))
        # pongs say which executors answer (health, readiness); a silent one is only logged:
        # its pod's own liveness probe restarts it
        self._tasks.append(loop.create_task(watch_liveness(self.dispatcher, self.config.stuck_grace_s)))
        self.gateway.ready = True
        if self.scaling is not None:
            fence = Fence(self.store.redis)
            self.lease = await self._lease(fence)
            self.scaling.lease = self.lease
            self.scaling.gateway_id = self.lease.identity
            self.scaling.backend = FencedBackend(await self._backend(), self.lease, fence)
            self._control = [loop.create_task(self.lease.run()), loop.create_task(self.scaling.run())]
        log.info(
            "gateway on %s: %d executors, %d flows",
            self.address,
            len(self.dispatcher.executors),
            len(self.dispatcher.flows),
        )

    async def _lease(self, fence: Fence) -> Lease:
        me = identity()
        if self.lease_factory is None:
            return StoreLease(self.store.redis, me)
        # a deploy target's lease may read its credentials: blocking calls
        return await asyncio.to_thread(self.lease_factory, me, fence)

    async def _backend(self):
        if self.scaler is None:
            return FixedExecutors()
        # a deploy target's backend may read its baseline from its API: blocking calls
        return await asyncio.to_thread(self.scaler, self.dispatcher)

    async def _when_kvs_answers(self, call):
        """``call()`` once the KVS answers: in a cluster the gateway may start before Redis."""
        return await retry_async(
            call,
            backoff=Backoff(0.2, 5.0),
            retry_if=lambda e: True,
            on_retry=lambda e, delay: log.warning("waiting for the KVS (%s); retrying in %.1f s", e, delay),
        )

    async def _stopping(self) -> None:
        if self.lease is not None:
            # hand the control loop over now, not when the lease runs out
            for task in self._control:
                task.cancel()
            await self.lease.resign()
        await drain(self.gateway, self.config.request_timeout_s)
        for task in self._tasks:
            task.cancel()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.sync()
            except Exception as e:  # the KVS may be restarting: keep the last known view
                log.warning("membership sync failed: %s", e)

    # -- membership and registry -------------------------------------------------------------

    async def sync(self) -> None:
        members = await asyncio.to_thread(live_members, self.store.redis)
        await self._members_changed(members)
        read_at = time.monotonic()
        registry = await asyncio.to_thread(registry_if_intact, self.store.redis)
        if registry is None:  # the store lost its state: an empty registry means nothing
            await self._republish()
            return
        await self.follower.changed(registry, read_at)
        await self.gateway.deploys.registry_seen(registry, read_at)  # failures to forget, canaries to serve

    async def _republish(self) -> None:
        """Put back what this gateway serves (plans, registry, version counters) into a
        store that restarted empty, then build the flows on executors that joined while it
        was empty (their loads failed): durability.py."""
        names = await asyncio.to_thread(
            republish, self.store, dict(self.dispatcher.flows), {GATEWAYS_KEY: self.dispatcher.next_qid // QID_BLOCK}
        )
        log.warning("the KVS lost its data (restarted empty); re-published flows %s", names)
        for id_, info in list(self.dispatcher.executors.items()):
            if info.alive:
                await self._extend_flows(id_)

    async def _members_changed(self, members: dict) -> None:
        d = self.dispatcher
        known = {i for i, info in d.executors.items() if info.alive}
        # a new address, or the same pod's container restarted (same name and IP, new process)
        moved = {
            i
            for i in known
            if i in members
            and (
                members[i].address != d.executors[i].address
                or members[i].incarnation != self.incarnations.get(i, members[i].incarnation)
            )
        }
        for id_ in self.absence.gone(known, set(members) - moved, time.monotonic()) + sorted(moved):
            log.warning("executor %s left the cluster", id_)
            self._leave(id_)
        for id_, m in members.items():
            info = d.executors.get(id_)
            if info is not None and info.alive and info.address == m.address:
                continue
            if await d.ping(m.address, timeout=2.0) is None:
                continue  # registered but not answering yet: try again next round
            d.remove_executor(id_)  # a restarted pod may reuse its name with a new address
            d.add_executor(id_, m.address, m.device)
            self.incarnations[id_] = m.incarnation
            log.warning("executor %s joined (%s, %s)", id_, m.device, m.address)
            await self._extend_flows(id_)

    def _leave(self, id_: str) -> None:
        d = self.dispatcher
        for f in d.flows.values():
            for stage, ids in f.placement.items():
                if id_ in ids:
                    f.placement[stage] = [i for i in ids if i != id_]
        d.executor_died(id_)  # re-runs the requests it held
        d.remove_executor(id_)

    async def _extend_flows(self, id_: str) -> None:
        """Give a joining executor its share of the deployed flows' stages."""
        d = self.dispatcher

        def share(f) -> list[str]:
            wanted = place(f.plan, d.executors)
            stages = []
            for stage, ids in wanted.items():
                st = f.plan.stages[stage]
                scaled = self.scaling is not None and st.continuation is None and st.competitive == 1
                if id_ in ids and id_ not in f.placement[stage] and (not scaled or not f.placement[stage]):
                    stages.append(stage)
            return stages

        for f, stages in await build_on(d, id_, share, self.config.load_timeout_s):
            if d.flows.get(f.plan.flow_name) is f:  # not redeployed or undeployed meanwhile
                for s in stages:
                    f.placement[s] = f.placement[s] + [id_]


def main(
    argv=None,
    *,
    prog: str = "python -m executors.hosts.standalone",
    scalers: Mapping[str, ScalerOption] | None = None,
    leases: Mapping[str, LeaseOption] | None = None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """Run a standalone gateway. A deploy target adds its executor backends as ``scalers``
    (``--scaler NAME``: a function of the parsed arguments returning a ScalerFactory, or
    raising ValueError naming what is missing), its leases as ``leases``
    (``--leader-election NAME``, likewise returning a LeaseFactory) and the options they
    read (``add_arguments``)."""
    scalers = dict(scalers or {})
    leases = dict(leases or {})
    p = argparse.ArgumentParser(prog=prog, description="Run a FlowServe gateway that finds its executors in the KVS.")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--address",
        required=True,
        help="address executors send results to (ipc:///path or tcp://host:port), reachable by them, e.g. tcp://10.0.0.7:5556",
    )
    p.add_argument(
        "--kvs",
        default=os.environ.get("FLOWSERVE_KVS_URL"),
        help="the store's URL: redis://, rediss://, redis+sentinel:// or redis+cluster:// (default: $FLOWSERVE_KVS_URL)",
    )
    p.add_argument(
        "--membership", default="kvs", choices=["kvs"], help="how executors are found: their registration in the KVS"
    )
    p.add_argument("--config", default="{}", help="ClusterConfig fields as JSON (timeouts, limits, retries)")
    p.add_argument("--autoscale", default=None, help="AutoscalingConfig fields as JSON: scale stages")
    if scalers:
        p.add_argument(
            "--scaler",
            default=None,
            choices=sorted(scalers),
            help="with --autoscale: also add/remove executors through this backend",
        )
    p.add_argument(
        "--leader-election",
        default="store",
        choices=["store", *sorted(leases)],
        help="with --autoscale: how the replica that runs the control loop is elected (default: a lock in the KVS)",
    )
    if add_arguments is not None:
        add_arguments(p)
    p.add_argument("--poll-s", type=float, default=0.5, help="how often membership and registry are read")
    args = p.parse_args(argv)
    if not args.kvs:
        p.error("--kvs is required (or set FLOWSERVE_KVS_URL)")
    admin_token = os.environ.get("FLOWSERVE_ADMIN_TOKEN")
    if not admin_token:
        p.error("set FLOWSERVE_ADMIN_TOKEN: deploys need the cluster's admin token")
    scaler = lease = None
    try:
        if getattr(args, "scaler", None) is not None:
            scaler = scalers[args.scaler](args)
        if args.leader_election != "store":
            lease = leases[args.leader_election](args)
    except ValueError as e:
        p.error(str(e))
    try:
        fields = json.loads(args.config)
        if os.environ.get("FLOWSERVE_TOKEN"):
            fields["token"] = os.environ["FLOWSERVE_TOKEN"]
        config = ClusterConfig.from_json(fields)
        autoscaling = None if args.autoscale is None else AutoscalingConfig.from_json(json.loads(args.autoscale))
    except (ValueError, TypeError) as e:  # every config error is one (ConfigError: a ValueError)
        p.error(str(e))
    logging.basicConfig(
        level=os.environ.get("FLOWSERVE_LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    # traces (executors/tracing.py): the config's "tracing", else FLOWSERVE_TRACING as the executors read it
    if config.tracing is not None:
        tracing.setup(config.tracing, "flowserve-gateway")
    else:
        tracing.setup_from_env("flowserve-gateway")
    gw = StandaloneGateway(
        config,
        kvs_url=args.kvs,
        address=args.address,
        admin_token=admin_token,
        autoscaling=autoscaling,
        scaler=scaler,
        lease=lease,
        poll_s=args.poll_s,
    )
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))  # uvicorn stops on SIGINT
    try:
        gw.run(args.host, args.port)
    except KeyboardInterrupt:
        pass  # uvicorn re-raises the signal it stopped on once it has drained and shut down: a clean stop


if __name__ == "__main__":
    main()
