"""The HTTP gateway (Starlette under uvicorn): the API applications call.

    POST /flows/{name}      run a deployed flow on one row (object) or rows (list), or Arrow
    GET  /flows             deployed flows and their input schemas
    GET  /flows/{name}      the plan, per-stage replicas and recent latency
    GET  /healthz           liveness, and which executors answer
    GET  /readyz            readiness: 200 once every served flow has a replica that answers
    GET  /metrics           Prometheus text
    GET  /openapi.json      the contract, machine-readable
    POST /admin/deploy      (cluster token) load a registered plan onto executors
    DELETE /admin/flows/{name}   (cluster token) undeploy

A client may shorten its deadline with ``X-Request-Timeout: <seconds>``. Answers carry
``X-Qid-Start`` (row i of the request was given qid ``X-Qid-Start + i``) and
``X-Flowserve-Trace`` (JSON: ``[stage, executor, ms, batch size]`` per stage run).
Errors are JSON ``{"error": <type>, "message": ..., "operator"?, "qid"?}``, all made by
errors.py (``http_error``, ``http_error_for``), with status 400 (malformed body, schema
mismatch), 401 (token), 404 (unknown flow), 413 (body too large), 422 (an operator
rejected the row / no valid alternative / missing lookup key), 500 (an operator raised),
503 (no executor; the KVS lost its data), 504 (deadline). A deploy that lost a race to a
newer version of the same flow gets 409. No traceback reaches a client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import time

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from executors import jsontensors, shm
from executors.dispatcher import DeployedFlow, Dispatcher, RawBody, RequestFailed
from executors.docs_page import docs_routes
from executors.errors import (
    JSON_CONTENT_TYPE,
    DeployError,
    encode_error,
    error_doc,
    http_error,
    http_error_for,
    status_for,
    status_for_name,
)
from executors.feedback import feedback
from executors.httpcodec import (
    ARROW,
    OFF_LOOP_BYTES,
    OFF_LOOP_ROWS,
    WRITE_SLICE,
    BadRequestError,
    arrow_answer,
    arrow_pieces,
    input_table,
    is_json,
    json_pieces,
    json_rows,
    parse_body,
)
from executors.liveness import RECENT_S
from executors.membership import DEPLOYED_KEY, register_deployed
from executors.messages import Rendered
from executors.metrics import Metrics
from executors.openapi import openapi_document, type_doc
from executors.slo import SLOMonitor
from flow.exceptions import DataError, FlowError, OperatorOutputError
from flow.table import Table
from flow.types import ColumnType
from flow.validation import check_schema
from kvs.exceptions import SerializationError, store_problem

log = logging.getLogger("flowserve.gateway")


def _error(answer: tuple[int, bytes]) -> Response:
    """An error answer (``errors.http_error`` / ``http_error_for``) on a Starlette route."""
    status, body = answer
    return Response(body, status_code=status, media_type="application/json")


class Gateway:
    """Holds the dispatcher and the settings the HTTP handlers need."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        store,
        *,
        token: str | None,
        admin_token: str,
        max_body_bytes: int,
        request_timeout_s: float,
        load_timeout_s: float,
        metrics: Metrics,
        public_metrics: bool = False,
        max_rows: int = 1_000_000,
        max_request_timeout_s: float | None = None,
    ):
        self.dispatcher = dispatcher
        self.store = store
        self.token = token
        self.admin_token = admin_token
        self.public_metrics = public_metrics  # /metrics without the token (a scraper), when one is set
        # flow -> (version, output column types) from its first answer: OpenAPI shows them
        self.output_schemas: dict[str, tuple[int, dict]] = {}
        self.max_body_bytes = max_body_bytes
        self.max_rows = max_rows
        self.request_timeout_s = request_timeout_s
        # what X-Request-Timeout and a flow's timeout_s may ask for at most
        self.max_request_timeout_s = max_request_timeout_s or max(request_timeout_s, 300.0)
        self.load_timeout_s = load_timeout_s
        self.metrics = metrics
        self.accepting = True
        # flow -> when this gateway last deployed/undeployed it (monotonic): a registry read
        # that started earlier is stale for that flow (standalone.py)
        self.changed_at: dict[str, float] = {}
        # flow -> the newest version this gateway has served: it never loads an older one
        # again, whatever the registry (or a deploy call) names. The store's password is
        # enough to point the registry at an old version, whose plan is genuinely signed
        # for its key; only state outside the store can tell that apart from a deploy.
        self.served_high: dict[str, int] = {}
        self.on_served = None  # (name, version) -> None: the host keeps served_high past restarts
        self.shape_placement = None  # the autoscaler's hook: start stages on fewer replicas
        self.scaling_status = None  # the autoscaler's per-stage status, for describe()
        self.host_status = None  # what the host adds to /healthz (the local cluster's processes)
        self.ready = False  # set by the host once the flows it should serve are loaded (/readyz)
        self.slo = SLOMonitor(metrics)  # flows served under an SLO: attainment, arrival envelope

    # -- auth -------------------------------------------------------------------------

    @staticmethod
    def _bearer_ok(request: Request, token: str | None) -> bool:
        if not token:
            return True
        return _bearer_matches(request.headers.get("authorization", ""), token)

    # -- handlers -------------------------------------------------------------------------

    async def invoke(self, name: str, headers: dict[str, str], receive) -> tuple[int, bytes, list]:
        """POST /flows/{name}: (status, body, extra headers). ``headers`` has lower-case
        names; ``receive`` is the ASGI receive callable the body comes from.

        Every answer is counted once, here: ``requests_total`` by status, and errors (status
        >= 400) in ``errors_total`` too; names that are not deployed flows count as "-" (a
        client must not be able to grow the metrics with made-up names)."""
        status, body, extra = await self._invoke(name, headers, receive)
        # counted once the answer is written (the caller writes it in this same step of the
        # event loop, before any callback runs): counting is no part of the client's latency
        asyncio.get_running_loop().call_soon(self._count, name if name in self.dispatcher.flows else "-", status)
        return status, body, extra

    def _count(self, label: str, status: int) -> None:
        code = str(status)
        self.metrics.child(self.metrics.requests, label, code).inc()
        if status >= 400:
            self.metrics.child(self.metrics.errors, label, code).inc()

    async def _invoke(self, name: str, headers: dict[str, str], receive) -> tuple[int, bytes, list]:
        auth = headers.get("authorization", "")
        if self.token and not (_bearer_matches(auth, self.token) or _bearer_matches(auth, self.admin_token)):
            return _error_body(http_error("Unauthorized", "missing or wrong bearer token"))
        flow = self.dispatcher.flows.get(name)
        if flow is None:
            return _error_body(http_error("UnknownFlow", f"no deployed flow named {name!r}; GET /flows lists them"))
        if not self.accepting:
            status, body, extra = _error_body(
                http_error(
                    "ShuttingDown", "the gateway is shutting down; retry (another gateway, or this one once restarted)"
                )
            )
            return status, body, [*extra, (b"retry-after", b"1")]
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return _error_body(
                http_error("PayloadTooLarge", f"body of {declared} bytes is over the limit of {self.max_body_bytes}")
            )
        body = await _read_body(receive, self.max_body_bytes, _shared_size(headers, declared))
        if body is None:
            return _error_body(http_error("PayloadTooLarge", f"body is over the limit of {self.max_body_bytes} bytes"))
        t0 = time.perf_counter()
        raw = table = None
        if _relayable(body, headers) and self.dispatcher.relays_to(flow) is not None:
            # one JSON row for a flow of one stage: the stage's executor parses and checks it
            # (the same code, the same errors) and answers in JSON; this process only relays
            qid_start = self.dispatcher.new_qid()
            raw = RawBody(body, headers.get("content-type", ""), qid_start)
        else:
            qid_start, table, error = await self._parse(name, flow, body, headers)
            if error is not None:
                return _error_body(error)
        body = None  # the rows hold what is needed; the body's memory can go now
        timeout = flow.plan.timeout_s or self.request_timeout_s  # the flow's deadline, else the cluster's
        asked = headers.get("x-request-timeout")
        if asked is not None:
            seconds = _seconds(asked)
            if seconds is None:
                return _error_body(
                    http_error_for(
                        BadRequestError(f"header X-Request-Timeout must be a number of seconds > 0, got {asked!r}")
                    )
                )
            # a client may ask for less or more time than the flow's deadline, up to the cluster's maximum
            timeout = min(seconds, self.max_request_timeout_s)
        self.slo.arrived(name, flow.plan)
        try:
            trace: list = []
            result = await self.dispatcher.submit(name, table, timeout, trace, raw)
            table = raw = None  # answered: the request's rows can go before the answer is encoded
        except RequestFailed as e:
            if not (raw is not None and e.status == 400):  # a relayed body that did not parse: not served
                self.slo.answered(name, flow.plan, float("inf"))  # an error never meets the SLO
            return e.status, encode_error(e.body), [JSON_CONTENT_TYPE]
        ms = (time.perf_counter() - t0) * 1000
        asyncio.get_running_loop().call_soon(self._timed, name, flow.plan, ms)  # after the write, as _count
        if isinstance(result, Rendered):  # a relayed body's answer: the client's JSON already
            if self.output_schemas.get(name, (None,))[0] != flow.version and result.rows:
                schema = {c: ColumnType.from_json(t) for c, t in result.schema.items()}
                self.output_schemas[name] = (flow.version, schema)
            return 200, result.body, [JSON_CONTENT_TYPE, *self._answer_headers(ms, qid_start, trace)]
        if self.output_schemas.get(name, (None,))[0] != flow.version and len(result):
            self.output_schemas[name] = (flow.version, dict(result.schema))
        extra = self._answer_headers(ms, qid_start, trace)
        arrow = ARROW in headers.get("accept", "")
        ctype = (b"content-type", ARROW.encode()) if arrow else JSON_CONTENT_TYPE
        try:
            if len(result) <= OFF_LOOP_ROWS:
                body = arrow_answer(result) if arrow else json_rows(result)
            else:  # a big answer is written on a worker thread and sent as it is written
                pieces = arrow_pieces(result) if arrow else json_pieces(result)
                body = Streamed(await asyncio.to_thread(next, pieces), pieces)
        except (TypeError, ValueError) as e:  # orjson's errors are TypeErrors; UnencodableError
            op = flow.plan.stages[flow.plan.sink].nodes[-1].name
            return _error_body(
                http_error_for(
                    OperatorOutputError(f"operator {op!r} returned an answer JSON cannot carry: {e}", operator=op)
                )
            )
        return 200, body, [ctype, *extra]

    def _timed(self, name: str, plan, ms: float) -> None:
        self.metrics.child(self.metrics.latency, name).observe(ms)
        self.slo.answered(name, plan, ms)

    async def _parse(self, name: str, flow: DeployedFlow, body, headers: dict):
        """(qid_start, the input Table, None) for a request body; (None, None, (status, error
        body)) if it is bad."""
        schema = flow.plan.input_schema
        # a big body is parsed and converted on a worker thread: the event loop keeps
        # serving other requests meanwhile (the interpreter switches threads every 5 ms)
        big = len(body) > OFF_LOOP_BYTES
        # an Arrow body in a shared segment (_read_body) parses without a copy, in tens of us: on a thread
        # only if it has many rows to convert (two thread hops cost more than a 10 MB row's parse)
        inline = big and isinstance(body, memoryview)
        try:
            ctype = headers.get("content-type", "")
            if len(body) > jsontensors.MIN_BYTES and not inline and is_json(ctype) and jsontensors.eligible(schema):
                # JSON rows of numbers (images as nested lists, tabular batches): read outside the GIL
                got = await asyncio.to_thread(jsontensors.read_rows, body, schema)
                if got is not None and got[0] <= self.max_rows:  # else the general path says what is wrong
                    n, cols = got
                    qid_start = self.dispatcher.next_qid
                    table = Table.built(cols, self.dispatcher.new_qids(n))
                    return qid_start, check_schema(name, schema, table), None
            # a compressed Arrow body may not inflate past the body limit (httpcodec.arrow_table)
            rows = (
                await asyncio.to_thread(parse_body, body, ctype, schema, self.max_body_bytes)
                if big and not inline
                else parse_body(body, ctype, schema, self.max_body_bytes)
            )
            big = big and not (inline and len(rows) <= OFF_LOOP_ROWS)
            body = None  # the rows hold what is needed; the body's memory can go now
            if len(rows) > self.max_rows:
                why = f"the request has {len(rows)} rows, over the limit of {self.max_rows} (max_rows)"
                return None, None, http_error("TooManyRows", why)
            qid_start = self.dispatcher.next_qid
            qids = self.dispatcher.new_qids(len(rows))
            table = (
                await asyncio.to_thread(input_table, name, rows, qids, schema)
                if big
                else input_table(name, rows, qids, schema)
            )
        except (BadRequestError, DataError) as e:
            return None, None, http_error_for(e)
        return qid_start, table, None

    @staticmethod
    def _answer_headers(ms: float, qid_start: int, trace: list) -> list:
        return [
            (b"server-timing", f"flow;dur={ms:.3f}".encode()),
            # row i of the request was query qid_start + i: clients can match answers to rows
            (b"x-qid-start", str(qid_start).encode()),
            # where each stage ran, for how long, in a batch of how many requests
            (b"x-flowserve-trace", _trace_header(trace)),
        ]

    async def list_flows(self, request: Request) -> Response:
        flows = []
        for name, f in sorted(self.dispatcher.flows.items()):
            schema = f.plan.input_schema
            flows.append(
                {
                    "name": name,
                    "version": f.version,
                    "url": f"/flows/{name}",
                    "input_schema": None if schema is None else {c: type_doc(t) for c, t in schema.items()},
                }
            )
        return JSONResponse({"flows": flows})

    async def describe_flow(self, request: Request) -> Response:
        name = request.path_params["name"]
        f = self.dispatcher.flows.get(name)
        if f is None:
            return _error(http_error("UnknownFlow", f"no deployed flow named {name!r}"))
        return JSONResponse(describe(f, self.dispatcher, self.scaling_status, self.slo))

    async def healthz(self, request: Request) -> Response:
        """Liveness of the gateway (always 200 while it runs), and what an operator should
        look at: ``executors`` counts those that answered a ping lately (liveness.py), not
        processes that merely exist; ``stuck`` lists executors with a thread held by
        abandoned work (recycled after the grace period), ``recycled``/``crashed`` count
        replacements; ``status`` is "degraded" when no executor answers or every one that
        does has a stuck thread."""
        return JSONResponse(self.health())

    def health(self) -> dict:
        infos = list(self.dispatcher.executors.values())
        alive = [e.id for e in self.dispatcher.answering(RECENT_S)]
        stuck = [
            {
                "executor": e.id,
                "since": e.stuck_since,
                "operators": sorted({op for (_f, _s, op) in e.stuck if op}),
                "threads": sum(e.stuck.values()),
            }
            for e in infos
            if e.alive and e.stuck
        ]
        status = "stopping" if not self.accepting else ("degraded" if len(stuck) == len(alive) else "ok")
        out = {
            "status": status,
            "executors": len(alive),
            "inflight": len(self.dispatcher.requests),
            "flows": sorted(self.dispatcher.flows),
            "stuck": stuck,
            "recycled": {e.id: e.recycled for e in infos if e.recycled},
            "crashed": {e.id: e.crashed for e in infos if e.crashed},
            "gpus": {e.id: e.gpus for e in infos if e.alive and e.gpus},  # NVML, per gpu executor
        }
        if self.host_status is not None:
            out.update(self.host_status())
        return out

    async def readyz(self, request: Request) -> Response:
        """Readiness: 200 once the gateway serves the flows it should (restored or deployed)
        and every stage of each has a replica on an executor that answers pings; else 503
        with what is missing. A load balancer or Kubernetes sends traffic on it."""
        missing = []
        if not self.accepting:
            missing.append("the gateway is stopping")
        elif not self.ready:
            missing.append("the gateway is still starting (restoring its flows)")
        answering = {e.id for e in self.dispatcher.answering(RECENT_S)}
        if not answering and not missing:
            missing.append("no executor answers pings")
        for name, f in sorted(self.dispatcher.flows.items()):
            for stage, ids in f.placement.items():
                if not answering.intersection(ids):
                    missing.append(f"flow {name!r} stage {stage!r} has no replica on an executor that answers")
        body = {"ready": not missing, "executors": len(answering), "flows": sorted(self.dispatcher.flows)}
        if missing:
            body["missing"] = missing
        return JSONResponse(body, status_code=200 if not missing else 503)

    async def metrics_text(self, request: Request) -> Response:
        for e in self.dispatcher.executors.values():
            self.metrics.stuck.labels(e.id).set(sum(e.stuck.values()) if e.alive else 0)
            if e.alive and e.gpus:
                self.metrics.observe_gpus(e.id, e.gpus)
        for name, f in self.dispatcher.flows.items():
            for stage, ids in f.placement.items():
                self.metrics.replicas.labels(name, stage).set(len(ids))
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Request) -> Response:
        outputs = {
            name: schema
            for name, (version, schema) in self.output_schemas.items()
            if name in self.dispatcher.flows and self.dispatcher.flows[name].version == version
        }
        return JSONResponse(openapi_document(self.dispatcher.flows, outputs))

    async def load_flow(self, name: str, version: int, install_if=None, install: bool = True) -> DeployedFlow:
        """Place a registered plan on the executors and build its stages there; the flow
        is served from then on (unless ``install_if()``, asked once it is built, says it
        has become stale, or ``install`` is False: the caller installs it). A version
        older than the one served is not installed (``LoadFailed`` 409), and one older
        than any this gateway has served is not even loaded (``served_high``); replicas
        built for nothing are released. Raises ``LoadFailed`` with the HTTP status to answer."""
        from executors.placement import place

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
            plan, blob = await asyncio.to_thread(_read_plan, self.store, name, version)
        except SerializationError as e:  # there, but refused (another flow's or version's, or forged)
            log.error("flow %s v%s: %s", name, version, e)
            raise LoadFailed("UnknownPlan", f"flow {name!r} version {version} cannot be loaded: {e}") from None
        except FlowError as e:
            raise LoadFailed("UnknownPlan", f"flow {name!r} version {version} is not registered: {e}") from None
        if not self.dispatcher.answering(RECENT_S):
            down = (self.host_status() if self.host_status is not None else {}).get("down") or {}
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
        if self.shape_placement is not None:
            placement = self.shape_placement(plan, placement)
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
        self._install(name, flow)
        return flow

    def _install(self, name: str, flow: DeployedFlow) -> None:
        """Serve ``flow`` now, unless a newer version is served (``LoadFailed`` 409)."""
        served = self.dispatcher.install(name, flow)
        if served is not None and served.version != flow.version:  # the same version again: served
            raise LoadFailed("DeployConflict", _conflict(name, flow.version, served.version))
        self.served_high[name] = max(self.served_high.get(name, flow.version), flow.version)
        if self.on_served is not None:
            self.on_served(name, self.served_high[name])
        log.info("deployed flow %s v%s", name, flow.version)

    async def deploy(self, request: Request) -> Response:
        if not self._bearer_ok(request, self.admin_token):
            return _error(http_error("Unauthorized", "admin calls need the cluster token"))
        try:
            doc = await request.json()
            name, version = str(doc["flow"]), int(doc["version"])
        except (ValueError, KeyError, TypeError):
            return _error(http_error_for(BadRequestError('body must be {"flow": name, "version": n}')))
        # Deploys of one name may race (here or on other gateways). Versions decide: the
        # registry and the served flow only ever move to a newer version, so a deploy whose
        # version is older than one already registered or served answers 409 and is not
        # served; the last deploy acknowledged is the newest, and it is what is served.
        served = self.dispatcher.flows.get(name)
        if served is not None and served.version > version:
            return _error(http_error("DeployConflict", _conflict(name, version, served.version), winner=served.version))
        try:
            flow = await self.load_flow(name, version, install=False)
        except LoadFailed as e:
            return _error(e.answer())
        asked = flow.plan.timeout_s
        if asked is not None and asked > self.max_request_timeout_s:
            self.dispatcher.retire(flow)
            return _error(
                http_error_for(
                    BadRequestError(
                        f"flow {name!r}: timeout_s {asked:g} is over the cluster's max_request_timeout_s "
                        f"{self.max_request_timeout_s:g}"
                    )
                )
            )
        try:  # every gateway of the cluster serves what the registry lists (membership.py)
            registered = await self._record_change(name, register_deployed, self.store.redis, name, version)
        except Exception as e:
            # not served either: a flow served but not registered would be gone after a
            # gateway restart, and other gateways would never serve it
            self.dispatcher.retire(flow)
            log.error("flow %s v%s: deploy failed, the store did not register it: %s", name, version, e)
            return _error(
                http_error(
                    "StoreUnavailable",
                    f"flow {name!r} v{version} was not deployed: the store could not register it ({store_problem(e)})",
                )
            )
        if registered != version:
            self.dispatcher.retire(flow)
            return _error(http_error("DeployConflict", _conflict(name, version, registered), winner=registered))
        try:
            self._install(name, flow)
        except LoadFailed as e:
            return _error(e.answer(winner=self.dispatcher.flows[name].version))
        return JSONResponse(describe(flow, self.dispatcher))

    async def serve_replan(self, plan) -> DeployedFlow:
        """Serve ``plan``, a re-planned configuration of a flow served here (the SLO
        tuner's, executors/scaling.py), as the flow's next version: stored, built on the
        executors ``place`` picks, installed (requests in flight finish on the old one)
        and registered. Raises ``LoadFailed`` as a deploy would."""
        from executors.placement import PLAN_KEY, next_version

        name = plan.flow_name
        version = await asyncio.to_thread(next_version, self.store.redis, name)
        await asyncio.to_thread(self.store.put_trusted, PLAN_KEY.format(flow=name, version=version), plan)
        flow = await self.load_flow(name, version)
        try:
            await self._record_change(name, register_deployed, self.store.redis, name, version)
        except Exception as e:
            log.warning("flow %s v%s (re-planned) serves here but is not registered for others: %s", name, version, e)
        return flow

    async def undeploy(self, request: Request) -> Response:
        if not self._bearer_ok(request, self.admin_token):
            return _error(http_error("Unauthorized", "admin calls need the cluster token"))
        name = request.path_params["name"]
        if self.dispatcher.uninstall(name) is None:  # its replicas go once its requests finish
            return _error(http_error("UnknownFlow", f"no deployed flow named {name!r}"))
        try:
            await self._record_change(name, self.store.redis.hdel, DEPLOYED_KEY, name)
        except Exception as e:
            log.warning("flow %s: could not remove it from the registry: %s", name, e)
        return JSONResponse({"undeployed": name})

    async def _record_change(self, name: str, write, *args):
        """Run the registry ``write`` for a deploy/undeploy served here. A registry read
        that started before the write finished may not show it, so the change is stamped
        both before and after the write: such a read is then older than the change."""
        self.changed_at[name] = time.monotonic()
        try:
            return await asyncio.to_thread(write, *args)
        finally:
            self.changed_at[name] = time.monotonic()


