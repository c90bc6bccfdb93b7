"""Canary and shadow versions: a new version of a served flow (the *candidate*) beside the
version that serves it (the *primary*), until an admin promotes it or rolls it back.

    POST /admin/deploy {"flow": f, "version": v, "canary": 0.1}   v answers 10% of requests
    POST /admin/deploy {"flow": f, "version": v, "shadow": true}  v sees every request; its
                                                                  answers are compared, never returned
    POST /admin/flows/{name}/promote     the candidate becomes the primary
    POST /admin/flows/{name}/rollback    the primary's plan serves again as a new version, and the
                                         candidate (if any) is dropped

A canary's share is kept exactly over every 1000 requests and within a request or two over
any run of them (``Split``), the requests it takes drawn at random positions so that no
periodic pattern in the traffic lines up with it. A
shadow request is the primary's request with fresh query ids, sent at the same time; its
answer is compared with the primary's per column once both are in (``Differences``), off
the client's path. ``GET /flows/{name}`` shows both versions' requests, errors and latency
side by side (``Rollout.describe``).

Versions only move forward, and the two rules of deploys.py hold with a candidate beside
the primary: a candidate's plan is a version of its own, stored and signed for its key like
any deploy; it must be newer than the primary and than every version the gateway has served
(``served_high`` counts primaries only: the primary stays loadable while a candidate runs).
Promoting registers the candidate in the registry, which only moves forward. Rolling back
never serves an old version again: it serves the old *plan* as a new version (read under
its own key, its signature checked, stored and signed under the new one), so ``served_high``
moves past the dropped candidate, which no gateway will load again. Each admin action is
recorded in the store (``HISTORY_KEY``, newest first) with who it replaced; the candidate in
progress is recorded under ``ROLLOUT_KEY``, which the other gateways (and a restarted one)
read to serve the same candidate (``Rollouts.sync``). A new primary version (a deploy, an SLO
re-plan, a promote) ends a rollout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from executors.codec.bodies import OFF_LOOP_ROWS, BadRequestError, json_rows
from executors.errors import RolloutStateError, http_error, http_error_for
from executors.gateway.deploys import LoadFailed, read_plan
from executors.gateway.records import DeployedFlow, RawBody, RequestFailed
from executors.gateway.status import describe
from executors.wire.messages import Rendered
from flow.errors import FlowError
from flow.table import Table
from kvs.errors import store_problem

log = logging.getLogger("flowserve.gateway")

ROLLOUT_KEY = "flowserve:rollout"  # hash: flow -> JSON of its candidate (version, mode, share, primary)
HISTORY_KEY = "flowserve:history:{flow}"  # list: the flow's admin actions, newest first
HISTORY_LEN = 100
SPLIT_BLOCK = 1000  # a canary's share is exact over every this many requests
LATENCY_WINDOW = 2048  # the latencies p50/p99 are taken over, per version
MODES = ("canary", "shadow")


def rollout_mode(canary, shadow) -> tuple[str, float] | None:
    """``("canary", share)`` or ``("shadow", 1.0)`` for a deploy's ``canary=``/``shadow=``, None
    for a plain deploy; ``BadRequestError`` naming the bad value otherwise. The client and the
    gateway both check with it, so the message is the same on every path.

        >>> rollout_mode(0.1, False)
        ('canary', 0.1)
    """
    if shadow not in (None, False, True):
        raise BadRequestError(f"shadow must be true or false, got {shadow!r}")
    if canary is None:
        return ("shadow", 1.0) if shadow else None
    if shadow:
        raise BadRequestError("a deploy is either a canary (canary=share) or a shadow (shadow=True), not both")
    if isinstance(canary, bool) or not isinstance(canary, (int, float)) or not 0.001 <= canary <= 0.999:
        raise BadRequestError(
            f"canary must be the share of requests the new version answers, from 0.001 to 0.999, got {canary!r}"
        )
    return "canary", round(float(canary), 3)


# -- the store's record of rollouts ---------------------------------------------------------


def read_rollouts(redis) -> dict[str, dict]:
    """Every candidate in progress: flow -> {"version", "mode", "share", "primary", "at"}."""
    return {k.decode(): json.loads(v) for k, v in redis.hgetall(ROLLOUT_KEY).items()}


def read_history(redis, flow: str, n: int = 20) -> list[dict]:
    """The last ``n`` admin actions on ``flow``, newest first."""
    return [json.loads(e) for e in redis.lrange(HISTORY_KEY.format(flow=flow), 0, n - 1)]


def _append_history(redis, flow: str, event: dict) -> None:
    key = HISTORY_KEY.format(flow=flow)
    pipe = redis.pipeline(transaction=True)
    pipe.lpush(key, json.dumps(event, sort_keys=True))
    pipe.ltrim(key, 0, HISTORY_LEN - 1)
    pipe.execute()


def record_action(redis, flow: str, event: dict, rollout: dict | None = None) -> None:
    """Record an admin action on ``flow`` (``event``, stamped with the time) and the rollout
    it leaves: ``rollout`` the candidate now in progress, None for none."""
    _append_history(redis, flow, {**event, "at": round(time.time(), 3)})
    if rollout is None:
        redis.hdel(ROLLOUT_KEY, flow)
    else:
        redis.hset(ROLLOUT_KEY, flow, json.dumps(rollout, sort_keys=True))


def _forget(redis, flow: str, version: int) -> None:
    """Remove ``flow``'s rollout record if it is of ``version`` (best effort)."""
    try:
        rec = redis.hget(ROLLOUT_KEY, flow)
        if rec is not None and json.loads(rec).get("version") == version:
            redis.hdel(ROLLOUT_KEY, flow)
    except Exception as e:  # whatever the store answered: the other gateways skip it (older than served)
        log.warning("flow %s: could not remove the record of v%s: %s", flow, version, e)


