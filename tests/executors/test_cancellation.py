"""Cancellation through the whole flow, on a real cluster (one executor with one worker
thread, so a run that keeps its thread blocks every other request): a client that
disconnects, or whose deadline passes, frees the thread its first stage holds in
``fs.wait``, and its second stage never runs; a batching stage drops a cancelled request's
rows while it serves the others'; a request not cancelled answers what ``flow.run`` says."""

from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow, cancelled, current_store, deadline, wait

HELD = 0  # the x whose first stage waits (30 s, or until the runtime gives up on it)


def hold(row):
    """The first stage: notes that it started and the time it had (fs.deadline()); x == HELD
    waits in fs.wait(30) and notes whether the runtime gave up on it."""
    r = current_store().redis
    left = deadline()
    r.set(f"hold:left:{row.ns}:{row.x}", "none" if left is None else repr(left))
    r.incr(f"hold:started:{row.ns}:{row.x}")
    if row.x == HELD:
        gave_up = wait(30)
        r.set(f"hold:returned:{row.ns}:{row.x}", int(gave_up and cancelled()))
    return row.x, row.ns, row.x + 1


def after(row):
    """The second stage: counts that it ran for a request."""
    current_store().redis.incr(f"after:{row.ns}:{row.x}")
    return row.x, row.y * 2


def gate_batch(table):
    """A batching stage: records each batch's xs; a batch holding x == -1 waits (for at
    most 20 s) until the test sets its release key."""
    r = current_store().redis
    xs = [int(x) for x in table["x"]]
    r.rpush("gate:batches", json.dumps(xs))
    if -1 in xs:
        until = time.monotonic() + 20
        while not r.get("gate:release") and time.monotonic() < until:
            wait(0.005)  # polls the store under a deadline: what the test releases it by
    return table["x"], table["x"] * 10


def mixed_batch(table):
    """A batching stage: records each batch's xs; a batch holding x == -1 (or -2) waits
    until the test sets mixed:release:1 (or :2); notes whether the runtime gave up on it."""
    r = current_store().redis
    xs = [int(x) for x in table["x"]]
    r.rpush("mixed:batches", json.dumps(xs))
    for gate in (1, 2):
        until = time.monotonic() + 20
        while -gate in xs and not r.get(f"mixed:release:{gate}") and time.monotonic() < until:
            wait(0.005)  # polls the store under a deadline: what the test releases it by
    r.set(f"mixed:cancelled:{min(xs)}", int(cancelled()))
    return table["x"], table["x"] * 10


def count_rows(row):
    current_store().redis.incr(f"mixed:after:{row.x}")
    return row.y


def probe(row):
    return row.x


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(ClusterConfig(executors=1, threads=1, request_timeout_s=30)) as c:
        yield c


def _two_stages(cluster, name: str):
    f = Flow(name, schema={"x": int, "ns": str})
    f.map(hold, names=["x", "ns", "y"]).map(after, names=["x", "z"])
    return f, cluster.deploy(f, optimize=False)  # one stage per operator: the second gets a forward


def _until(condition, seconds: float = 15.0, what: str = "the condition"):
    """Poll ``condition`` until it is true (returned), or fail after ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = condition()
        if got:
            return got
        time.sleep(0.005)
    raise AssertionError(f"{what} did not happen within {seconds:g} s")


def _send(url: str, path: str, row: dict, headers: dict | None = None) -> socket.socket:
    """A raw HTTP request whose connection the test closes when it likes."""
    where = urlsplit(url)
    body = json.dumps(row).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {where.hostname}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    s = socket.create_connection((where.hostname, where.port))
    s.sendall(head.encode() + body)
    return s


def _rows(answer) -> list:
    """An answer's rows, without their qids."""
    return [{k: v for k, v in row.items() if k != "qid"} for row in answer.json()["rows"]]


def _redis(cluster):
    return cluster.kvs.redis


def _answers(cluster, flow: str, status: int) -> float:
    text = cluster.http.get("/metrics").text
    needle = f'flowserve_requests_total{{flow="{flow}",status="{status}"}} '
    for line in text.splitlines():
        if line.startswith(needle):
            return float(line.split()[-1])
    return 0.0


