"""The dispatcher balances a stage's replicas on that stage's own requests in flight.

A replica that shares its executor with a stage every request uses (here ``double`` on e0)
is as free for its own stage as a replica alone; ranking replicas by the executor's whole
load starved it. The routing decision is the dispatcher's own logic over its state: these
tests drive a real Dispatcher (its socket bound, no executor needed) through routing and
accounting, as `_dispatch` and `_finish` do."""

from __future__ import annotations

import asyncio
import collections

import pytest

from executors.gateway.dispatcher import Dispatcher
from executors.gateway.records import DeployedFlow, Request
from flow import Flow
from flow.table import Table
from optimizer import optimize


def double(t):
    return t.column("x").to_numpy() * 2


def plus_one(t):
    return t.column("y").to_numpy() + 1


def _two_stages(tmp_path, name: str, executors: int):
    """A real Dispatcher with ``executors`` executors that have built flow ``name`` (two
    batching stages), and that flow's plan."""
    d = Dispatcher(f"ipc://{tmp_path}/gw")
    f = Flow(name)
    f.map(double, names=["y"], batching=True).map(plus_one, names=["z"], batching=True)
    plan = optimize(f, rules=["batching"])
    for i in range(executors):
        d.add_executor(f"e{i}", f"ipc://{tmp_path}/e{i}")
        d.executors[f"e{i}"].loaded.add((name, 1))
    return d, plan


@pytest.fixture
def dispatcher(tmp_path):
    d, plan = _two_stages(tmp_path, "balanced", 2)
    first, second = plan.stages
    flow = DeployedFlow(plan, 1, {first: ["e0"], second: ["e1", "e0"]})
    yield d, flow, second
    d.links.listener.close()


def _enter(d, flow, n):
    loop = asyncio.new_event_loop()
    reqs = []
    for i in range(n):
        req = Request(i, flow, Table.from_any([{"x": i}]), 0.0, loop.create_future())
        routes, used, assigned = d._routes(flow)
        d._account(req, used, assigned)
        d.requests[req.id] = req
        reqs.append((req, routes))
    loop.close()
    return reqs


def test_a_replica_beside_a_stage_every_request_uses_takes_its_share(dispatcher):
    d, flow, second = dispatcher
    reqs = _enter(d, flow, 40)
    where = collections.Counter(routes[second][0] for _, routes in reqs)
    assert sorted(where.values()) == [20, 20], where  # the old rule sent all 40 to e1
    assert d.executors["e0"].inflight == 40 and d.executors["e1"].inflight == 20


def test_finished_requests_free_their_replica_and_executor(dispatcher):
    d, flow, second = dispatcher
    reqs = _enter(d, flow, 10)
    for req, _ in reqs:
        d._finish(req)
    assert d.executors["e0"].inflight == 0 and d.executors["e1"].inflight == 0
    assert all(v == 0 for e in d.executors.values() for v in e.assigned.values())
    # freed: the next requests split evenly again
    where = collections.Counter(routes[second][0] for _, routes in _enter(d, flow, 10))
    assert sorted(where.values()) == [5, 5]


def test_an_executor_that_dies_forgets_its_assignments(dispatcher):
    d, flow, second = dispatcher
    _enter(d, flow, 6)
    d.executor_died("e1", running=[])
    assert d.executors["e1"].assigned == {} and d.executors["e1"].inflight == 0


def test_a_load_on_an_executor_that_left_is_an_error_not_a_crash(dispatcher):
    # a deploy places a flow, then the scaler stops an idle executor before it builds there
    d, flow, second = dispatcher
    errors = asyncio.run(d.load("balanced", 2, {second: ["gone"]}, timeout=1))
    assert "executor gone left the cluster" in errors["gone"]
    assert not d.loading  # nothing counted as building


def test_at_a_trickle_a_stage_stays_on_the_executor_that_took_it_last(dispatcher):
    # one request at a time: every replica is free, and the one that ran the last request is
    # still polling for messages (no wake-up), so it keeps the stage
    d, flow, second = dispatcher
    picked = []
    for _ in range(10):
        ((req, routes),) = _enter(d, flow, 1)
        picked.append(routes[second][0])
        d._finish(req)
    assert len(set(picked)) == 1, picked


@pytest.fixture
def one_each(tmp_path):
    """Each stage on one executor: no replicas to rank, so routes are kept on the flow."""
    d, plan = _two_stages(tmp_path, "fixed", 3)
    first, second = plan.stages
    d.executors["e2"].loaded.clear()  # placed, but has not built the flow yet
    flow = DeployedFlow(plan, 1, {first: ["e0"], second: ["e1", "e2"]})
    yield d, flow, first, second
    d.links.listener.close()


def test_routes_without_replicas_to_rank_are_kept_until_an_executor_changes(one_each, tmp_path):
    from executors.errors import NoExecutorError

    d, flow, first, second = one_each
    routes, used, _ = d._routes(flow)
    assert routes == {first: [f"ipc://{tmp_path}/e0"], second: [f"ipc://{tmp_path}/e1"]} and used == {"e0", "e1"}
    assert d._routes(flow)[0] is routes  # the same answer, kept
    d.executors["e2"].loaded.add(("fixed", 1))  # a second replica of the second stage built: now ranked

    def second_routes(n):  # n requests in flight together, as _dispatch routes them; then answered
        reqs = _enter(d, flow, n)
        for req, _ in reqs:
            d._finish(req)
        return collections.Counter(routes[second][0] for _, routes in reqs)

    assert second_routes(4) == {f"ipc://{tmp_path}/e1": 2, f"ipc://{tmp_path}/e2": 2}
    d.executors["e1"].alive = False  # as the local gateway marks one whose process ended
    assert second_routes(4) == {f"ipc://{tmp_path}/e2": 4}
    d.executor_died("e2")
    with pytest.raises(NoExecutorError, match="no live executor hosts stage"):
        d._routes(flow)
    d.executor_back("e1")  # back and still holding the flow's stages
    assert d._routes(flow)[0][second] == [f"ipc://{tmp_path}/e1"]
    d.remove_executor("e1")
    d.add_executor("e1", f"ipc://{tmp_path}/e1-new")  # the same id, a new process that built nothing yet
    with pytest.raises(NoExecutorError):
        d._routes(flow)
