"""A gateway that starts nothing: it finds its executors, and the flows to serve, in the KVS.

This is the gateway of a Kubernetes deployment (or of any cluster whose executors are
not the gateway's children). Executors register themselves (``membership.py``); every
``poll_s`` the gateway adds the ones that joined (after a ping), builds the deployed
flows' stages on them, and drops the ones whose registration expired, re-running the
requests they held. It loads every flow the registry lists, so gateway replicas behind
one Service all serve the same flows, whichever of them took the deploy. If the KVS
restarts empty, it re-publishes the flows it serves (durability.py) instead of reading
the empty registry as "everything was undeployed".

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

from executors.gateway.app import Gateway, make_app
from executors.gateway.builds import build_on
from executors.gateway.deploys import LoadFailed
from executors.gateway.dispatcher import Dispatcher
from executors.gateway.durability import mark_started, registry_if_intact, republish
from executors.gateway.http_server import drain, serve
from executors.gateway.liveness import watch_liveness
from executors.gateway.metrics import Metrics
from executors.gateway.placement import place
from executors.hosts.autoscale import AutoscalingConfig
from executors.hosts.cluster_config import ClusterConfig
from executors.hosts.scaling import FixedExecutors, ScalingLoop
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
            token=config.token,
            admin_token=admin_token,
            max_body_bytes=config.max_body_bytes,
            request_timeout_s=config.request_timeout_s,
            max_request_timeout_s=config.max_request_timeout_s,
            load_timeout_s=config.load_timeout_s,
            metrics=self.metrics,
            public_metrics=config.public_metrics,
            max_rows=config.max_rows,
        )
        self.scaler = scaler
        self.scaling = None
        if autoscaling is not None:
            self.scaling = ScalingLoop(
                lambda: self.dispatcher,
                FixedExecutors(),
                autoscaling,
                metrics=self.metrics,
                max_executors=config.max_executors,
            )
            self.gateway.shape_placement = self.scaling.initial_placement
            self.gateway.scaling_status = self.scaling.status
            self.scaling.monitor = self.gateway.slo  # SLO flows: the tuner's arrival envelope
            self.scaling.serve_replan = self.gateway.deploys.serve_replan  # the tuner's re-plans
        self._failed_loads: dict[tuple[str, int], float] = {}  # (flow, version) -> retry after
        self._tasks: list[asyncio.Task] = []

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
        self.dispatcher.next_qid = int(block) * QID_BLOCK + 1
        await self._when_kvs_answers(self.sync)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._watch()))
        # pongs say which executors answer (health, readiness); a silent one is only logged:
        # its pod's own liveness probe restarts it
        self._tasks.append(loop.create_task(watch_liveness(self.dispatcher, self.config.stuck_grace_s)))
        self.gateway.ready = True
        if self.scaling is not None:
            self.scaling.backend = await self._backend()
            self._tasks.append(loop.create_task(self.scaling.run()))
        log.info(
            "gateway on %s: %d executors, %d flows",
            self.address,
            len(self.dispatcher.executors),
            len(self.dispatcher.flows),
        )

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
        await self._registry_changed(registry, read_at)

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

    async def _registry_changed(self, registry: dict[str, int], read_at: float) -> None:
        d = self.dispatcher

        def newer_here(name: str) -> bool:
            # a deploy or undeploy this gateway handled since the registry was read is newer
            # than what was read (checked at each step: loading a flow below takes a while)
            return self.gateway.deploys.changed_at.get(name, float("-inf")) >= read_at

        for name in [n for n in d.flows if n not in registry and not newer_here(n)]:
            log.warning("flow %s was undeployed", name)
            d.uninstall(name)  # its replicas go once its requests here finish
        now = time.monotonic()
        for name, version in sorted(registry.items()):
            if newer_here(name):
                continue
            current = d.flows.get(name)
            if (current is not None and current.version >= version) or self._failed_loads.get((name, version), 0) > now:
                continue
            try:
                await self.gateway.deploys.load_flow(name, version, install_if=lambda n=name: not newer_here(n))
            except LoadFailed as e:
                # e.g. no executor yet: try again, without flooding the log
                log.warning("flow %s v%s is not served here yet: %s", name, version, e.message)
                self._failed_loads[(name, version)] = now + 5.0


def main(
    argv=None,
    *,
    prog: str = "python -m executors.hosts.standalone",
    scalers: Mapping[str, ScalerOption] | None = None,
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
) -> None:
    """Run a standalone gateway. A deploy target adds its executor backends as ``scalers``
    (``--scaler NAME``: a function of the parsed arguments returning a ScalerFactory, or
    raising ValueError naming what is missing) and the options they read (``add_arguments``)."""
    scalers = dict(scalers or {})
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
        help="Redis URL of the cluster's KVS (default: $FLOWSERVE_KVS_URL)",
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
    if add_arguments is not None:
        add_arguments(p)
    p.add_argument("--poll-s", type=float, default=0.5, help="how often membership and registry are read")
    args = p.parse_args(argv)
    if not args.kvs:
        p.error("--kvs is required (or set FLOWSERVE_KVS_URL)")
    admin_token = os.environ.get("FLOWSERVE_ADMIN_TOKEN")
    if not admin_token:
        p.error("set FLOWSERVE_ADMIN_TOKEN: deploys need the cluster's admin token")
    scaler = None
    if getattr(args, "scaler", None) is not None:
        try:
            scaler = scalers[args.scaler](args)
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
    gw = StandaloneGateway(
        config,
        kvs_url=args.kvs,
        address=args.address,
        admin_token=admin_token,
        autoscaling=autoscaling,
        scaler=scaler,
        poll_s=args.poll_s,
    )
    signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))  # uvicorn stops on SIGINT
    gw.run(args.host, args.port)


if __name__ == "__main__":
    main()
