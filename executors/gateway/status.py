"""What a gateway says about itself: ``GET /flows``, ``GET /flows/{name}``, the probes
(``/livez``: the process answers; ``/healthz``: liveness and which executors answer;
``/readyz`` and ``/readyz/{flow}``: whether every served flow, or that one, has a warm
replica of every stage, readiness.py), ``/metrics`` and ``/openapi.json``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from executors.errors import http_error
from executors.gateway.dispatcher import Dispatcher
from executors.gateway.liveness import RECENT_S
from executors.gateway.openapi import openapi_document, type_doc
from executors.gateway.readiness import readiness
from executors.gateway.records import DeployedFlow


def error_response(answer: tuple[int, bytes]) -> Response:
    """An error answer (``errors.http_error`` / ``http_error_for``) on a Starlette route."""
    status, body = answer
    return Response(body, status_code=status, media_type="application/json")


class Status:
    """A gateway's read-only routes."""

    def __init__(self, gateway):
        self.g = gateway
        self.dispatcher = gateway.dispatcher
        self.metrics = gateway.metrics
        self.slo = gateway.slo
        self.output_schemas = gateway.output_schemas

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
            r = self.g.rollouts.active.get(name)
            if r is not None:  # a canary or shadow version beside it (rollouts.py)
                flows[-1]["candidate"] = {"version": r.candidate.version, "mode": r.mode, "share": r.share}
        return JSONResponse({"flows": flows})

    async def describe_flow(self, request: Request) -> Response:
        name = request.path_params["name"]
        f = self.dispatcher.flows.get(name)
        if f is None:
            return error_response(http_error("UnknownFlow", f"no deployed flow named {name!r}"))
        out = describe(f, self.dispatcher, self.g.scaling_status, self.slo)
        rollout = self.g.rollouts.describe(name)  # a canary or shadow beside it, side by side
        if rollout is not None:
            out["rollout"] = rollout
        return JSONResponse(out)

    async def livez(self, request: Request) -> Response:
        """Liveness of the process: it answers HTTP. Nothing else is checked, so a kubelet
        never restarts a gateway for what a restart does not fix (an executor that is down)."""
        return JSONResponse({"live": True})

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
        status = "stopping" if not self.g.accepting else ("degraded" if len(stuck) == len(alive) else "ok")
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
        if self.g.host_status is not None:
            out.update(self.g.host_status())
        return out

    async def readyz(self, request: Request) -> Response:
        """Readiness: 200 once the gateway serves the flows it should (restored or deployed)
        and every stage of each has a warm replica (built, on an executor that answers
        pings); else 503 naming what is missing: a flow mid-deploy, a stage at zero replicas
        or with none warm (readiness.py). A load balancer or Kubernetes sends traffic on it."""
        ready, body = readiness(self.g)
        return JSONResponse(body, status_code=200 if ready else 503)

    async def readyz_flow(self, request: Request) -> Response:
        """Readiness of one flow (``/readyz/{flow}``): 200 when it has a warm replica of every
        stage here, else 503 naming what is missing; 404 for a flow not deployed here."""
        name = request.path_params["name"]
        ready, body = readiness(self.g, name)
        if name not in body["flows"]:
            return error_response(http_error("UnknownFlow", f"no deployed flow named {name!r}"))
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_text(self, request: Request) -> Response:
        self.metrics.refresh(self.dispatcher, RECENT_S)  # the gauges of now (executors, replicas, queues)
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Request) -> Response:
        outputs = {
            name: schema
            for name, (version, schema) in self.output_schemas.items()
            if name in self.dispatcher.flows and self.dispatcher.flows[name].version == version
        }
        g = self.g
        document = openapi_document(
            self.dispatcher.flows,
            outputs,
            token=bool(g.token),
            public_metrics=g.public_metrics,
            max_rows=g.max_rows,
            max_body_bytes=g.max_body_bytes,
        )
        return JSONResponse(document)


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
