"""What a gateway says about itself: ``GET /flows``, ``GET /flows/{name}``, the probes
(``/healthz``: liveness and which executors answer; ``/readyz``: whether every served flow
has a replica that answers), ``/metrics`` and ``/openapi.json``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from executors.errors import http_error
from executors.gateway.dispatcher import Dispatcher
from executors.gateway.liveness import RECENT_S
from executors.gateway.openapi import openapi_document, type_doc
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
        return JSONResponse({"flows": flows})

    async def describe_flow(self, request: Request) -> Response:
        name = request.path_params["name"]
        f = self.dispatcher.flows.get(name)
        if f is None:
            return error_response(http_error("UnknownFlow", f"no deployed flow named {name!r}"))
        return JSONResponse(describe(f, self.dispatcher, self.g.scaling_status, self.slo))

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
        and every stage of each has a replica on an executor that answers pings; else 503
        with what is missing. A load balancer or Kubernetes sends traffic on it."""
        missing = []
        if not self.g.accepting:
            missing.append("the gateway is stopping")
        elif not self.g.ready:
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