def _read_plan(store, name: str, version: int) -> tuple:
    """The plan of ``name`` v``version`` and its stored bytes (kept to re-publish it,
    durability.py). Its signature must be bound to its key, so to this flow and version,
    and the plan must name this flow: a plan copied from elsewhere is refused."""
    from executors.placement import PLAN_KEY, checked_plan
    from kvs.client import decode_value
    from kvs.exceptions import KeyNotFoundError

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


def describe(f: DeployedFlow, dispatcher: Dispatcher, scaling_status=None, slo=None) -> dict:
    scaling = scaling_status(f.plan.flow_name) if scaling_status is not None else {}
    stages = []
    for name, stage in f.plan.stages.items():
        recent = sorted(f.stats.get(name, ()))
        p50 = recent[len(recent) // 2] if recent else None
        counters = dispatcher.stage_counters(f.plan.flow_name, name)
        stages.append(
            {
                "name": name,
                "inputs": list(stage.inputs),
                "device": stage.device,
                "replicas": len(f.placement[name]),
                "executors": f.placement[name],
                "competitive": stage.competitive,
                "wait": stage.wait,
                "continuation": stage.continuation,
                "batch": None
                if stage.batch is None
                else {"max_batch_size": stage.batch.max_batch_size, "max_wait_ms": stage.batch.max_wait_ms},
                "p50_ms": p50,
                "batch_seen": counters.batch_seen(),
                "batch_cap": counters.batch_caps(),  # AIMD's live cap per executor (an SLO flow)
                "autoscaling": scaling.get(name),
            }
        )
    try:
        explained = f.plan.explain({name: len(ids) for name, ids in f.placement.items()})
    except Exception as e:  # describing must never fail a deploy
        explained = f"(explain failed: {type(e).__name__}: {e})"
    out = {
        "name": f.plan.flow_name,
        "version": f.version,
        "sink": f.plan.sink,
        "timeout_s": f.plan.timeout_s,  # None: the cluster's request_timeout_s
        # the stage a one-row JSON body goes to unparsed (messages.RawInput); None: parsed here
        "relay_stage": dispatcher.relays_to(f),
        "stages": stages,
        "explain": explained,
    }
    if slo is not None and f.plan.slo is not None:
        out["slo"] = slo.describe(f.plan.flow_name, f.plan)
    return out


def _shared_size(headers: dict, declared: str | None) -> int | None:
    """The size to read an Arrow body of into shared memory (shm.py), or None: its tensor
    columns then go to the executors as references to the body's own bytes, no copy."""
    if declared is None or not declared.isdigit() or int(declared) < shm.SHM_MIN_BYTES:
        return None
    return int(declared) if headers.get("content-type", "").startswith(ARROW) else None


async def _read_body(receive, limit: int, shared: int | None = None) -> bytes | bytearray | memoryview | None:
    """The request body, or None once it grows over ``limit`` bytes. A body in one piece
    (most) is returned as it came; pieces are gathered into one growing buffer, so a big
    body never exists twice (a list of pieces joined at the end would need twice its size).
    ``shared``: the declared size of a body to gather into a shared-memory segment."""
    first: bytes | None = None
    buf: bytearray | None = None
    size = 0
    segment = shm.SegmentWriter(shared) if shared and shared <= limit else None
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        if segment is not None and size + len(chunk) <= shared:
            segment.write(chunk)
            size += len(chunk)
            if not message.get("more_body", False):
                return segment.mapped()
            continue
        if segment is not None:  # more than declared (uvicorn refuses that): as any body
            first, segment = segment.mapped().tobytes(), None
        size += len(chunk)
        if size > limit:
            return None
        if first is None:
            first = chunk
        else:
            if buf is None:
                buf = bytearray(first)
            buf += chunk
        if not message.get("more_body", False):
            break
    return buf if buf is not None else (first if first is not None else b"")


def _bearer_matches(header: str, token: str) -> bool:
    return header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), token.encode())