def _queued(cluster, flow: str, n: int):
    """A condition: ``n`` requests wait in ``flow``'s batching stage's queue (the executor's
    figures reach /metrics with its pong, once a second)."""

    def check() -> bool:
        text = cluster.http.get("/metrics").text
        return any(
            line.startswith("flowserve_executor_queue_depth") and f'flow="{flow}"' in line and line.endswith(f" {n}.0")
            for line in text.splitlines()
        )

    return check


def _thread_freed_and_second_stage_skipped(cluster, d, ns: str, since: float) -> float:
    """After the held request was given up on: its run returns (told, by fs.wait), the only
    worker thread answers another request at once, and the second stage never ran for the
    held one. Returns the seconds from ``since`` to the held run's return."""
    r = _redis(cluster)
    _until(lambda: r.get(f"hold:returned:{ns}:{HELD}") is not None, 10, "the held run's return")
    freed = time.monotonic() - since
    assert r.get(f"hold:returned:{ns}:{HELD}") == b"1"  # fs.wait returned True: fs.cancelled()
    t0 = time.monotonic()
    answer = httpx.post(d.url, json={"x": 5, "ns": ns}, timeout=20)  # needs the same (only) worker thread
    assert answer.status_code == 200, answer.text
    assert time.monotonic() - t0 < 5
    # the held request's second stage would have been handed over before the thread took
    # the request above (one executor, one worker thread): it never ran
    assert r.get(f"after:{ns}:{HELD}") is None
    assert r.get(f"after:{ns}:5") == b"1"
    return freed


@pytest.mark.parametrize("way", ["lean", "asgi", "stream"])
def test_a_disconnect_frees_the_thread_and_skips_later_stages(cluster, way):
    name = f"cancel-disc-{way}"
    _, d = _two_stages(cluster, name)
    ns = name
    # a percent-encoded flow name is the ASGI app's (leanhttp.flow_name), the plain one the lean path's
    path = f"/flows/{name.replace('-', '%2D')}" if way == "asgi" else f"/flows/{name}"
    headers = {"Accept": "application/x-ndjson"} if way == "stream" else None  # a streamed answer's rows
    s = _send(cluster.url, path, {"x": HELD, "ns": ns}, headers)
    r = _redis(cluster)
    _until(lambda: r.get(f"hold:started:{ns}:{HELD}"), 15, "the held request's first stage")
    t0 = time.monotonic()
    s.close()  # the client leaves before the answer
    freed = _thread_freed_and_second_stage_skipped(cluster, d, ns, t0)
    assert freed < 5
    _until(lambda: _answers(cluster, name, 499) == 1, 5, "the gateway counting the request given up on")


def test_an_expired_deadline_frees_the_thread_and_skips_later_stages(cluster):
    name = "cancel-deadline"
    _, d = _two_stages(cluster, name)
    t0 = time.monotonic()
    answer = httpx.post(d.url, json={"x": HELD, "ns": name}, headers={"X-Request-Timeout": "1"}, timeout=20)
    assert answer.status_code == 504, answer.text
    r = _redis(cluster)
    left = float(r.get(f"hold:left:{name}:{HELD}"))
    assert 0 < left <= 1.0  # fs.deadline(): the request's time left, on the executor
    freed = _thread_freed_and_second_stage_skipped(cluster, d, name, t0)
    assert freed < 5  # 1 s of deadline, then the gateway's revoke (not fs.wait's 30 s)


def test_queued_work_past_its_deadline_is_dropped_not_run(cluster):
    name = "cancel-queued-late"
    _, d = _two_stages(cluster, name)
    r = _redis(cluster)
    s = _send(cluster.url, f"/flows/{name}", {"x": HELD, "ns": name})  # holds the only worker thread
    _until(lambda: r.get(f"hold:started:{name}:{HELD}"), 15, "the held request's first stage")
    late = httpx.post(d.url, json={"x": 6, "ns": name}, headers={"X-Request-Timeout": "0.5"}, timeout=20)
    assert late.status_code == 504, late.text  # it waited behind the held one for the thread
    s.close()  # frees the thread: the late request's turn comes, past its deadline
    _until(lambda: r.get(f"hold:returned:{name}:{HELD}") is not None, 10, "the held run's return")
    assert httpx.post(d.url, json={"x": 5, "ns": name}, timeout=20).status_code == 200  # after it, FIFO
    assert r.get(f"hold:started:{name}:6") is None  # dropped from the queue, never run


