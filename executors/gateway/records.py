"""What the dispatcher keeps: its executors, the flow versions it serves, the requests in
flight (with their attempts, routing and answers so far), and how a failed request is
answered."""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field

from executors.codec.bodies import row_table_bytes
from executors.errors import status_for
from flow.errors import UnavailableError
from flow.table import Table
from optimizer.plan import INPUT, Plan


class RequestFailed(Exception):
    """A request's error as the client will see it: HTTP status and a JSON body."""

    def __init__(self, status: int, body: dict):
        super().__init__(body.get("message", ""))
        self.status = status
        self.body = body

    @classmethod
    def of(cls, error: Exception) -> RequestFailed:
        """The client's view of an error raised here: its status from errors.status_for (the
        one error -> HTTP mapping), its class name, message, and operator and qid if known."""
        body = {"error": type(error).__name__, "message": str(error)}
        for attr in ("operator", "qid"):
            value = getattr(error, attr, None)
            if value is not None:
                body[attr] = value
        return cls(status_for(error), body)


class ExecutorLost(UnavailableError):
    """The executor a load waited for died meanwhile: the load fails now, not at its timeout."""


@dataclass
class ExecutorInfo:
    id: str
    address: str
    device: str = "cpu"
    alive: bool = True
    inflight: int = 0
    # stage -> requests routed to this executor's replica of it and not yet answered: a
    # stage's replicas are balanced on these (a replica on an executor that also hosts a
    # stage every request uses is as free as any other for its own stage)
    assigned: dict = field(default_factory=dict)
    loaded: set = field(default_factory=set)  # (flow, version) pairs built there
    stuck: dict = field(default_factory=dict)  # (flow, stage, operator) -> abandoned runs not back yet
    stuck_since: float | None = None  # wall time of its oldest stuck report
    recycled: int = 0  # times it was replaced because a thread was stuck
    crashed: int = 0  # times its process died unexpectedly
    gpus: list = field(
        default_factory=list
    )  # its last pong's GPU figures (executors/worker/gpu.py; [] on cpu executors)


@dataclass
class DeployedFlow:
    plan: Plan
    version: int
    placement: dict[str, list[str]]  # stage -> executor ids that host a replica
    stats: dict = field(default_factory=dict)  # stage -> recent latencies (ms)
    plan_blob: bytes | None = None  # the plan as stored: re-published if the store loses it
    # the last routes (Dispatcher._routes) while no stage had replicas to rank, with the
    # executors they were read from: (((id, info, live), ...), (routes, used, assigned))
    fixed_routes: tuple | None = None

    @functools.cached_property
    def relay_stage(self) -> str | None:
        """The stage a request's body may go to as it came (``RawBody``; see relay_stage)."""
        return relay_stage(self.plan)

    @functools.cached_property
    def row_bytes(self) -> int:
        """What one input row takes as columns (codec/bodies.py ``check_table_bytes``' estimate)."""
        schema = self.plan.input_schema
        return row_table_bytes(schema) if schema else 0


def relay_stage(plan: Plan) -> str | None:
    """The stage that takes the request's rows, when it is the only one and takes them whole
    (on one replica, or raced by copies; not hedged, key-split or a choice among
    alternatives): the gateway may then relay a one-row body (JSON or Arrow) to it unparsed
    (messages.RawInput), to each racing copy alike. The stages after it pass the request on
    as for any body, and the sink answers with the client's JSON (outputs.py)."""
    takers = [s for s in plan.stages.values() if INPUT in s.inputs]
    if len(takers) != 1:
        return None
    (stage,) = takers
    if (
        tuple(stage.inputs) != (INPUT,)
        or stage.continuation is not None
        or stage.hedge is not None
        or stage.wait != "all"
    ):
        return None
    return stage.name


@dataclass(frozen=True)
class RawBody:
    """A request's body relayed as it came: one row (JSON or Arrow, by ``ctype``), of query ``qid``."""

    body: bytes
    ctype: str
    qid: int


@dataclass
class Request:
    id: int
    flow: DeployedFlow
    table: Table | None  # None: the body goes as it came (raw)
    deadline: float
    future: asyncio.Future
    attempt: int = 0
    retries_left: int = 2
    executors: set = field(default_factory=set)
    assigned: list = field(default_factory=list)  # (executor id, (flow, stage)) counted in ExecutorInfo.assigned
    parts: dict = field(default_factory=dict)  # path -> Table (sink output)
    started: float = field(default_factory=time.perf_counter)
    trace: list = field(default_factory=list)  # (stage, executor, ms, batch) of the answer
    crashes: set = field(default_factory=set)  # (executor, attempt) crashes it was running in
    solo: bool = False  # re-run alone after a crash: never merged into a batch
    raw: RawBody | None = None
    traceparent: str = ""  # of the gateway's span of it, sent with its runs (executors/tracing.py); "": untraced
    rid: str = ""  # the request id its answer carries (X-Request-Id), sent on for the executors' logs
