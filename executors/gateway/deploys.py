"""Deploying: building a registered plan's stages on the executors and serving it, the
admin routes (``POST /admin/deploy``, ``DELETE /admin/flows/{name}``) and the SLO tuner's
re-plans. A deploy with ``canary`` or ``shadow`` serves its version beside the served one
instead (rollouts.py).

Deploys of one name may race (here or on other gateways). Versions decide: the registry
and the served flow only ever move to a newer version, so a deploy whose version is older
than one already registered or served answers 409 and is not served. A gateway never
loads a version older than the newest it has served (``served_high``): the store's
password is enough to point the registry at an old version, whose plan is genuinely
signed for its key; only state outside the store can tell that apart from a deploy.
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from executors.codec.bodies import BadRequestError
from executors.errors import (
    DeployError,
    encode_error,
    error_doc,
    http_error,
    http_error_for,
    status_for,
    status_for_name,
)
from executors.gateway.liveness import RECENT_S
from executors.gateway.records import DeployedFlow
from executors.gateway.status import describe, error_response
from executors.plans import DEPLOYED_KEY, register_deployed
from flow.errors import FlowError
from kvs.errors import SerializationError, store_problem

log = logging.getLogger("flowserve.gateway")


class Deploys:
    """The flows a gateway serves, and how they get there."""

    def __init__(self, gateway):
        self.g = gateway
        self.dispatcher = gateway.dispatcher
        self.store = gateway.store
        self.load_timeout_s = gateway.load_timeout_s
        self.max_request_timeout_s = gateway.max_request_timeout_s
        # flow -> when this gateway last deployed/undeployed it (monotonic): a registry read
        # that started earlier is stale for that flow (standalone.py)
        self.changed_at: dict[str, float] = {}
        self.served_high: dict[str, int] = {}  # flow -> the newest version served here
        self.on_served = None  # (name, version) -> None: the host keeps served_high past restarts
        # what readiness names (readiness.py): loads in progress, flow -> (version, whether the
        # registry lists it: a host's restore or sync, not a deploy still to be registered),
        # and registered versions that failed to load here, flow -> (version, why)
        self.loading: dict[str, tuple[int, bool]] = {}
        self.unserved: dict[str, tuple[int, str]] = {}

    async def load_flow(
        self, name: str, version: int, install_if=None, install: bool = True, listed: bool | None = None
    ) -> DeployedFlow:
        """Place a registered plan on the executors and build its stages there; the flow
        is served from then on (unless ``install_if()``, asked once it is built, says it
        has become stale, or ``install`` is False: the caller installs it). A version
        older than the one served is not installed (``LoadFailed`` 409), and one older
        than any this gateway has served is not even loaded (``served_high``); replicas
        built for nothing are released. Raises ``LoadFailed`` with the HTTP status to answer.
        ``listed``: whether the registry lists this version already (default: ``install``,
        as for a host's restore or sync); readiness waits for such a load and names one that
        failed (readiness.py)."""
        listed = install if listed is None else listed
        self.loading[name] = (version, listed)
        try:
            return await self._load_flow(name, version, install_if, install)
        except LoadFailed as e:
            if listed:
                self.unserved[name] = (version, e.message)
            raise
        finally:
            if self.loading.get(name, (None,))[0] == version:
                del self.loading[name]

    async def _load_flow(self, name: str, version: int, install_if, install: bool) -> DeployedFlow:
        from executors.gateway.placement import place

        candidate = self.dispatcher.candidates.get(name)
        if install and candidate is not None and candidate.version == version:
            # promoted on another gateway: the candidate built here is that version already
            if install_if is None or install_if():
                self.install(name, candidate)
            return candidate
        high = self.served_high.get(name)
        if high is not None and version < high:
            message = (
                f"flow {name!r}: refusing to load v{version}, older than v{high} which this gateway has "
                "served (a registry rolled back by someone with the store's password?); "
                "re-deploy to serve that code again as a new version"
            )
            log.error("%s", message)
            raise LoadFailed("DeployConflict", message)
        try:
            plan, blob = await asyncio.to_thread(read_plan, self.store, name, version)
        except SerializationError as e:  # there, but refused (another flow's or version's, or forged)
            log.error("flow %s v%s: %s", name, version, e)
            raise LoadFailed("UnknownPlan", f"flow {name!r} version {version} cannot be loaded: {e}") from None
        except FlowError as e:
            raise LoadFailed("UnknownPlan", f"flow {name!r} version {version} is not registered: {e}") from None
        if not self.dispatcher.answering(RECENT_S):
            down = (self.g.host_status() if self.g.host_status is not None else {}).get("down") or {}
            why = "; ".join(f"{i}: {reason}" for i, reason in sorted(down.items()))
            raise LoadFailed(
                "NoExecutor",
                f"flow {name!r} v{version}: no executor answers to build it on"
                + (f" ({why}; they are being restarted)" if why else ""),
            )
        try:
            placement = place(plan, self.dispatcher.executors)
        except FlowError as e:
            raise LoadFailed.of(e) from None
        if self.g.shape_placement is not None:
            placement = self.g.shape_placement(plan, placement)
        flow = DeployedFlow(plan, version, placement, plan_blob=blob)
        errors = await self.dispatcher.load(name, version, placement, self.load_timeout_s)
        failed = {k: v for k, v in errors.items() if v}
        if failed:
            self.dispatcher.retire(flow)  # the executors that did build it must not keep it
            raise LoadFailed.of(DeployError(f"flow {name!r} v{version}: building stages failed: {failed}"))
        if not install:
            return flow
        if install_if is not None and not install_if():
            self.dispatcher.retire(flow)
            return flow
        self.install(name, flow)
        return flow

    def install(self, name: str, flow: DeployedFlow) -> None:
        """Serve ``flow`` now, unless a newer version is served (``LoadFailed`` 409); a
        rollout it makes stale ends (rollouts.py)."""
        served = self.dispatcher.install(name, flow)
        if served is not None and served.version != flow.version:  # the same version again: served
            raise LoadFailed("DeployConflict", _conflict(name, flow.version, served.version))
        if self.unserved.get(name, (flow.version,))[0] <= flow.version:
            self.unserved.pop(name, None)
        self.g.rollouts.installed(name, flow)
        self.served_high[name] = max(self.served_high.get(name, flow.version), flow.version)
        if self.on_served is not None:
            self.on_served(name, self.served_high[name])
        log.info("deployed flow %s v%s", name, flow.version)

    async def deploy(self, request: Request) -> Response:
        try:
            doc = await request.json()
            name, version = str(doc["flow"]), int(doc["version"])
        except (ValueError, KeyError, TypeError):
            return error_response(
                http_error_for(
                    BadRequestError('body must be {"flow": name, "version": n} (and "canary": share or "shadow": true)')
                )
            )
        try:
            rollout = self.g.rollouts.mode_of(doc)
        except BadRequestError as e:
            return error_response(http_error_for(e))
        if rollout is not None:  # beside the served version, not instead of it
            return await self.g.rollouts.start(name, version, *rollout)
        # Deploys of one name may race (here or on other gateways). Versions decide: the
        # registry and the served flow only ever move to a newer version, so a deploy whose
        # version is older than one already registered or served answers 409 and is not
        # served; the last deploy acknowledged is the newest, and it is what is served.
        served = self.dispatcher.flows.get(name)
        if served is not None and served.version > version:
            return error_response(
                http_error("DeployConflict", _conflict(name, version, served.version), winner=served.version)
            )
        try:
            flow = await self.load_flow(name, version, install=False)
        except LoadFailed as e:
            return error_response(e.answer())
        asked = flow.plan.timeout_s
        if asked is not None and asked > self.max_request_timeout_s:
            self.dispatcher.retire(flow)
            return error_response(
                http_error_for(
                    BadRequestError(
                        f"flow {name!r}: timeout_s {asked:g} is over the cluster's max_request_timeout_s "
                        f"{self.max_request_timeout_s:g}"
                    )
                )
            )
        try:  # every gateway of the cluster serves what the registry lists (membership.py)
            registered = await self.record_change(name, register_deployed, self.store.redis, name, version)
        except Exception as e:  # whatever the store answered (MISCONF, a lost connection): not registered
            # not served either: a flow served but not registered would be gone after a
            # gateway restart, and other gateways would never serve it
            self.dispatcher.retire(flow)
            log.error("flow %s v%s: deploy failed, the store did not register it: %s", name, version, e)
            return error_response(
                http_error(
                    "StoreUnavailable",
                    f"flow {name!r} v{version} was not deployed: the store could not register it ({store_problem(e)})",
                )
            )
        if registered != version:
            self.dispatcher.retire(flow)
            return error_response(http_error("DeployConflict", _conflict(name, version, registered), winner=registered))
        try:
            self.install(name, flow)
        except LoadFailed as e:
            return error_response(e.answer(winner=self.dispatcher.flows[name].version))
        replaced = None if served is None else served.version
        await self._record_action(name, {"action": "deploy", "version": version, "replaced": replaced})
        return JSONResponse(describe(flow, self.dispatcher))

    async def _record_action(self, name: str, event: dict) -> None:
        """Record a change of the served version in the flow's history (rollouts.py): what a
        rollback goes back from. Best effort: the change is served and registered already."""
        try:
            await asyncio.to_thread(self.g.rollouts.record_served, name, event)
        except Exception as e:  # whatever the store answered: only the history lacks it
            log.warning(
                "flow %s: could not record %s of v%s in its history: %s", name, event["action"], event["version"], e
            )

    async def serve_replan(self, plan) -> DeployedFlow:
        """Serve ``plan``, a re-planned configuration of a flow served here (the SLO
        tuner's, executors/hosts/scaling.py), as the flow's next version: stored, built on the
        executors ``place`` picks, installed (requests in flight finish on the old one)
        and registered. Raises ``LoadFailed`` as a deploy would."""
        from executors.plans import PLAN_KEY, next_version

        name = plan.flow_name
        version = await asyncio.to_thread(next_version, self.store.redis, name)
        await asyncio.to_thread(self.store.put_trusted, PLAN_KEY.format(flow=name, version=version), plan)
        before = self.dispatcher.flows.get(name)
        flow = await self.load_flow(name, version, listed=False)
        replaced = None if before is None else before.version
        await self._record_action(name, {"action": "replan", "version": version, "replaced": replaced})
        try:
            await self.record_change(name, register_deployed, self.store.redis, name, version)
        except Exception as e:  # the re-plan serves here already; the registry is for other gateways
            log.warning("flow %s v%s (re-planned) serves here but is not registered for others: %s", name, version, e)
        return flow

    async def undeploy(self, request: Request) -> Response:
        name = request.path_params["name"]
        self.unserved.pop(name, None)
        if self.dispatcher.uninstall(name) is None:  # its replicas go once its requests finish
            return error_response(http_error("UnknownFlow", f"no deployed flow named {name!r}"))
        await self.g.rollouts.undeployed(name)
        try:
            await self.record_change(name, self.store.redis.hdel, DEPLOYED_KEY, name)
        except Exception as e:  # it is undeployed here either way; the registry is for other gateways
            log.warning("flow %s: could not remove it from the registry: %s", name, e)
        return JSONResponse({"undeployed": name})

    async def registry_seen(self, registry: dict[str, int], read_at: float) -> None:
        """A host read the registry (flow -> version) at ``read_at`` (monotonic) and served
        what it lists: forget the failures of flows it no longer lists, and serve the
        candidates the store records (rollouts.py)."""
        for name in [n for n in self.unserved if n not in registry]:
            if self.changed_at.get(name, float("-inf")) < read_at:
                del self.unserved[name]
        await self.g.rollouts.sync(read_at)

    async def record_change(self, name: str, write, *args):
        """Run the registry ``write`` for a deploy/undeploy served here. A registry read
        that started before the write finished may not show it, so the change is stamped
        both before and after the write: such a read is then older than the change."""
        self.changed_at[name] = time.monotonic()
        try:
            return await asyncio.to_thread(write, *args)
        finally:
            self.changed_at[name] = time.monotonic()


def read_plan(store, name: str, version: int) -> tuple:
    """The plan of ``name`` v``version`` and its stored bytes (kept to re-publish it,
    durability.py). Its signature must be bound to its key, so to this flow and version,
    and the plan must name this flow: a plan copied from elsewhere is refused."""
    from executors.plans import PLAN_KEY, checked_plan
    from kvs.client import decode_value
    from kvs.errors import KeyNotFoundError

    key = PLAN_KEY.format(flow=name, version=version)
    blob = store.get_bytes(key)
    if blob is None:
        raise KeyNotFoundError(key)
    plan = decode_value(key, blob, trusted=True, signing_key=store.signing_key)
    return checked_plan(plan, name, key), blob


def _conflict(name: str, version: int, winner: int) -> str:
    return (
        f"flow {name!r}: deploy of v{version} lost to a concurrent deploy of v{winner}, "
        f"which is served; v{version} is not"
    )


class LoadFailed(Exception):
    """A flow version could not be loaded (404 unknown plan, 409 a newer version won,
    500 building failed, 503 no executor); ``answer()`` is the HTTP answer to give."""

    def __init__(self, error: str, message: str, status: int | None = None):
        super().__init__(message)
        self.error, self.message = error, message
        self.status = status_for_name(error) if status is None else status

    @classmethod
    def of(cls, error: BaseException) -> LoadFailed:
        return cls(type(error).__name__, str(error), status_for(error))

    def answer(self, **extra) -> tuple[int, bytes]:
        return self.status, encode_error(error_doc(self.error, self.message, **extra))