def test_a_batching_stage_drops_a_cancelled_requests_rows(cluster):
    f = Flow("cancel-batch", schema={"x": int})
    f.map(gate_batch, names=["x", "y"], batching=True)
    d = cluster.deploy(f)
    p = Flow("cancel-probe", schema={"x": int})
    p.map(probe, names=["y"])
    probe_d = cluster.deploy(p)
    r = _redis(cluster)
    answers: dict = {}

    def call(x):
        answers[x] = httpx.post(d.url, json={"x": x}, timeout=30)

    gate = threading.Thread(target=call, args=(-1,))
    gate.start()
    _until(lambda: r.llen("gate:batches") == 1, 15, "the gate's batch")
    gone = _send(cluster.url, "/flows/cancel-batch", {"x": 7})  # queued behind the gate, then cancelled
    live = threading.Thread(target=call, args=(8,))
    live.start()

    _until(_queued(cluster, "cancel-batch", 2), 15, "two requests queued for the batch after the gate's")
    gone.close()
    _until(lambda: _answers(cluster, "cancel-batch", 499) == 1, 10, "the gateway giving the request up")
    # the revoke left before the 499 was counted, on the link this probe then takes: once
    # the probe is answered, the executor has read the revoke
    assert httpx.post(probe_d.url, json={"x": 1}, timeout=20).status_code == 200
    r.set("gate:release", 1)
    gate.join(30)
    live.join(30)
    assert answers[-1].status_code == 200 and _rows(answers[-1]) == [{"x": -1, "y": -10}]
    assert answers[8].status_code == 200 and _rows(answers[8]) == [{"x": 8, "y": 80}]
    batches = [json.loads(b) for b in r.lrange("gate:batches", 0, -1)]
    assert batches == [[-1], [8]]  # the cancelled request's row never ran


def test_a_request_not_cancelled_answers_what_flow_run_says(cluster):
    name = "cancel-untouched"
    f, d = _two_stages(cluster, name)
    rows = [{"x": 3, "ns": name}, {"x": 4, "ns": name}]
    expected = f.run([{"x": 3, "ns": "local"}, {"x": 4, "ns": "local"}], kvs=cluster.kvs).to_pylist()
    got = httpx.post(d.url, json=rows, timeout=20)
    assert got.status_code == 200, got.text
    assert _rows(got) == [{k: v for k, v in row.items() if k != "qid"} for row in expected]
    left = _redis(cluster).get(f"hold:left:{name}:3")
    assert 25 < float(left) <= 30  # the cluster's request_timeout_s, seen by the executor
    assert _redis(cluster).get("hold:left:local:3") == b"none"  # flow.run: no deadline


def test_a_batch_serving_live_requests_runs_on_and_drops_only_the_cancelled_rows(cluster):
    f = Flow("cancel-mixed", schema={"x": int})
    f.map(mixed_batch, names=["x", "y"], batching=True).map(count_rows, names=["y"])
    d = cluster.deploy(f, rules=["batching"])  # no fusion: the second stage gets a forward
    p = Flow("cancel-probe-mixed", schema={"x": int})
    p.map(probe, names=["y"])
    probe_d = cluster.deploy(p)
    r = _redis(cluster)
    answers: dict = {}

    def call(x):
        answers[x] = httpx.post(d.url, json={"x": x}, timeout=30)

    calls = [threading.Thread(target=call, args=(-1,))]
    calls[0].start()
    _until(lambda: r.llen("mixed:batches") == 1, 15, "the first gate's batch")
    calls.append(threading.Thread(target=call, args=(-2,)))
    calls[-1].start()
    gone = _send(cluster.url, "/flows/cancel-mixed", {"x": 9})
    _until(_queued(cluster, "cancel-mixed", 2), 15, "two requests queued behind the first batch")
    r.set("mixed:release:1", 1)
    _until(lambda: r.llen("mixed:batches") == 2, 15, "the batch of the two")
    gone.close()  # while its batch runs, beside a live request
    _until(lambda: _answers(cluster, "cancel-mixed", 499) == 1, 10, "the gateway giving the request up")
    assert httpx.post(probe_d.url, json={"x": 1}, timeout=20).status_code == 200  # the revoke was read
    r.set("mixed:release:2", 1)
    for t in calls:
        t.join(30)
    assert _rows(answers[-2]) == [{"y": -20}]
    assert [sorted(json.loads(b)) for b in r.lrange("mixed:batches", 0, -1)] == [[-1], [-2, 9]]
    assert r.get("mixed:cancelled:-2") == b"0"  # not interrupted: it serves a live request too
    assert r.get("mixed:after:-2") == b"1"
    assert r.get("mixed:after:9") is None  # the cancelled request's rows went no further