def previous_primary(history: list[dict], version: int) -> int | None:
    """The version that ``version`` replaced as the primary, from the flow's history."""
    for event in history:
        if event.get("version") == version and event.get("action") in ("deploy", "promote", "rollback", "replan"):
            return event.get("replaced")
    return None


# -- what a rollout keeps -------------------------------------------------------------------


class Split:
    """Which requests a canary takes: ``k`` of every ``SPLIT_BLOCK``, one at a random position
    in each of ``k`` equal runs of the block. The share is exact over each block and within
    a request or two over any run of requests, and no periodic pattern in the traffic lines
    up with it: each position of a run is as likely as any other."""

    def __init__(self, share: float, rng: random.Random | None = None):
        self.k = max(1, min(SPLIT_BLOCK - 1, round(share * SPLIT_BLOCK)))
        self.rng = rng or random.Random()
        self.edges = [i * SPLIT_BLOCK // self.k for i in range(self.k + 1)]  # the runs: [edges[i], edges[i+1])
        self.i = SPLIT_BLOCK
        self.chosen: set[int] = set()

    def take(self) -> bool:
        """Whether the next request goes to the candidate."""
        if self.i >= SPLIT_BLOCK:
            self.i = 0
            e, rng = self.edges, self.rng
            self.chosen = {e[j] + rng.randrange(e[j + 1] - e[j]) for j in range(self.k)}
        self.i += 1
        return self.i - 1 in self.chosen


@dataclass
class VersionStats:
    """One version's answers during a rollout: how many, which failed, how long they took."""

    version: int
    requests: int = 0
    by_status: Counter = field(default_factory=Counter)  # non-200 answers by status
    latencies: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))

    def answered(self, ms: float, status: int) -> None:
        self.requests += 1
        if status != 200:
            self.by_status[status] += 1
        else:
            self.latencies.append(ms)

    def describe(self) -> dict:
        lat = np.asarray(self.latencies, dtype=np.float64)
        errors = sum(self.by_status.values())
        return {
            "version": self.version,
            "requests": self.requests,
            "errors": errors,
            "error_rate": errors / self.requests if self.requests else None,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "p50_ms": round(float(np.percentile(lat, 50)), 3) if lat.size else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 3) if lat.size else None,
        }


