"""The HTTP gateway (Starlette under uvicorn): the API applications call.

    POST /flows/{name}      run a deployed flow on one row (object) or rows (list), or Arrow
    GET  /flows             deployed flows and their input schemas
    GET  /flows/{name}      the plan, per-stage replicas and recent latency
    GET  /livez             liveness of the process: it answers
    GET  /healthz           liveness, and which executors answer
    GET  /readyz            readiness: 200 once every served flow has a warm replica of every stage
    GET  /readyz/{name}     readiness of one flow
    GET  /metrics           Prometheus text
    GET  /openapi.json      the contract, machine-readable
    GET  /docs              the contract as a page, "Try it out" included (docs_page.py); GET / sends a browser there
    POST /admin/deploy      (cluster token) load a registered plan onto executors
    DELETE /admin/flows/{name}   (cluster token) undeploy
    POST /admin/flows/{name}/promote    (cluster token) a canary or shadow version becomes the served one
    POST /admin/flows/{name}/rollback   (cluster token) serve the version before again, as a new version
    GET  /flows/{name}/history   the flow's recorded deploys, promotions and rollbacks

The routes are answered by four parts of the gateway, each in its module: the data
plane (invoke.py), deploys (deploys.py), canary and shadow versions (rollouts.py) and what
the gateway says about itself (status.py);
this module holds their shared state, the one auth rule and the app that routes to them.
Errors are JSON ``{"error": <type>, "message": ..., "operator"?, "qid"?}``, all made by
errors.py (``http_error``, ``http_error_for``), with status 400 (malformed body, schema
mismatch), 401 (token), 404 (unknown flow), 413 (body too large), 422 (an operator
rejected the row / no valid alternative / missing lookup key), 500 (an operator raised),
503 (no executor; the KVS lost its data), 504 (deadline). A deploy that lost a race to a
newer version of the same flow gets 409. No traceback reaches a client.
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Route

from executors.errors import http_error
from executors.gateway.deploys import Deploys
from executors.gateway.dispatcher import Dispatcher
from executors.gateway.docs_page import docs_routes, is_page
from executors.gateway.feedback import feedback
from executors.gateway.invoke import Invocations, InvokeFastPath
from executors.gateway.metrics import Metrics
from executors.gateway.rollouts import Rollouts
from executors.gateway.slo_monitor import SLOMonitor
from executors.gateway.status import Status, error_response

log = logging.getLogger("flowserve.gateway")


class Gateway:
    """A gateway's state and settings, shared by its parts (``invocations``, ``deploys``,
    ``status``), and the one auth rule."""

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
        self.shape_placement = None  # the autoscaler's hook: start stages on fewer replicas
        self.scaling_status = None  # the autoscaler's per-stage status, for describe()
        self.host_status = None  # what the host adds to /healthz (the local cluster's processes)
        self.ready = False  # set by the host once the flows it should serve are loaded (/readyz)
        self.slo = SLOMonitor(metrics)  # flows served under an SLO: attainment, arrival envelope
        self.invocations = Invocations(self)
        self.deploys = Deploys(self)
        self.rollouts = Rollouts(self)
        self.status = Status(self)

    def refusal(self, path: str, authorization: str) -> tuple[int, bytes] | None:
        """The one auth rule, checked for every request before anything of it is read: the
        401 to answer, or None. Admin routes need the admin token; with a token set, every
        other route needs it (or the admin token) but the probes (/livez, /healthz, /readyz,
        /readyz/{flow}), the API page and its files (/, /docs: nothing of the cluster's; the
        page asks for the token), and /metrics when ``public_metrics``."""
        if path.startswith("/admin/"):
            if _bearer_matches(authorization, self.admin_token):
                return None
            return http_error("Unauthorized", "admin calls need the cluster token")
        if not self.token or is_probe(path) or is_page(path) or (path == "/metrics" and self.public_metrics):
            return None
        if _bearer_matches(authorization, self.token) or _bearer_matches(authorization, self.admin_token):
            return None
        return http_error("Unauthorized", "missing or wrong bearer token")


PROBES = ("/livez", "/healthz", "/readyz")  # what a load balancer or kubelet asks without credentials


def is_probe(path: str) -> bool:
    """A probe's path: ``PROBES``, or one flow's readiness (``/readyz/{flow}``)."""
    return path in PROBES or (path.startswith("/readyz/") and "/" not in path[8:])


def _bearer_matches(header: str, token: str) -> bool:
    return header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), token.encode())


def make_app(gateway: Gateway, on_startup=(), on_shutdown=()) -> InvokeFastPath:
    g = gateway
    routes = [
        Route("/flows", g.status.list_flows, methods=["GET"]),
        # POST /flows/{name} is answered by InvokeFastPath before routing; it is named here so
        # that a 405 on the path lists it in Allow
        Route("/flows/{name}", g.status.describe_flow, methods=["GET", "POST"]),
        Route("/livez", g.status.livez, methods=["GET"]),
        Route("/healthz", g.status.healthz, methods=["GET"]),
        Route("/readyz", g.status.readyz, methods=["GET"]),
        Route("/readyz/{name}", g.status.readyz_flow, methods=["GET"]),
        Route("/metrics", g.status.metrics_text, methods=["GET"]),
        Route("/openapi.json", g.status.openapi, methods=["GET"]),
        Route("/flows/{name}/feedback", functools.partial(feedback, g), methods=["POST"]),  # feedback.py
        Route("/admin/deploy", g.deploys.deploy, methods=["POST"]),
        Route("/admin/flows/{name}", g.deploys.undeploy, methods=["DELETE"]),
        Route("/admin/flows/{name}/promote", g.rollouts.promote, methods=["POST"]),
        Route("/admin/flows/{name}/rollback", g.rollouts.rollback, methods=["POST"]),
        Route("/flows/{name}/history", g.rollouts.history, methods=["GET"]),
        *docs_routes(),  # GET /docs: the interactive page (docs_page.py)
    ]

    async def server_error(request, exc):  # last resort: never a traceback to a client
        log.exception("unhandled error on %s", request.url.path)
        return error_response(http_error("InternalError", f"{type(exc).__name__}: {exc}"))

    async def http_exception(request, exc):  # 404, 405...: the same JSON error format as every other
        names = {404: "NotFound", 405: "MethodNotAllowed"}
        detail = {
            404: f"no route {request.url.path!r}; GET /openapi.json lists them",
            405: f"{request.method} is not allowed on {request.url.path!r}",
        }.get(exc.status_code, str(exc.detail))
        status, body = http_error(names.get(exc.status_code, "HTTPError"), detail, status=exc.status_code)
        # a 405's Allow header names the methods the path takes (RFC 9110)
        return Response(body, status_code=status, media_type="application/json", headers=exc.headers)

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