def test_requests_given_up_together_make_one_revoke_per_executor(tmp_path):
    """Fifty requests given up in one turn of the gateway's loop: each executor hosting the
    flow gets one Revoke naming all fifty (real sockets, the gateway's own links)."""
    import asyncio

    from executors.gateway.dispatcher import Dispatcher
    from executors.gateway.records import DeployedFlow, Request
    from executors.wire.messages import Revoke, decode
    from executors.wire.transport import Reader, accept, listen
    from optimizer import optimize

    f = Flow("revoked-together", schema={"x": int})
    f.map(probe, names=["y"])
    plan = optimize(f)
    (stage,) = plan.stages
    addresses = {ex: f"ipc://{tmp_path}/{ex}" for ex in ("e0", "e1")}
    listeners = {ex: listen(a) for ex, a in addresses.items()}

    async def give_up_fifty() -> dict:
        d = Dispatcher(f"ipc://{tmp_path}/gw")
        d.start()
        for ex, a in addresses.items():
            d.add_executor(ex, a)
        flow = DeployedFlow(plan, 1, {stage: list(addresses)})
        loop = asyncio.get_running_loop()
        reqs = [Request(100 + i, flow, None, time.time() + 10, loop.create_future()) for i in range(50)]
        for req in reqs:
            d.requests[req.id] = req
            d.give_up(req)
        assert {req.future.exception().status for req in reqs} == {499}  # answered: nobody reads it
        got: dict = {ex: [] for ex in addresses}
        conns: dict = {}
        end = time.monotonic() + 10
        while any(not m for m in got.values()) and time.monotonic() < end:
            await asyncio.sleep(0.001)  # the loop sends meanwhile; then read what arrived
            for ex, listener in listeners.items():
                if ex not in conns and (conn := accept(listener)) is not None:
                    conns[ex] = Reader(conn)
                if ex in conns:
                    got[ex].extend(decode(frames) for frames in conns[ex].read()[0])
        await d.close()
        return got

    got = asyncio.run(give_up_fifty())
    for ex, messages in got.items():
        assert len(messages) == 1, (ex, messages)
        (msg,) = messages
        assert type(msg) is Revoke and msg.reqs == list(range(100, 150))


def test_a_runs_cancel_flag_answers_as_an_event_and_wakes_a_waiting_operator():
    """RunCancel (races.py) stands in for a threading.Event on every run: set before a wait,
    after one began, or never, flow.wait and flow.cancelled see what an Event would show."""
    from executors.worker.races import RunCancel

    early = RunCancel()
    early.set()
    assert early.is_set() and early.wait(5) is True  # no Event made: the flag answers
    idle = RunCancel()
    assert not idle.is_set() and idle.wait(0.01) is False
    waiting, woke = RunCancel(), []
    started = threading.Event()

    def operator():
        started.set()
        woke.append(waiting.wait(30))

    t = threading.Thread(target=operator)
    t.start()
    assert started.wait(5)
    waiting.set()  # whether the waiter made its Event yet or not, it returns True
    t.join(10)
    assert woke == [True] and not t.is_alive()