@dataclass
class Differences:
    """A shadow's answers compared with the primary's: per column, the answers in which it
    differs (a column only one of them has differs too; ``rows`` counts answers of another
    length, whose columns are then not compared row by row)."""

    compared: int = 0
    differ: int = 0
    rows: int = 0
    columns: Counter = field(default_factory=Counter)
    not_compared: int = 0  # one of the two failed: nothing to compare (its errors are counted)

    def count(self, differing: list[str] | None) -> None:
        """Count one comparison: ``differing_columns`` of the two answers."""
        self.compared += 1
        if differing is None:
            self.rows += 1
            self.differ += 1
        elif differing:
            self.differ += 1
            self.columns.update(differing)

    def describe(self) -> dict:
        return {
            "compared": self.compared,
            "differ": self.differ,
            "rows": self.rows,
            "columns": dict(sorted(self.columns.items())),
            "not_compared": self.not_compared,
        }


def differing_columns(a, b) -> list[str] | None:
    """The columns in which two answers (Tables, or relayed JSON answers) differ; None if
    they have different numbers of rows. Exact: a float that moved at all differs (NaN
    equals NaN); query ids are not compared (a shadow's are its own)."""
    if isinstance(a, Table) and isinstance(b, Table):
        if len(a) != len(b):
            return None
        names = sorted(set(a.columns) | set(b.columns))
        return [c for c in names if c not in a or c not in b or not a.column(c).equals(b.column(c))]
    ra, rb = _json_rows(a), _json_rows(b)
    if len(ra) != len(rb):
        return None
    names = sorted(({k for r in ra for k in r} | {k for r in rb for k in r}) - {"qid"})
    missing = object()
    return [c for c in names if any(x.get(c, missing) != y.get(c, missing) for x, y in zip(ra, rb))]


def _json_rows(answer) -> list[dict]:
    body = answer.body if isinstance(answer, Rendered) else json_rows(answer)
    return orjson.loads(bytes(body))["rows"]


@dataclass
class Rollout:
    """A candidate version of a flow in progress on this gateway."""

    name: str
    mode: str  # "canary" | "shadow"
    share: float  # the canary's share of requests (1.0 for a shadow: every request is mirrored)
    candidate: DeployedFlow
    primary_version: int
    since: float = field(default_factory=time.time)
    split: Split | None = None
    stopped: bool = False  # a rollback is under way: every request goes to the primary
    stats: dict = field(default_factory=dict)  # version -> VersionStats
    diffs: Differences = field(default_factory=Differences)

    def __post_init__(self) -> None:
        if self.mode == "canary":
            self.split = Split(self.share)

    def stats_for(self, version: int) -> VersionStats:
        s = self.stats.get(version)
        if s is None:
            s = self.stats[version] = VersionStats(version)
        return s

    def record(self) -> dict:
        """What the store keeps of it (``ROLLOUT_KEY``)."""
        return {
            "version": self.candidate.version,
            "mode": self.mode,
            "share": self.share,
            "primary": self.primary_version,
        }

    def describe(self, primary_version: int) -> dict:
        out = {
            "mode": self.mode,
            "share": self.share,
            "since": round(self.since, 3),
            "primary": self.stats_for(primary_version).describe(),
            "candidate": self.stats_for(self.candidate.version).describe(),
        }
        if self.mode == "shadow":
            out["differences"] = self.diffs.describe()
        return out


# -- the gateway's part -----------------------------------------------------------------------