# Relayed bodies are parsed on the executor's IO thread, between its reads of other
# messages: only small ones (a 28x28 image as JSON is about 3 KiB; 64 KiB parses in about a
# millisecond: a 112x112 tensor, 62 KB, took 1.3 ms here)
RELAY_MAX_BYTES = 64 * 1024


def _relayable(body, headers: dict) -> bool:
    """A body the flow's one stage may parse itself (RawInput): one JSON object (one row),
    small (RELAY_MAX_BYTES), for a client that takes a JSON answer. Anything else is
    parsed here as before (Arrow, lists of rows, big bodies, answers in Arrow)."""
    return (
        isinstance(body, (bytes, bytearray))
        and 0 < len(body) <= RELAY_MAX_BYTES
        and (body[:1] == b"{" or body.lstrip()[:1] == b"{")
        and is_json(headers.get("content-type", ""))
        and ARROW not in headers.get("accept", "")
    )


def _seconds(text: str) -> float | None:
    """A positive, finite number of seconds, or None ("nan", "-1", "0", "abc")."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


def _trace_header(trace: list) -> bytes:
    """The X-Flowserve-Trace value: JSON, ASCII only (a header is Latin-1; a stage named in
    other letters is escaped, as the json module does)."""
    entries = _unique(e[:4] for e in trace)
    value = orjson.dumps(entries)
    return value if value.isascii() else json.dumps(entries, separators=(",", ":")).encode()


def _unique(entries) -> list:
    """Trace entries once each, in order (a stage's entry reaches the sink along every
    path through a join or a key split)."""
    seen, out = set(), []
    for e in entries:
        key = tuple(e)
        if key not in seen:
            seen.add(key)
            out.append(list(e))
    return out


def _error_body(answer: tuple[int, bytes]) -> tuple[int, bytes, list]:
    """The same error answer on the invoke path: bytes and headers, no Starlette objects."""
    status, body = answer
    return status, body, [JSON_CONTENT_TYPE]


class InvokeFastPath:
    """``POST /flows/{name}`` answered as a bare ASGI app in front of Starlette.

    Invocations are the gateway's hot path; Starlette's middleware, routing and Request/
    Response objects cost about as much per call as everything else the gateway does for
    a small request. Every other route goes through Starlette."""

    def __init__(self, gateway: Gateway, app):
        self.gateway = gateway
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not path.startswith("/flows/")
            or "/" in path[7:]
            or len(path) == 7
        ):
            if scope["type"] == "http" and not self._authorized(path, scope["headers"]):
                return await _send(send, *_error_body(http_error("Unauthorized", "missing or wrong bearer token")))
            return await self.app(scope, receive, send)
        await _send(send, *await self.answer(path[7:], scope["headers"], receive))

    async def answer(self, name: str, raw_headers, receive) -> tuple[int, bytes, list]:
        """Flow ``name``'s answer to a request: (status, body, extra headers). ``raw_headers``
        as the server parsed them (lower-case names, bytes). The server's lean path
        (leanhttp.py) calls this directly, and ``send`` for an answer that is not one piece."""
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw_headers}
        try:
            return await self.gateway.invoke(name, headers, receive)
        except Exception as exc:  # last resort: never a traceback to a client
            log.exception("unhandled error on /flows/%s", name)
            return _error_body(http_error("InternalError", f"{type(exc).__name__}: {exc}"))

    @staticmethod
    async def send(send, status: int, body, extra: list) -> None:
        await _send(send, status, body, extra)

    def _authorized(self, path: str, raw_headers) -> bool:
        """One rule: with a token, every route needs it (or the admin token) but the probes
        (/healthz, /readyz), and /metrics when ``public_metrics``; admin routes check the
        admin token themselves."""
        g = self.gateway
        if (
            not g.token
            or path in ("/healthz", "/readyz")
            or path.startswith("/admin/")
            or (path == "/metrics" and g.public_metrics)
        ):
            return True
        header = next((v.decode("latin-1") for k, v in raw_headers if k == b"authorization"), "")
        return _bearer_matches(header, g.token) or _bearer_matches(header, g.admin_token)


class Streamed:
    """An answer sent as it is written: its first piece (written before the status is
    sent, so an answer that cannot be encoded is still a clean 500) and the iterator of the
    rest, each written on a worker thread. Sent without a length (chunked)."""

    def __init__(self, first: bytes, rest):
        self.first, self.rest = first, rest


async def _send(send, status: int, body: bytes | list | Streamed, extra: list) -> None:
    if isinstance(body, Streamed):
        await send({"type": "http.response.start", "status": status, "headers": extra})
        piece = body.first
        while piece is not None:
            # the server applies flow control: each send waits until the client takes it
            await _body(send, [piece], more=True)
            piece = await asyncio.to_thread(next, body.rest, None)
        await send({"type": "http.response.body", "body": b""})
        return
    # pieces of one answer (arrow_answer: views of its big buffers, not joined), or one big body
    pieces = body if isinstance(body, list) else [body]
    length = sum(memoryview(piece).nbytes for piece in pieces)
    head = [(b"content-length", str(length).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await _body(send, pieces, more=False)


async def _body(send, pieces: list, more: bool) -> None:
    """Send ``pieces`` as the body's next messages (the last one ending the body unless
    ``more``), none longer than WRITE_SLICE, the event loop running others between slices."""
    last = len(pieces) - 1
    for i, piece in enumerate(pieces):
        view = memoryview(piece)
        n = view.nbytes
        if n <= WRITE_SLICE:
            await send({"type": "http.response.body", "body": piece, "more_body": more or i < last})
            continue
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        for at in range(0, n, WRITE_SLICE):
            end = min(at + WRITE_SLICE, n)
            await send({"type": "http.response.body", "body": view[at:end], "more_body": more or i < last or end < n})
            if end < n:
                await asyncio.sleep(0)  # a ready callback (another request's) runs before the next slice


def make_app(gateway: Gateway, on_startup=(), on_shutdown=()) -> InvokeFastPath:
    g = gateway
    routes = [
        Route("/flows", g.list_flows, methods=["GET"]),
        Route("/flows/{name}", g.describe_flow, methods=["GET"]),
        Route("/healthz", g.healthz, methods=["GET"]),
        Route("/readyz", g.readyz, methods=["GET"]),
        Route("/metrics", g.metrics_text, methods=["GET"]),
        Route("/openapi.json", g.openapi, methods=["GET"]),
        Route("/flows/{name}/feedback", functools.partial(feedback, g), methods=["POST"]),  # feedback.py
        Route("/admin/deploy", g.deploy, methods=["POST"]),
        Route("/admin/flows/{name}", g.undeploy, methods=["DELETE"]),
        *docs_routes(),  # GET /docs: the interactive page (docs_page.py)
    ]

    async def server_error(request, exc):  # last resort: never a traceback to a client
        log.exception("unhandled error on %s", request.url.path)
        return _error(http_error("InternalError", f"{type(exc).__name__}: {exc}"))

    async def http_exception(request, exc):  # 404, 405...: the same JSON error format as every other
        names = {404: "NotFound", 405: "MethodNotAllowed"}
        detail = {
            404: f"no route {request.url.path!r}; GET /openapi.json lists them",
            405: f"{request.method} is not allowed on {request.url.path!r}",
        }.get(exc.status_code, str(exc.detail))
        return _error(http_error(names.get(exc.status_code, "HTTPError"), detail, status=exc.status_code))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        for fn in on_startup:
            await fn()
        yield
        for fn in on_shutdown:
            await fn()

    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={Exception: server_error, HTTPException: http_exception}
    )
    return InvokeFastPath(gateway, app)
