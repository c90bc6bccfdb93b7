"""The gateway's scheduler: picks replicas per stage, sends requests, gathers answers.

It runs on the gateway's asyncio loop. Per request it picks, for every stage, the
executor(s) that will run it (least loaded; all competing copies; for continuation
stages the whole replica set, among which rows are routed by key hash), embeds that
routing table in the message, and sends the request's rows to the first stages. Data then
moves executor to executor; the sink's executor sends the result back here.

Every accepted request is answered exactly once: by its result, its first error, a
deadline (504), or no executor (503). A request touching an executor that died is re-run
from the start on the others (stages are pure), at most ``max_retries`` times; answers
from an older attempt are ignored, so no request is answered twice. A request that was
*running* when its executor crashed (the supervisor reads that from the executor's
blackbox, watchdog.py) is re-run alone; if it crashes a second executor it is a poison
input: answered 500 ``OperatorCrashedError`` naming the operator, and not retried again.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time

import numpy as np

from executors import tracing
from executors.codec import jsontensors
from executors.errors import DeadlineExceededError, NoExecutorError, OperatorCrashedError
from executors.gateway.counters import StageCounters
from executors.gateway.links import ExecutorLinks
from executors.gateway.records import (
    DeployedFlow,
    ExecutorInfo,
    ExecutorLost,
    RawBody,
    Request,
    RequestFailed,
)
from executors.wire.busypoll import DEFAULT_MS as DEFAULT_BUSY_POLL_MS
from executors.wire.frames import pack_copies
from executors.wire.messages import (
    Failure,
    Load,
    Loaded,
    Message,
    Partial,
    Ping,
    Pong,
    RawInput,
    Recycling,
    Rendered,
    Result,
    Revoke,
    StageInput,
    Stuck,
    Unload,
    Unstuck,
    answer_key,
)
from executors.wire.routing import complete, deliveries, merge
from flow.table import Table
from optimizer.plan import INPUT, Plan

log = logging.getLogger("flowserve.gateway")


CRASHES_TO_QUARANTINE = 2  # executors a request may crash before it is failed, not retried
DEADLINE_GRACE_S = 0.2  # the gateway's own 504 waits this much for an executor's, which names the operator
DEADLINE_STATUS = 504
CLIENT_CLOSED = 499  # a request whose client disconnected first (nginx's status): counted, never sent


class Dispatcher:
    def __init__(
        self,
        address: str,
        max_retries: int = 2,
        metrics=None,
        colocate: bool = True,
        busy_poll_ms: float = DEFAULT_BUSY_POLL_MS,
        first_id: int = 1,
    ):
        self.address = address
        self.links = ExecutorLinks(address, busy_poll_ms, self._on_message, self._stale_answer, self.requests_in_flight)
        self.executors: dict[str, ExecutorInfo] = {}
        self.flows: dict[str, DeployedFlow] = {}
        # flow -> a canary's or shadow's version served beside its primary (rollouts.py)
        self.candidates: dict[str, DeployedFlow] = {}
        self.requests: dict[int, Request] = {}
        self.max_retries = max_retries
        self.colocate = colocate
        self.metrics = metrics
        # request ids (and tokens) start at ``first_id``: a gateway that replaces one on the
        # same cluster starts past its predecessor's, so a late answer to one of those is
        # never taken for an answer to one of these
        self._ids = itertools.count(first_id)
        # query ids count from 0, as flow.run's do (docs/flow-semantics.md, "qids")
        self.next_qid = 0
        self._rr = itertools.count()
        self._last_pick: dict[tuple[str, str], str] = {}  # (flow, stage) -> executor that took it last
        self._waiters: dict[str, asyncio.Future] = {}
        self._building: dict[str, str] = {}  # load token -> the executor building (fails with it)
        self.last_pong: dict[str, float] = {}  # executor id -> when it last answered a ping (monotonic)
        self.relays: dict[str, bool] = {}  # executor id -> its last pong said it takes bodies (RawInput)
        self.renders: dict[str, bool] = {}  # ...and that it passes their JSON answer on (Pong.renders)
        self.executor_stats: dict[str, dict] = {}  # executor id -> its last pong's figures for /metrics
        # executor id -> loads in progress there: a deploy's placement is not served yet, so
        # the scaler must not stop these executors as idle (scaling._stop_idle_extras)
        self.loading: collections.Counter = collections.Counter()
        self._counters: dict[tuple[str, str], StageCounters] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._joined: asyncio.Event | None = None  # set when an executor joins (wait_for_executor)
        # True where dead executors are restarted (the local cluster's supervisor): a request
        # that finds no live executor waits for one (until its deadline) instead of a 503
        self.wait_for_restarts = False
        self._parked: list[Request] = []
        # executor address -> requests given up on this turn of the loop: one Revoke each (revoke)
        self._revoking: dict[str, list[int]] = {}
        self._releases: set[asyncio.Task] = set()  # retired flow versions waiting to drain
        # request id -> where a streamed request's rows sent ahead go (submit's on_partial)
        self._on_partial: dict = {}

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.links.start()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop this dispatcher runs on: the one it started on, while it runs (a
        request's path asks several times, and ``asyncio.get_running_loop`` costs a
        ``getpid`` system call each time in this Python); else the running one."""
        loop = self._loop
        return loop if loop is not None and loop.is_running() else asyncio.get_running_loop()

    async def close(self) -> None:
        self.links.close()

    def requests_in_flight(self) -> int:
        return len(self.requests)

    # -- membership -----------------------------------------------------------------------

    def add_executor(self, id_: str, address: str, device: str = "cpu") -> None:
        self.executors[id_] = ExecutorInfo(id_, address, device)
        joined, self._joined = self._joined, None
        if joined is not None:
            joined.set()  # wakes every wait_for_executor; each looks again

    def executor_died(self, id_: str, running: list | None = None, reason: str = "died") -> None:
        """Mark an executor dead and re-run (or fail) the requests that touched it.

        ``running``: the runs its blackbox recorded (watchdog.Blackbox.read), or None when
        not known (a pod on another machine, or one that left on purpose): then nothing is
        blamed and every request it held re-runs, up to ``max_retries`` times. A request
        counts a crash only when it was running there; one that has crashed
        ``CRASHES_TO_QUARANTINE`` executors is failed (a poison input), the others re-run
        (alone, if they were running)."""
        info = self.executors.get(id_)
        if info is None:
            return
        info.alive = False
        for token, ex in list(self._building.items()):
            waiter = self._waiters.get(token)
            if ex == id_ and waiter is not None and not waiter.done():
                waiter.set_exception(ExecutorLost(f"executor {id_} {reason} while building the flow"))
        info.loaded.clear()
        info.inflight = 0
        info.assigned.clear()
        info.stuck.clear()
        info.stuck_since = None
        self.links.forget(info.address)
        blamed = None
        if running is not None:
            blamed = {}
            for r in running:
                if r.get("gateway") in ("", self.address):
                    for req_id, att in r.get("requests", ()):
                        blamed[(req_id, att)] = r
        for req in list(self.requests.values()):
            if id_ not in req.executors:
                continue
            if reason == "recycled":
                self._retry(req, f"executor {id_} was recycled")
                continue
            record = None if blamed is None else blamed.get((req.id, req.attempt))
            if record is None:
                self._retry(req, f"executor {id_} died")
                continue
            req.crashes.add((id_, req.attempt))
            if len(req.crashes) >= CRASHES_TO_QUARANTINE:
                self._quarantine(req, record)
            else:
                req.solo = True
                self._retry(req, f"executor {id_} died while running it")

    def _quarantine(self, req: Request, record: dict) -> None:
        op = record.get("operator") or record.get("stage")
        where = f"operator {op!r}" if op else "the request"
        qid = record.get("qid")
        log.error(
            "flow %s request %s (qid %s%s): %s crashed its executor %d times; failing it (not retried)",
            req.flow.plan.flow_name,
            req.id,
            qid,
            tracing.log_tag(req.traceparent),
            where,
            len(req.crashes),
        )
        self._resolve(
            req,
            error=RequestFailed.of(
                OperatorCrashedError(
                    f"flow {req.flow.plan.flow_name!r}: {where} crashed its executor on this input "
                    f"({len(req.crashes)} executors lost); the request is not retried",
                    operator=op,
                    qid=qid,
                )
            ),
        )

    def remove_executor(self, id_: str) -> None:
        """Forget an executor that was stopped on purpose (it hosts no stage any more)."""
        info = self.executors.pop(id_, None)
        self.last_pong.pop(id_, None)
        self.executor_stats.pop(id_, None)
        if info is not None:
            self.links.forget(info.address)

    async def ping(self, address: str, timeout: float, still_worth_it=lambda: True) -> Pong | None:
        """The executor's pong (id, device, GPUs) once it answers, or None after ``timeout``
        (or as soon as ``still_worth_it()`` is false, e.g. its process exited)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and still_worth_it():
            token = f"ping-{next(self._ids)}"
            fut = asyncio.get_running_loop().create_future()
            self._waiters[token] = fut
            self.links.send(address, Ping(self.address, token).encode())
            try:
                return await asyncio.wait_for(fut, min(0.5, max(0.01, deadline - time.monotonic())))
            except asyncio.TimeoutError:
                continue
            finally:
                self._waiters.pop(token, None)
        return None

    def answering(self, recent_s: float) -> list[ExecutorInfo]:
        """The live executors that answered a ping in the last ``recent_s`` seconds."""
        since = time.monotonic() - recent_s
        return [e for e in self.executors.values() if e.alive and self.last_pong.get(e.id, since - 1) >= since]

    async def wait_for_executor(self, device: str, known: set[str], timeout: float) -> str | None:
        """The id of a live executor of class ``device`` not in ``known``, once one has joined
        (an autoscaler's new pod registering itself), or None after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for info in self.executors.values():
                if info.alive and info.device == device and info.id not in known:
                    return info.id
            if time.monotonic() >= deadline:
                return None
            if self._joined is None:
                self._joined = asyncio.Event()
            try:
                await asyncio.wait_for(self._joined.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                pass

    def executor_back(self, id_: str) -> None:
        info = self.executors.get(id_)
        if info is not None:
            info.alive = True
        self._unpark()

    def _unpark(self) -> None:
        """Dispatch the requests that waited for an executor (one is back, or built a flow)."""
        parked, self._parked = self._parked, []
        for req in parked:
            if not req.future.done():
                self._dispatch(req)

    # -- loading --------------------------------------------------------------------------

    async def load(self, flow: str, version: int, placement: dict[str, list[str]], timeout: float) -> dict:
        """Ask every executor to build its stages of a flow; returns executor -> error or None."""
        per_exec: dict[str, list[str]] = {}
        for stage, ids in placement.items():
            for i in ids:
                per_exec.setdefault(i, []).append(stage)
        waits, results = {}, {}
        for ex_id, stages in per_exec.items():
            info = self.executors.get(ex_id)
            if info is None:  # stopped since it was placed
                results[ex_id] = f"executor {ex_id} left the cluster before it built the flow"
                continue
            self.loading[ex_id] += 1
            token = f"load-{next(self._ids)}"
            fut = asyncio.get_running_loop().create_future()
            self._waiters[token] = fut
            waits[ex_id] = (token, fut)
            self._building[token] = ex_id
            self.links.send(info.address, Load(flow, version, sorted(set(stages)), self.address, token).encode())
        for ex_id, (token, fut) in waits.items():
            try:
                reply: Loaded = await asyncio.wait_for(fut, timeout)
                results[ex_id] = reply.error
                info = self.executors.get(ex_id)
                if not reply.error and info is not None:
                    info.loaded.add((flow, version))
                    if self._parked:
                        self._unpark()
            except asyncio.TimeoutError:
                results[ex_id] = f"executor {ex_id} did not load the flow within {timeout:.0f} s"
            except ExecutorLost as e:
                results[ex_id] = str(e)
            finally:
                self._waiters.pop(token, None)
                self._building.pop(token, None)
                self.loading[ex_id] -= 1
                if self.loading[ex_id] <= 0:
                    del self.loading[ex_id]
        return results

    # -- installing and retiring flow versions ----------------------------------------------

    def install(self, name: str, flow: DeployedFlow) -> DeployedFlow | None:
        """Serve ``flow`` under ``name`` unless a version at least as new is served already.
        Versions only move forward, so of two deploys that race the newer wins wherever
        they finish in time. Returns the version served instead (``flow`` then was not
        installed; its replicas are released) or None; a replaced version is released."""
        current = self.flows.get(name)
        if current is not None and current.version >= flow.version:
            if current is not flow:
                self.retire(flow)
            return current
        self.flows[name] = flow
        jsontensors.preload(flow.plan.input_schema)  # image flows: their first JSON body need not wait for it
        if current is not None:
            self.retire(current)
        return None

    def uninstall(self, name: str) -> DeployedFlow | None:
        """Stop serving ``name`` (undeploy); its replicas are released once idle."""
        flow = self.flows.pop(name, None)
        if flow is not None:
            self.retire(flow)
        return flow

    def retire(self, flow: DeployedFlow) -> None:
        """Release a flow version's replicas on the executors once the requests that use it
        have finished (they were routed to it and must still be answered)."""
        if self._loop is None:
            return  # not serving (tests that drive a dispatcher by hand): nothing was built
        task = self._loop.create_task(self._release(flow))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, flow: DeployedFlow) -> None:
        name, version = flow.plan.flow_name, flow.version
        while any(r.flow is flow for r in self.requests.values()):
            # every request has a deadline (its timer answers it), so this ends; polling the
            # table keeps the hot path (submit/_finish) free of bookkeeping for a rare event
            await asyncio.sleep(0.05)
        served = self.flows.get(name)
        if served is not None and served.version == version:
            return  # installed again meanwhile (the same version): keep it
        candidate = self.candidates.get(name)
        if candidate is not None and candidate.version == version:
            return  # a canary or shadow of that version serves beside the primary: keep it
        for info in self.executors.values():
            info.loaded.discard((name, version))
            if info.alive:  # every one: an executor may have built it on a message alone
                self.links.send(info.address, Unload(name, version).encode())
        log.info("flow %s v%s released on the executors", name, version)

    async def reload_missing(self, timeout: float) -> dict:
        """Build served flows again on live executors that should host them and do not
        (their load failed, e.g. while the store was empty after a restart). Returns
        (flow, executor) -> error for the loads that failed again."""
        failed = {}
        for name, f in list(self.flows.items()):
            key = (name, f.version)
            missing = {}
            for stage, ids in f.placement.items():
                for i in ids:
                    info = self.executors.get(i)
                    if info is not None and info.alive and key not in info.loaded:
                        missing.setdefault(stage, []).append(i)
            if not missing:
                continue
            errors = await self.load(name, f.version, missing, timeout)
            failed.update({(name, i): e for i, e in errors.items() if e})
            if self.flows.get(name) is not f:  # replaced while loading: do not keep its replicas
                self.retire(f)
        return failed

    # -- requests -------------------------------------------------------------------------------

    def relays_to(self, flow: DeployedFlow) -> str | None:
        """The stage a one-row body of ``flow`` may be relayed to unparsed (RawInput): its
        relay stage, when every executor hosting it said it takes bodies and, in a flow of
        several stages, every executor hosting one of them said it passes the answer's
        rendering on to the sink (Pong.renders); else None."""
        stage = flow.relay_stage
        if stage is None or not self._take_bodies(flow.placement[stage]):
            return None
        if len(flow.placement) > 1 and not self._render_anywhere(i for ids in flow.placement.values() for i in ids):
            return None
        return stage

    def relay_idle(self, flow: DeployedFlow) -> bool:
        """Whether every executor hosting ``flow``'s relay stage has no request in flight:
        one that parses a relayed body now delays nobody (invoke._relayable)."""
        stage, executors = flow.relay_stage, self.executors
        if stage is None:
            return False
        for i in flow.placement[stage]:
            info = executors.get(i)
            if info is not None and info.inflight:
                return False
        return True

    def _render_anywhere(self, executor_ids) -> bool:
        """Whether every one of these executors said it passes a relayed body's rendering on."""
        return all(self.renders.get(i, False) for i in executor_ids)

    def _take_bodies(self, executor_ids) -> bool:
        """Whether every one of these executors said in its last pong that it takes bodies."""
        return all(self.relays.get(i, False) for i in executor_ids)

    def new_qid(self) -> int:
        """One fresh query id (a one-row request's)."""
        qid = self.next_qid
        self.next_qid += 1
        return qid

    def new_qids(self, n: int) -> np.ndarray:
        """``n`` fresh query ids (consecutive; unique for this gateway's lifetime)."""
        start = self.next_qid
        self.next_qid += n
        return np.arange(start, start + n, dtype=np.int64)

    async def submit(
        self,
        name: str,
        table: Table | None,
        timeout: float,
        trace: list | None = None,
        raw: RawBody | None = None,
        rid: str = "",
        traceparent: str = "",
        flow: DeployedFlow | None = None,
        hangup=None,
        on_partial=None,
    ) -> Table | Rendered:
        """Run a request; its answer, and (into ``trace``) where each stage ran and how long.
        With ``raw`` (and no table) the body goes to the flow's relay stage as it came, and
        the answer is the client's JSON already (``Rendered``). ``rid``: its request id,
        which goes with it to the executors (their log lines name it); ``traceparent``: the
        gateway's span of it, which the executors' spans continue (executors/tracing.py).
        ``hangup``: the request's link to its client (invoke.Hangup), which gives the
        request up (``give_up``) when the client disconnects. ``on_partial(table, final,
        start)``: a streamed request's rows sent ahead of its answer (messages.Partial: a
        first_then's fast rows, a generator's outputs as it yields them), as they arrive;
        its run messages say the request is streamed (``StageInput.stream``)."""
        flow = self.flows[name] if flow is None else flow  # ``flow``: the version rollouts.py picked
        loop = self.loop()
        req = Request(
            next(self._ids),
            flow,
            table,
            time.time() + timeout,
            loop.create_future(),
            retries_left=self.max_retries,
            raw=raw,
            rid=rid,
            traceparent=traceparent,
        )
        self.requests[req.id] = req
        if on_partial is not None:
            self._on_partial[req.id] = on_partial
        if hangup is not None:
            hangup.bind(self.give_up, req)
        # a timer rather than asyncio.wait_for: no task per request. It fires a little after
        # the deadline: an executor running the request then answers first, naming the operator
        timer = loop.call_later(timeout + min(DEADLINE_GRACE_S, 0.1 * timeout), self._time_out, req, timeout)
        try:
            self._dispatch(req)
            try:
                out = await req.future
            except asyncio.CancelledError:
                # the caller stopped waiting (a stream closed early: its other rows are not
                # wanted): the request's work on the executors is cancelled too
                self.revoke(req)
                raise
            if trace is not None:
                trace.extend(req.trace)
            return out
        finally:
            timer.cancel()
            if on_partial is not None:
                self._on_partial.pop(req.id, None)
            if hangup is not None:
                hangup.unbind(req)
            self._finish(req)

    def _time_out(self, req: Request, timeout: float) -> None:
        if req.future.done():
            return
        self._resolve(
            req,
            error=RequestFailed.of(
                DeadlineExceededError(f"flow {req.flow.plan.flow_name!r}: no answer within {timeout:g} s")
            ),
        )
        self.revoke(req)

    def give_up(self, req: Request) -> None:
        """The request's client disconnected before its answer: answer it 499 (nobody reads
        it; the metrics count it so) and cancel its work on the executors (``revoke``)."""
        if req.future.done():
            return
        why = f"flow {req.flow.plan.flow_name!r}: the client closed the connection before the answer"
        self._resolve(req, error=RequestFailed(CLIENT_CLOSED, {"error": "ClientClosedRequest", "message": why}))
        self.revoke(req)

    def revoke(self, req: Request) -> None:
        """Tell the executors that may hold the request's work (those hosting a stage of its
        flow version) to drop it: its queued inputs, the runs that serve only it, what it
        would send on (messages.Revoke). Its record here goes as it is answered, so late
        answers are dropped. Revokes of one turn of the loop leave as one message per
        executor, so a burst of disconnects under load costs a message an executor."""
        first = not self._revoking
        for ids in req.flow.placement.values():
            for ex in ids:
                info = self.executors.get(ex)
                if info is not None and info.alive:
                    reqs = self._revoking.setdefault(info.address, [])
                    if not reqs or reqs[-1] != req.id:
                        reqs.append(req.id)
        if first and self._revoking:
            if self._loop is None:
                self._send_revokes()
            elif not self._loop.is_closed():  # a gateway stopping cancels what still waits
                self._loop.call_soon(self._send_revokes)

    def _send_revokes(self) -> None:
        revoking, self._revoking = self._revoking, {}
        for address, reqs in revoking.items():
            self.links.send(address, Revoke(self.address, reqs).encode())

    def _finish(self, req: Request) -> None:
        if self.requests.pop(req.id, None) is not None:
            for ex in req.executors:
                info = self.executors.get(ex)
                if info is not None and info.inflight > 0:
                    info.inflight -= 1
            self._unassign(req)

    def _account(self, req: Request, used: set, assigned: list) -> None:
        """Count ``req`` in flight on the executors and replicas it was routed to."""
        for ex in used - req.executors:
            self.executors[ex].inflight += 1
        req.executors |= used
        self._unassign(req)  # a re-run is routed afresh
        for ex, key in assigned:
            info = self.executors[ex]
            info.assigned[key] = info.assigned.get(key, 0) + 1
        req.assigned = assigned

    def _unassign(self, req: Request) -> None:
        for ex, stage in req.assigned:
            info = self.executors.get(ex)
            if info is not None and info.assigned.get(stage, 0) > 0:
                info.assigned[stage] -= 1
        req.assigned = []

    def _dispatch(self, req: Request) -> None:
        plan = req.flow.plan
        try:
            routes, used, assigned = self._routes(req.flow)
        except NoExecutorError as e:
            if self.wait_for_restarts and any(not i.alive for i in self.executors.values()):
                self._parked.append(req)  # executor_back dispatches it; its deadline still holds
                return
            self._resolve(req, error=RequestFailed.of(e))
            return
        for stage in routes:
            self.stage_counters(plan.flow_name, stage).arrivals += 1
        self._account(req, used, assigned)
        req.parts = {}
        raw = req.raw
        if raw is not None:
            stage = req.flow.relay_stage
            if not self._take_bodies(used) or (len(plan.stages) > 1 and not self._render_anywhere(used)):
                # re-run on an executor that cannot read a body (an older release, started
                # since the request came): the client may send it again
                why = f"flow {plan.flow_name!r}: executor {sorted(used)} does not take relayed bodies; retry"
                self._resolve(req, error=RequestFailed.of(NoExecutorError(why)))
                return
            for copy, address in enumerate(routes[stage]):  # one address, or a racing stage's copies
                msg = RawInput(
                    req.id,
                    req.attempt,
                    plan.flow_name,
                    req.flow.version,
                    stage,
                    routes,
                    self.address,
                    raw.qid,
                    raw.ctype,
                    req.deadline,
                    solo=req.solo,
                    copy=copy,
                    rid=req.rid,
                    tp=req.traceparent,
                    body=raw.body,
                )
                self.links.send(address, msg.encode())
            return
        streamed = req.id in self._on_partial  # the stream's rows may go ahead (progress.py)
        for consumer in self._input_consumers(plan):
            stage = plan.stages[consumer]
            sent = deliveries(req.table, stage, routes[consumer])
            msgs = [
                StageInput(
                    req.id,
                    req.attempt,
                    plan.flow_name,
                    req.flow.version,
                    consumer,
                    INPUT,
                    routes,
                    self.address,
                    req.deadline,
                    path=d.path,
                    copy=d.copy,
                    solo=req.solo,
                    rid=req.rid,
                    tp=req.traceparent,
                    stream=streamed,
                    table=d.table,
                )
                for d in sent
            ]
            if len(sent) > 1 and all(d.copy for d in sent[1:]):
                # racing copies: the same rows to each, the table encoded once (headers differ by copy)
                frames = pack_copies([m.header() for m in msgs], msgs[0].tables())
            else:
                frames = [m.encode() for m in msgs]
            for d, f in zip(sent, frames):
                self.links.send(d.address, f)

    @staticmethod
    def _input_consumers(plan: Plan) -> list[str]:
        return [s.name for s in plan.stages.values() if INPUT in s.inputs]

    def _routes(self, flow: DeployedFlow) -> tuple[dict[str, list[str]], set[str], list]:
        """Per stage, the addresses that run it for this request; the executors used; and the
        (executor, stage) replicas it is assigned to (balanced per stage).

        Where no stage has replicas to rank (one live host each, or a continuation, which
        goes to all of them), the answer is the same for every request while its executors
        stay as they were: it is kept on the flow and checked against them (one look per
        executor, not per stage): on a 6-stage flow 0.3 us a request instead of 6.9."""
        key = (flow.plan.flow_name, flow.version)
        fixed = flow.fixed_routes
        if fixed is not None:
            executors = self.executors
            for i, info, live in fixed[0]:
                now = executors.get(i)
                if now is not info or (now is not None and now.alive and key in now.loaded) is not live:
                    break
            else:
                return fixed[1]
        routes, used, assigned = {}, set(), []
        ranked = False
        for name, stage in flow.plan.stages.items():
            hosts = (self.executors.get(i) for i in flow.placement[name])
            live = [e for e in hosts if e is not None and e.alive and key in e.loaded]
            if not live:
                raise NoExecutorError(f"flow {flow.plan.flow_name!r}: no live executor hosts stage {name!r}")
            if stage.continuation is not None:
                routes[name] = sorted(e.address for e in live)
                used.update(e.id for e in live)
                continue
            # the replica with the fewest of this stage's requests first; then the executor
            # with the fewest requests; among equals, where an input of this stage runs (its
            # output is already there: the hop is a hand-over, not a message) -- or, with
            # colocate off, anywhere else -- then the one that took the stage last (at a
            # trickle it is still polling for messages and warm: no wake-up), then in turn
            k = stage.competitive if stage.hedge is None else min(2, len(live))  # hedged: a backup named
            n, replica_key = len(live), (flow.plan.flow_name, name)
            if n == 1:
                chosen = live * k  # one replica: nothing to rank (copies race on it)
            else:
                ranked = True
                near = {a for i in stage.inputs for a in routes.get(i, ())}
                turn = next(self._rr)
                last = self._last_pick.get(replica_key)
                order = sorted(
                    range(n),
                    key=lambda j: (
                        live[j].assigned.get(replica_key, 0),
                        live[j].inflight,
                        (live[j].address in near) != self.colocate,
                        live[j].id != last,
                        (j + turn) % n,
                    ),
                )
                chosen = [live[order[j % n]] for j in range(k)]
            self._last_pick[replica_key] = chosen[0].id
            routes[name] = [e.address for e in chosen]
            running = chosen if stage.hedge is None else chosen[:1]
            used.update(e.id for e in running)
            assigned.extend((e.id, replica_key) for e in running)
        flow.fixed_routes = None
        if not ranked:
            hosts = {i: self.executors.get(i) for ids in flow.placement.values() for i in ids}
            flow.fixed_routes = (
                tuple((i, e, e is not None and e.alive and key in e.loaded) for i, e in hosts.items()),
                (routes, used, assigned),
            )
        return routes, used, assigned

    def _retry(self, req: Request, why: str) -> None:
        if req.future.done():
            return
        if req.retries_left <= 0 or time.time() >= req.deadline:
            self._resolve(req, error=RequestFailed.of(NoExecutorError(f"request failed after retries: {why}")))
            return
        req.retries_left -= 1
        req.attempt += 1
        log.warning(
            "re-running request %s (id %s, attempt %s%s): %s",
            req.id,
            req.rid or "-",
            req.attempt,
            tracing.log_tag(req.traceparent),
            why,
        )
        if self.metrics:
            self.metrics.retries.labels(req.flow.plan.flow_name).inc()
        self._dispatch(req)

    def _resolve(self, req: Request, result: Table | None = None, error: Exception | None = None) -> None:
        if req.future.done():
            return
        if error is not None:
            req.future.set_exception(error)
        else:
            req.future.set_result(result)

    # -- answers -----------------------------------------------------------------------------

    def _stale_answer(self, header: dict) -> bool:
        """An answer no request waits for (a losing racing copy's, a superseded attempt's):
        dropped before its tables are decoded."""
        key = answer_key(header)
        if key is None:
            return False
        req = self.requests.get(key[0])
        return req is None or key[1] != req.attempt or req.future.done()

    def _on_message(self, msg: Message) -> None:
        kind = type(msg)
        if kind is Result or kind is Rendered or kind is Failure:
            req = self.requests.get(msg.req)
            if req is None or msg.attempt != req.attempt or req.future.done():
                return  # answered already (e.g. a losing racing copy), or a superseded attempt
            if kind is Failure:
                self._resolve(req, error=RequestFailed(msg.status, msg.body()))
                if msg.status == DEADLINE_STATUS:  # its deadline passed: other stages may still hold its work
                    self.revoke(req)
                return
            if kind is Rendered:
                out = msg  # a relayed body's answer, the client's JSON already
            else:
                path = tuple(tuple(p) for p in msg.path)
                req.parts.setdefault(path, msg.table)
                if not complete(req.parts):
                    return
                out = merge(req.parts)  # key-split parts: back in the request's row order
            req.trace = list(msg.trace)
            self._resolve(req, result=out)
            # the stage counters and metrics once the answer is written (the request's task
            # runs first: it was woken before this callback was queued)
            self._loop.call_soon(self._record, req.flow, msg.trace)
        elif kind is Loaded or kind is Pong:
            if kind is Pong:
                self.relays[msg.executor] = msg.relays
                self.renders[msg.executor] = msg.renders
                if msg.stats is not None:
                    self.executor_stats[msg.executor] = msg.stats
                info = self.executors.get(msg.executor)
                if info is not None:
                    info.gpus = msg.gpus
                self.last_pong[msg.executor] = time.monotonic()
            fut = self._waiters.get(msg.token)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif kind is Partial:
            self._partial(msg)
        elif kind is Stuck or kind is Unstuck or kind is Recycling:
            self._executor_report(msg)
        else:
            log.warning("dropped a %r message: gateways do not take those", msg.TYPE)

    def _partial(self, msg: Partial) -> None:
        """Rows ahead of the answer (a first_then's fast rows, a generator's outputs): to the
        request's stream, if it has one (streaming.py) and still waits for this attempt's answer."""
        on_partial = self._on_partial.get(msg.req)
        req = self.requests.get(msg.req)
        if on_partial is not None and req is not None and msg.attempt == req.attempt and not req.future.done():
            on_partial(msg.table, msg.final, msg.start)

    def _executor_report(self, msg: Stuck | Unstuck | Recycling) -> None:
        """An executor's watchdog says a thread is held by abandoned work, is back, or that
        it is recycling itself (its in-flight requests are re-run elsewhere at once)."""
        info = self.executors.get(msg.executor)
        if info is None:
            return
        if isinstance(msg, Recycling):
            if info.alive:
                log.warning("executor %s is recycling itself: %s", info.id, msg.reason)
                info.recycled += 1
                if self.metrics:
                    self.metrics.recycles.labels(info.id, "stuck").inc()
                self.executor_died(info.id, reason="recycled")
            return
        what = (msg.flow, msg.stage, msg.operator)
        if isinstance(msg, Stuck):
            info.stuck[what] = info.stuck.get(what, 0) + 1
            info.stuck_since = info.stuck_since or float(msg.since or time.time())
            log.warning("executor %s: a thread is stuck in operator %r (flow %s)", info.id, what[2], what[0])
        else:
            left = info.stuck.get(what, 0) - 1
            if left > 0:
                info.stuck[what] = left
            else:
                info.stuck.pop(what, None)
            if not info.stuck:
                info.stuck_since = None

    def stage_counters(self, flow: str, stage: str) -> StageCounters:
        c = self._counters.get((flow, stage))
        if c is None:
            c = self._counters[(flow, stage)] = StageCounters()
        return c

    def inflight_by_stage(self, flow: str) -> dict[str, int]:
        """Requests in flight per stage of a flow (a request counts for each of its stages)."""
        out: dict[str, int] = {}
        for req in self.requests.values():
            if req.flow.plan.flow_name == flow:
                for stage in req.flow.plan.stages:
                    out[stage] = out.get(stage, 0) + 1
        return out

    def _record(self, flow: DeployedFlow, trace) -> None:
        name = flow.plan.flow_name
        if self.metrics:
            self.metrics.observe_trace(name, trace, flow.plan)
        now = time.monotonic()  # one answer: one moment for all its stages
        for entry in trace:
            stage, ex, ms, batch = entry[:4]
            ms, batch = float(ms), max(1, int(batch))
            c = self.stage_counters(name, stage)
            c.service_ms += ms / batch
            c.served += 1
            c.batches.append((now, batch))
            if len(entry) > 4:
                extra = entry[4]
                if isinstance(extra, dict) and isinstance(extra.get("cap"), int):
                    c.caps[str(ex)] = (now, extra["cap"])
            recent = flow.stats.get(stage)
            if recent is None:
                recent = flow.stats[stage] = []
            recent.append(ms)
            if len(recent) > 200:
                del recent[:100]