class Rollouts:
    """A gateway's candidates: which version answers each request, the shadows' mirrors and
    comparisons, and the admin routes that start and end a rollout."""

    def __init__(self, gateway):
        self.g = gateway
        self.dispatcher = gateway.dispatcher
        self.store = gateway.store
        self.active: dict[str, Rollout] = {}
        self._tasks: set[asyncio.Task] = set()  # shadow requests in flight
        self._failed: dict[tuple[str, int], float] = {}  # (flow, version) -> when to try loading it again

    @staticmethod
    def mode_of(doc: dict) -> tuple[str, float] | None:
        """``rollout_mode`` of a ``POST /admin/deploy`` body."""
        return rollout_mode(doc.get("canary"), doc.get("shadow"))

    def record_served(self, name: str, event: dict) -> None:
        """Record a new served version (a deploy, a re-plan) in the flow's history: what a
        later rollback goes back from; a recorded candidate older than it is over (deploys.py
        ended it here, ``installed``). Blocking: call it on a worker thread."""
        redis = self.store.redis
        _append_history(redis, name, {**event, "at": round(time.time(), 3)})
        rec = redis.hget(ROLLOUT_KEY, name)
        if rec is not None and int(json.loads(rec).get("version", 0)) < event["version"]:
            redis.hdel(ROLLOUT_KEY, name)

    async def undeployed(self, name: str) -> None:
        """``name`` was undeployed here: its candidate goes too, and its record (best effort:
        other gateways drop the flow, and so its candidate, from the registry alone)."""
        r = self._end(name, retire=True)
        if r is None:
            return
        try:
            await asyncio.to_thread(self.store.redis.hdel, ROLLOUT_KEY, name)
        except Exception as e:  # whatever the store answered: the flow is undeployed all the same
            log.warning("flow %s: could not remove its %s record: %s", name, r.mode, e)

    # -- the data plane ---------------------------------------------------------------------

    def route(self, name: str, flow: DeployedFlow) -> tuple[DeployedFlow, DeployedFlow | None]:
        """The version that answers this request of ``name`` (``flow``, its primary, or a
        canary), and the shadow to mirror it to (or None)."""
        r = self.active.get(name)
        if r is None or r.stopped:
            return flow, None
        if r.split is None:
            return flow, r.candidate
        return (r.candidate if r.split.take() else flow), None

    async def submit(
        self,
        flow: DeployedFlow,
        shadow: DeployedFlow | None,
        name: str,
        table,
        timeout: float,
        trace,
        raw,
        *args,
        **kwargs,
    ):
        """``Dispatcher.submit(name, table, timeout, trace, raw, *args, **kwargs)`` of a request
        that ``route`` gave to ``flow``: counted for its version while a rollout is in
        progress, and mirrored to ``shadow``."""
        r = self.active.get(name)
        if r is None:
            return await self.dispatcher.submit(name, table, timeout, trace, raw, *args, flow=flow, **kwargs)
        loop = asyncio.get_running_loop()
        primary = None
        if shadow is not None:
            primary = loop.create_future()  # the answer the shadow's is compared with
            task = loop.create_task(self._mirror(r, shadow, table, raw, timeout, primary))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        stats = r.stats_for(flow.version)
        t0 = time.perf_counter()
        out = None
        try:
            out = await self.dispatcher.submit(name, table, timeout, trace, raw, *args, flow=flow, **kwargs)
        except RequestFailed as e:
            stats.answered((time.perf_counter() - t0) * 1000, e.status)
            raise
        finally:
            if primary is not None and not primary.done():
                primary.set_result(out)  # None: failed or cancelled, nothing to compare
        stats.answered((time.perf_counter() - t0) * 1000, 200)
        return out

    async def _mirror(self, r: Rollout, shadow: DeployedFlow, table, raw, timeout: float, primary) -> None:
        """Run the request on the shadow (fresh query ids: what the candidate writes by qid,
        such as a select's records, never lands on the primary's) and compare the answers."""
        d = self.dispatcher
        if raw is not None:
            raw = RawBody(raw.body, raw.ctype, d.new_qid())
        elif table is not None:
            table = Table.built({c: table.column(c) for c in table.columns}, d.new_qids(len(table)))
        stats = r.stats_for(shadow.version)
        t0 = time.perf_counter()
        try:
            out = await d.submit(r.name, table, timeout, None, raw, flow=shadow)
        except RequestFailed as e:
            stats.answered((time.perf_counter() - t0) * 1000, e.status)
            r.diffs.not_compared += 1
            return
        stats.answered((time.perf_counter() - t0) * 1000, 200)
        theirs = await primary
        if theirs is None:
            r.diffs.not_compared += 1
            return
        if isinstance(out, Table) and len(out) > OFF_LOOP_ROWS:  # compared on a worker thread: the loop keeps serving
            r.diffs.count(await asyncio.to_thread(differing_columns, theirs, out))
        else:
            r.diffs.count(differing_columns(theirs, out))

    # -- starting, promoting, rolling back ----------------------------------------------------

    async def start(self, name: str, version: int, mode: str, share: float) -> Response:
        """Serve registered plan ``name`` v``version`` as the candidate beside the primary
        (``POST /admin/deploy`` with ``canary`` or ``shadow``)."""
        d, deploys = self.dispatcher, self.g.deploys
        primary = d.flows.get(name)
        if primary is None:
            return _error(
                http_error("UnknownFlow", f"no served version of flow {name!r} to run a {mode} beside; deploy it first")
            )
        busy = self.active.get(name)
        if busy is not None:
            return _error(
                http_error_for(
                    RolloutStateError(
                        f"flow {name!r} has a {busy.mode} of v{busy.candidate.version} in progress: "
                        "promote it or roll it back first"
                    )
                )
            )
        floor = max(primary.version, deploys.served_high.get(name, primary.version))
        if version <= floor:
            return _error(
                http_error(
                    "DeployConflict",
                    f"flow {name!r}: a {mode} must be newer than v{floor}, which this gateway has served; "
                    f"v{version} is not",
                    winner=primary.version,
                )
            )
        try:
            flow = await deploys.load_flow(name, version, install=False)
        except LoadFailed as e:
            return _error(e.answer())
        why = _input_mismatch(name, primary, flow, mode)
        if why is not None:
            d.retire(flow)
            return _error(http_error_for(BadRequestError(why)))
        if d.flows.get(name) is not primary or name in self.active:  # redeployed (or another rollout) meanwhile
            d.retire(flow)
            return _error(
                http_error_for(RolloutStateError(f"flow {name!r} changed while its {mode} was being built; try again"))
            )
        r = Rollout(name, mode, share, flow, primary.version)
        event = {"action": mode, "version": version, "primary": primary.version, "share": share}
        try:
            await deploys.record_change(name, record_action, self.store.redis, name, event, r.record())
        except Exception as e:  # whatever the store answered: not recorded, so not served
            d.retire(flow)
            return _error(
                http_error(
                    "StoreUnavailable",
                    f"flow {name!r}: the {mode} of v{version} was not started, the store could not record it "
                    f"({store_problem(e)})",
                )
            )
        if d.flows.get(name) is not primary or name in self.active:  # changed while the record was written
            d.retire(flow)
            await asyncio.to_thread(_forget, self.store.redis, name, version)
            return _error(
                http_error_for(
                    RolloutStateError(f"flow {name!r} changed while its {mode} was being started; try again")
                )
            )
        self._activate(r)
        log.warning(
            "flow %s: %s of v%s beside v%s%s",
            name,
            mode,
            version,
            primary.version,
            f" ({share:.1%} of requests)" if mode == "canary" else "",
        )
        out = describe(flow, self.dispatcher)
        out["rollout"] = r.describe(primary.version)
        return JSONResponse(out)

    def _activate(self, r: Rollout) -> None:
        self.active[r.name] = r
        self.dispatcher.candidates[r.name] = r.candidate

    def _end(self, name: str, retire: bool) -> Rollout | None:
        r = self.active.pop(name, None)
        if r is None:
            return None
        self.dispatcher.candidates.pop(name, None)
        if retire:
            self.dispatcher.retire(r.candidate)  # its replicas go once its requests finish
        return r

    def installed(self, name: str, flow: DeployedFlow) -> None:
        """``flow`` is ``name``'s primary now (deploys.py): a rollout whose candidate it is
        (promoted) or is older than (a newer deploy or re-plan) ends."""
        r = self.active.get(name)
        if r is None or r.candidate.version > flow.version:
            return
        promoted = r.candidate.version == flow.version
        self._end(name, retire=r.candidate is not flow)
        if not promoted:
            log.warning(
                "flow %s: v%s is served now, which ends the %s of v%s", name, flow.version, r.mode, r.candidate.version
            )

    async def promote(self, request: Request) -> Response:
        """``POST /admin/flows/{name}/promote``: the candidate becomes the primary (registered,
        so every gateway serves it), and the rollout ends."""
        from executors.plans import register_deployed

        name = request.path_params["name"]
        r = self.active.get(name)
        primary = self.dispatcher.flows.get(name)
        if r is None or r.stopped or primary is None:
            return _error(
                http_error_for(RolloutStateError(f"flow {name!r} has no canary or shadow version to promote"))
            )
        version, deploys = r.candidate.version, self.g.deploys
        event = {"action": "promote", "version": version, "replaced": primary.version, "mode": r.mode}
        event["stats"] = r.describe(primary.version)
        try:
            registered = await deploys.record_change(name, register_deployed, self.store.redis, name, version)
            if registered == version:
                await deploys.record_change(name, record_action, self.store.redis, name, event, None)
        except Exception as e:  # whatever the store answered: the candidate stays a candidate
            return _error(
                http_error(
                    "StoreUnavailable",
                    f"flow {name!r}: v{version} was not promoted, the store could not register it ({store_problem(e)})",
                )
            )
        if registered != version:
            return _error(
                http_error(
                    "DeployConflict",
                    f"flow {name!r}: v{version} was not promoted, v{registered} was deployed meanwhile",
                    winner=registered,
                )
            )
        try:
            deploys.install(name, r.candidate)  # ends the rollout (installed)
        except LoadFailed as e:
            return _error(e.answer(winner=self.dispatcher.flows[name].version))
        log.warning("flow %s: v%s promoted (replaces v%s)", name, version, primary.version)
        out = describe(r.candidate, self.dispatcher)
        out["promoted"] = {"version": version, "replaced": primary.version}
        return JSONResponse(out)

    async def rollback(self, request: Request) -> Response:
        """``POST /admin/flows/{name}/rollback``: serve the plan of the version before as a
        new version. With a candidate in progress that is the primary's own plan (the
        candidate is dropped; from this call on every request goes to the primary); without
        one, the plan of the version the primary replaced (from the flow's history)."""
        from executors.plans import PLAN_KEY, next_version, register_deployed

        name = request.path_params["name"]
        d, deploys = self.dispatcher, self.g.deploys
        primary = d.flows.get(name)
        if primary is None:
            return _error(http_error("UnknownFlow", f"no deployed flow named {name!r}"))
        r = self.active.get(name)
        if r is not None and r.stopped:
            return _error(http_error_for(RolloutStateError(f"flow {name!r}: a rollback is in progress already")))
        if r is not None:
            r.stopped = True  # the candidate answers no more requests, whatever happens next
            plan_of, dropped = primary.version, r.candidate.version
        else:
            history = await asyncio.to_thread(read_history, self.store.redis, name, HISTORY_LEN)
            plan_of, dropped = previous_primary(history, primary.version), None
            if plan_of is None:
                return _error(
                    http_error_for(
                        RolloutStateError(
                            f"flow {name!r}: no version before v{primary.version} is recorded, nothing to roll back to"
                        )
                    )
                )
        try:
            # the old plan as it was signed for its own key: a plan copied there is refused
            plan, _ = await asyncio.to_thread(read_plan, self.store, name, plan_of)
            version = await asyncio.to_thread(next_version, self.store.redis, name)
            await asyncio.to_thread(self.store.put_trusted, PLAN_KEY.format(flow=name, version=version), plan)
        except FlowError as e:  # gone, or refused (SerializationError): nothing changed
            if r is not None:
                r.stopped = False
            return _error(
                http_error("UnknownPlan", f"flow {name!r}: not rolled back, the plan of v{plan_of} cannot be read: {e}")
            )
        except Exception as e:  # whatever the store answered: nothing changed
            if r is not None:
                r.stopped = False
            return _error(
                http_error(
                    "StoreUnavailable",
                    f"flow {name!r}: not rolled back, the store could not serve the plan of v{plan_of} again "
                    f"({store_problem(e)})",
                )
            )
        try:
            flow = await deploys.load_flow(name, version, install=False)
        except LoadFailed as e:
            if r is not None:
                r.stopped = False
            return _error(e.answer())
        event = {"action": "rollback", "version": version, "plan_of": plan_of, "replaced": primary.version}
        if dropped is not None:
            event["dropped"] = dropped
            event["stats"] = r.describe(primary.version)
        try:
            registered = await deploys.record_change(name, register_deployed, self.store.redis, name, version)
            if registered == version:
                await deploys.record_change(name, record_action, self.store.redis, name, event, None)
        except Exception as e:  # whatever the store answered: the rollback is not recorded, so not served
            d.retire(flow)
            if r is not None:
                r.stopped = False
            return _error(
                http_error(
                    "StoreUnavailable",
                    f"flow {name!r}: not rolled back, the store could not register v{version} ({store_problem(e)})",
                )
            )
        if registered != version:
            d.retire(flow)
            return _error(
                http_error(
                    "DeployConflict",
                    f"flow {name!r}: not rolled back, v{registered} was deployed meanwhile",
                    winner=registered,
                )
            )
        try:
            deploys.install(name, flow)  # newer than any candidate: ends the rollout (installed)
        except LoadFailed as e:
            return _error(e.answer(winner=d.flows[name].version))
        log.warning(
            "flow %s: rolled back to the plan of v%s, served as v%s (replaces v%s%s)",
            name,
            plan_of,
            version,
            primary.version,
            f"; drops v{dropped}" if dropped is not None else "",
        )
        out = describe(flow, self.dispatcher)
        out["rolled_back"] = {k: v for k, v in event.items() if k in ("version", "plan_of", "replaced", "dropped")}
        return JSONResponse(out)

    async def history(self, request: Request) -> Response:
        """``GET /flows/{name}/history``: the flow's recorded admin actions, newest first."""
        name = request.path_params["name"]
        try:
            events = await asyncio.to_thread(read_history, self.store.redis, name, HISTORY_LEN)
        except Exception as e:  # the store did not answer: say so rather than an empty history
            return _error(http_error("StoreUnavailable", f"flow {name!r}: history unreadable ({store_problem(e)})"))
        return JSONResponse({"flow": name, "history": events})

    def describe(self, name: str) -> dict | None:
        r = self.active.get(name)
        primary = self.dispatcher.flows.get(name)
        if r is None or primary is None:
            return None
        return r.describe(primary.version)

    # -- other gateways' rollouts -------------------------------------------------------------

    async def sync(self, read_at: float) -> None:
        """Serve the candidates the store records, as the gateway that started them does
        (one started, promoted or rolled back on another gateway, or before this one
        restarted). A rollout changed here since ``read_at`` (monotonic) is left alone: the
        read may predate the change."""
        records = await asyncio.to_thread(read_rollouts, self.store.redis)
        changed = self.g.deploys.changed_at
        for name in list(self.active):
            rec = records.get(name)
            if changed.get(name, float("-inf")) < read_at and (
                rec is None
                or rec.get("version") != self.active[name].candidate.version
                or name not in self.dispatcher.flows  # undeployed elsewhere
            ):
                log.warning(
                    "flow %s: the %s of v%s ended elsewhere",
                    name,
                    self.active[name].mode,
                    self.active[name].candidate.version,
                )
                self._end(name, retire=True)
        now = time.monotonic()
        for name, rec in sorted(records.items()):
            try:
                version, mode, share = int(rec["version"]), str(rec["mode"]), float(rec["share"])
            except (KeyError, TypeError, ValueError):
                log.error("flow %s: the store's rollout record %r is malformed; ignored", name, rec)
                continue
            primary = self.dispatcher.flows.get(name)
            if (
                name in self.active
                or primary is None
                or mode not in MODES
                or changed.get(name, float("-inf")) >= read_at
                or self._failed.get((name, version), 0) > now
            ):
                continue
            floor = max(primary.version, self.g.deploys.served_high.get(name, primary.version))
            if version <= floor:
                continue  # not newer than what is served here: never a candidate again
            try:
                flow = await self.g.deploys.load_flow(name, version, install=False)
            except LoadFailed as e:
                log.warning("flow %s: the %s of v%s is not served here yet: %s", name, mode, version, e.message)
                self._failed[(name, version)] = now + 5.0
                continue
            if (
                self.dispatcher.flows.get(name) is not primary
                or name in self.active
                or _input_mismatch(name, primary, flow, mode)
            ):
                self.dispatcher.retire(flow)
                continue
            self._activate(Rollout(name, mode, share if mode == "canary" else 1.0, flow, primary.version))
            log.warning("flow %s: %s of v%s beside v%s (recorded in the store)", name, mode, version, primary.version)


def _input_mismatch(name: str, primary: DeployedFlow, candidate: DeployedFlow, mode: str) -> str | None:
    """Why ``candidate`` cannot take ``primary``'s requests (its input schema differs), or None."""
    a, b = primary.plan.input_schema, candidate.plan.input_schema
    if a == b:
        return None
    show = lambda s: "any columns" if s is None else ", ".join(f"{c}: {t}" for c, t in s.items())  # noqa: E731
    return (
        f"flow {name!r}: a {mode} takes the requests of the served version, so it must take the same input; "
        f"v{candidate.version} takes ({show(b)}), the served v{primary.version} takes ({show(a)})"
    )


def _error(answer: tuple[int, bytes]) -> Response:
    status, body = answer
    return Response(body, status_code=status, media_type="application/json")
