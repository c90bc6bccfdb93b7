"""A one-row JSON body goes unparsed (messages.RawInput) to the executor of the flow's one
stage that takes the input, and the sink's executor answers with the client's JSON
(Rendered): which bodies and flows take that path, and that over real HTTP it answers
exactly what the parsed path answers -- the same rows, the same errors, byte for byte --
whether the flow is one stage, several, or ends in a stage whose rows are split by key."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import numpy as np
import pyarrow as pa
import pytest

from executors.codec.bodies import ARROW
from executors.gateway.dispatcher import Dispatcher
from executors.gateway.invoke import RELAY_MAX_BYTES, _relayable
from executors.gateway.records import DeployedFlow, RawBody, Request, RequestFailed, relay_stage
from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from executors.wire.messages import Pong, decode
from flow import ColumnType, Flow, current_store, wait
from optimizer import OptimizerOptions, optimize
from tests.executors.test_bad_inputs import CASES, nan_tensor, plus_one


def twice(row):
    return row.y * 2


def slow(row):
    return row.x


def to_key(row):
    return "emb/" + row.k


def held(row):
    """Waits (at most 20 s) until the test sets its release key: a request in flight."""
    r = current_store().redis
    r.set(f"relay:held:{row.x}", 1)
    until = time.monotonic() + 20
    while not r.get(f"relay:release:{row.x}") and time.monotonic() < until:
        wait(0.005)  # polls the store under a deadline: what the test releases it by
    return row.x


def add_one_batch(table):
    import time

    time.sleep(0.005)  # requests arriving meanwhile queue into the next batch
    return table["x"] + 1


def typed_flow(name: str = "typed", stages: int = 1) -> Flow:
    f = Flow(name, schema={"x": int, "f": float, "s": str, "b": bytes, "img": ColumnType.tensor(np.uint8, (2, 2))})
    node = f.map(plus_one, names=["y"])
    if stages > 1:
        node.map(twice, names=["z"])
    return f


# -- which flows and bodies are relayed --------------------------------------------------------


def test_a_flow_whose_one_stage_takes_the_rows_whole_is_relayed_and_others_are_not():
    f = Flow("two", schema={"x": int})
    f.map(plus_one, names=["y"]).map(twice, names=["z"])
    assert relay_stage(optimize(f)) is not None  # fused: one stage takes the rows and answers
    unfused = optimize(f, rules=[])  # one stage per operator: the body goes to the first
    assert len(unfused.stages) == 2 and relay_stage(unfused) == next(
        s.name for s in unfused.stages.values() if s.inputs == ("__input__",)
    )
    branches = Flow("branches", schema={"x": int})
    branches.map(plus_one, names=["y"]).join(branches.map(slow, names=["w"]))
    assert relay_stage(optimize(branches, rules=[])) is None  # two stages take the rows: parsed once, here
    raced = Flow("raced", schema={"x": int})
    raced.map(slow, names=["y"], high_variance=True)
    plan = optimize(raced, options=OptimizerOptions(competitive_replicas=3))
    assert relay_stage(plan) is not None  # copies race: each is sent the body
    hedged = Flow("hedged", schema={"x": int})
    hedged.map(slow, names=["y"], hedge=0.9)
    assert relay_stage(optimize(hedged)) is None  # a backup copy is sent later, by the gateway's table
    looks = Flow("looks", schema={"k": str}, key_prefixes=["emb/"])
    looks.lookup(column="k", name="v", missing="null")
    plan = optimize(looks)
    assert relay_stage(plan) is None  # the rows are split by key from the start
    keyed = Flow("keyed", schema={"k": str}, key_prefixes=["emb/"])
    keyed.map(to_key, names=["key"]).lookup(column="key", name="v", missing="null")
    plan = optimize(keyed)
    assert len(plan.stages) == 2 and relay_stage(plan) is not None  # split after the first stage


def test_a_body_goes_only_where_every_replica_said_it_takes_bodies(tmp_path):
    """An executor of a release before relayed bodies answers pings without ``relays``: a
    newer gateway must then parse (in a rolling upgrade a body must never go where it
    cannot be read), and a re-run that lands on one fails at once, 503, not at its deadline."""
    old = Pong.from_header({"type": "pong", "executor": "e0", "token": "t", "device": "cpu", "gpus": []}, {})
    assert decode(old.encode()).relays is False
    d = Dispatcher(f"ipc://{tmp_path}/gw")
    try:
        plan = optimize(typed_flow())
        (stage,) = plan.stages
        for i in range(2):
            d.add_executor(f"e{i}", f"ipc://{tmp_path}/e{i}")
            d.executors[f"e{i}"].loaded.add(("typed", 1))
        flow = DeployedFlow(plan, 1, {stage: ["e0", "e1"]})
        assert d.relays_to(flow) is None  # no pong yet
        d._on_message(Pong("e0", "t", "cpu", [], relays=True))
        d._on_message(Pong("e1", "t", "cpu", []))  # an older executor
        assert d.relays_to(flow) is None
        loop = asyncio.new_event_loop()
        req = Request(1, flow, None, 0.0, loop.create_future(), raw=RawBody(b'{"x": 1}', "", 7))
        d.executors["e0"].alive = False  # the re-run can only go to the older one
        d._dispatch(req)
        assert isinstance(req.future.exception(), RequestFailed) and req.future.exception().status == 503
        assert "does not take relayed bodies" in json.dumps(req.future.exception().body)
        loop.close()
        d._on_message(Pong("e1", "t", "cpu", [], relays=True))  # upgraded
        assert d.relays_to(flow) == stage
    finally:
        d.links.listener.close()


@contextlib.contextmanager
def _two_stages_on_two_executors(tmp_path):
    """A dispatcher and a flow of two stages, the first (the relay stage) on e0, the second on e1."""
    d = Dispatcher(f"ipc://{tmp_path}/gw")
    try:
        plan = optimize(typed_flow(stages=2), rules=[])
        first, second = (s.name for s in plan.stages.values())
        for i in range(2):
            d.add_executor(f"e{i}", f"ipc://{tmp_path}/e{i}")
        yield d, DeployedFlow(plan, 1, {first: ["e0"], second: ["e1"]})
    finally:
        d.links.listener.close()


def test_a_flow_of_several_stages_is_relayed_only_where_every_executor_passes_the_rendering_on(tmp_path):
    """An executor of a release before multi-stage relaying takes bodies but does not pass
    the JSON answer on to a sink elsewhere (nor does such a sink render a split answer whole):
    while one hosts any stage of a flow of several, its bodies are parsed by the gateway."""
    old = Pong("e1", "t", "cpu", [], relays=True)
    assert decode(Pong.from_header({k: v for k, v in old.header().items() if k != "rn"}, {}).encode()).renders is False
    with _two_stages_on_two_executors(tmp_path) as (d, flow):
        first = next(iter(flow.plan.stages))  # the stage that takes the rows
        d._on_message(Pong("e0", "t", "cpu", [], relays=True, renders=True))
        d._on_message(old)  # hosts the sink only, and is of the older release
        assert d.relays_to(flow) is None
        d._on_message(Pong("e1", "t", "cpu", [], relays=True, renders=True))  # upgraded
        assert d.relays_to(flow) == first
        one = DeployedFlow(optimize(typed_flow()), 1, {"plus_one": ["e2"]})
        d.add_executor("e2", f"ipc://{tmp_path}/e2")
        d._on_message(Pong("e2", "t", "cpu", [], relays=True))  # one stage: the sink is its executor
        assert d.relays_to(one) == "plus_one"


def test_a_sink_renders_a_whole_answer_and_leaves_one_part_of_several_to_the_gateway():
    """A relayed request's sink answers JSON when its output is the whole answer (not split,
    or the only part of a split, whose positions column is not the client's); one part of
    several goes back as a Table, which the gateway merges with the others and encodes."""
    from executors.wire.messages import Rendered, StageInput
    from executors.worker.outputs import _rendered
    from flow.table import Table
    from optimizer import positions

    h = StageInput(3, 1, "f", 1, "s", "__input__", {}, "gw", None, render=True)
    rows = Table.from_pylist([{"y": 1}, {"y": 2}], qid=[7, 8])
    whole = decode(_rendered(h, [], rows, ()))
    assert isinstance(whole, Rendered) and json.loads(bytes(whole.body))["rows"] == [
        {"qid": 7, "y": 1},
        {"qid": 8, "y": 2},
    ]
    only = decode(_rendered(h, [], positions.split(rows, np.array([0, 1])), [[0, 1]]))
    assert json.loads(bytes(only.body))["rows"] == [{"qid": 7, "y": 1}, {"qid": 8, "y": 2}]  # no "#pos"
    assert _rendered(h, [], positions.split(rows, np.array([1])), [[1, 2]]) is None
    assert _rendered(h, [], positions.split(rows, np.array([1])), [[0, 1], [1, 2]]) is None  # nested


def _arrow(columns: dict, compression: str | None = None) -> bytes:
    table = pa.table(columns if any(columns.values()) else {k: pa.array([], pa.int64()) for k in columns})
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize(
    "body, headers, relayed",
    [
        (b'{"x": 1}', {}, True),
        (b'{"x": 1}', {"content-type": "application/json; charset=utf-8"}, True),
        (b'  \n{"x": 1}', {"content-type": "text/json"}, True),
        (bytearray(b'{"x": 1}'), {}, True),  # a body that came in pieces
        (b'[{"x": 1}]', {}, False),  # a list of rows: the gateway counts them and gives their qids
        (b'{"x": 1}', {"accept": ARROW}, False),  # an Arrow answer is encoded by the gateway
        (b'{"x": 1}', {"content-type": ARROW}, False),  # not a stream: the gateway reads it and says so
        (_arrow({"x": [1]}), {"content-type": ARROW}, True),  # one row, its count read from the metadata
        (_arrow({"x": [1]}), {"content-type": f"{ARROW}; charset=x"}, True),
        (_arrow({"x": [1, 2]}), {"content-type": ARROW}, False),  # two rows: their qids are given here
        (_arrow({"x": []}), {"content-type": ARROW}, False),
        (_arrow({"x": [1]}, "zstd"), {"content-type": ARROW}, False),  # compressed: inflated under this gateway's limit
        (
            _arrow({"v": [list(range(64))]}),
            {"content-type": ARROW},
            False,
        ),  # 512 bytes of values, a busy executor: read here
        (_arrow({"v": [list(range(32))]}), {"content-type": ARROW}, True),
        (_arrow({"x": [1]}), {"content-type": ARROW, "accept": ARROW}, False),
        (_arrow({"x": [1]})[:40], {"content-type": ARROW}, False),  # truncated: the gateway's error
        (_arrow({"x": [1]}), {}, False),  # read as JSON (and refused) here
        (b'{"x": 1}', {"content-type": "text/plain"}, False),  # parsed (and refused) here
        (memoryview(b'{"x": 1}'), {}, False),  # a body in shared memory
        (b"", {}, False),
        (b'{"v": ' + b"1, " * 338 + b"1}", {}, True),  # 1,022 bytes of JSON: light
        (b'{"v": ' + b"1, " * 339 + b"1}", {}, False),  # 1,025 bytes, a busy executor: read here
    ],
)
def test_which_bodies_are_relayed(body, headers, relayed):
    assert _relayable(body, headers, lambda: False) is relayed


@pytest.mark.parametrize(
    "body, relayed",
    [
        (b"{" + b" " * (RELAY_MAX_BYTES - 2) + b"}", True),
        (b"{" + b" " * (RELAY_MAX_BYTES - 1) + b"}", False),  # big: parsed by the gateway, not relayed
    ],
)
def test_a_big_body_is_relayed_up_to_the_limit_to_an_idle_executor(body, relayed):
    assert _relayable(body, {}, lambda: True) is relayed


HEAVY = _arrow({"v": [list(range(64))]})  # one row of 512 bytes of values: heavier than LIGHT_ROW_BYTES
HEAVY_JSON = json.dumps({"img": [[7] * 28] * 28}).encode()  # 2.4 KiB: heavier than LIGHT_JSON_BYTES


def test_a_heavy_arrow_row_is_relayed_only_to_an_idle_executor_and_nothing_else_asks():
    asked = []

    def idle():
        asked.append(1)
        return True

    assert _relayable(HEAVY, {"content-type": ARROW}, idle) and asked == [1]
    assert not _relayable(HEAVY, {"content-type": ARROW}, lambda: False)
    # a heavy JSON object (an image as lists of lists, ~3 KiB) likewise, for an untyped flow
    assert _relayable(HEAVY_JSON, {}, idle) and asked == [1, 1]
    assert not _relayable(HEAVY_JSON, {}, lambda: False)
    # a typed flow's row is read the short way by its executor: relayed without asking
    assert _relayable(HEAVY_JSON, {}, lambda: pytest.fail("asked whether the executor is idle"), typed=True)
    # a light row, a light JSON object, two rows or a compressed row: decided without asking
    for body, headers in [
        (_arrow({"v": [list(range(32))]}), {"content-type": ARROW}),
        (b'{"x": 1}', {}),
        (b'[{"img": ' + HEAVY_JSON[8:-1] + b"}]", {}),
        (_arrow({"v": [list(range(64))] * 2}), {"content-type": ARROW}),
        (_arrow({"v": [list(range(64))]}, "zstd"), {"content-type": ARROW}),
    ]:
        _relayable(body, headers, lambda: pytest.fail("asked whether the executor is idle"))


def test_an_executor_is_idle_for_relaying_while_no_request_is_in_flight_on_it(tmp_path):
    with _two_stages_on_two_executors(tmp_path) as (d, flow):
        loop = asyncio.new_event_loop()
        req = Request(1, flow, None, 0.0, loop.create_future())
        assert d.relay_idle(flow)
        d._account(req, {"e1"}, [])  # in flight on the sink's executor only
        assert d.relay_idle(flow)
        d.requests[req.id] = req
        d._finish(req)
        d._account(req, {"e0"}, [])  # on the executor the body would go to
        assert not d.relay_idle(flow)
        d.requests[req.id] = req
        d._finish(req)  # answered: idle again
        assert d.relay_idle(flow)
        one = DeployedFlow(optimize(typed_flow()), 1, {})  # no relay stage here: nothing to relay to
        one.__dict__["relay_stage"] = None
        assert not d.relay_idle(one)
        loop.close()


# -- the relayed path answers what the parsed path answers -------------------------------------


@pytest.fixture(scope="module")
def c():
    with LocalCluster(ClusterConfig(executors=1, request_timeout_s=20, max_body_bytes=1 << 20)) as cluster:
        cluster.deploy(typed_flow())
        free = Flow("free")
        free.map(plus_one, names=["y"])
        cluster.deploy(free)
        # the same flows as several stages: the body goes to the first, the last renders
        cluster.deploy(typed_flow("typed-unfused", stages=2), optimize=False)
        free = Flow("free-unfused")
        free.map(plus_one, names=["y"]).map(twice, names=["z"])
        cluster.deploy(free, optimize=False)
        keyed = Flow("keyed", key_prefixes=["emb/"])
        keyed.map(to_key, names=["key"]).lookup(column="key", name="v", missing="null")
        cluster.deploy(keyed)
        batched = Flow("batched", schema={"x": int})
        batched.map(add_one_batch, names=["y"], batching=True)
        cluster.deploy(batched)
        nan = Flow("nan-tensor")
        nan.map(nan_tensor, names=["t"])
        cluster.deploy(nan)
        hold = Flow("held", schema={"x": int})
        hold.map(held, names=["y"])
        cluster.deploy(hold)
        yield cluster


GOOD = {"x": 1, "f": 0.5, "s": "é", "b": "aGk=", "img": [[1, 2], [3, 4]]}
# the corpus of bad inputs (test_bad_inputs.py) that is one JSON object: each is relayed
OBJECTS = [
    (name, flow, case["content"], case["headers"])
    for name, flow, case, _status, _says in CASES
    if flow in ("typed", "free") and _status == 400 and _relayable(case["content"], case["headers"], lambda: True)
]


def _post(c, flow: str, body: bytes, headers: dict) -> httpx.Response:
    return httpx.post(f"{c.url}/flows/{flow}", content=body, headers=headers, timeout=30)


@pytest.mark.parametrize("stages", ["", "-unfused"], ids=["one stage", "two stages"])
@pytest.mark.parametrize("name, flow, body, headers", OBJECTS, ids=[o[0] for o in OBJECTS])
def test_a_bad_relayed_body_gets_the_parsed_paths_error(c, name, flow, body, headers, stages):
    flow += stages
    relayed = _post(c, flow, body, headers)
    # the same body parsed by the gateway: a client that would take an Arrow answer is not
    # relayed (an error is JSON either way)
    parsed = _post(c, flow, body, {**headers, "accept": ARROW})
    assert relayed.status_code == parsed.status_code and relayed.status_code >= 400, (relayed.text, parsed.text)
    assert relayed.content == parsed.content  # the same error, naming the same row and column


ROWS = [
    ("typed", GOOD),
    ("free", {"x": 41, "s": "a", "v": [1.5, 2]}),
    ("free", {"x": -3}),
    ("typed-unfused", GOOD),
    ("free-unfused", {"x": 41, "s": "a", "v": [1.5, 2]}),
    ("keyed", {"k": "a"}),  # the sink's rows were split by key: it renders its one part
]


def test_relayed_and_parsed_bodies_answer_the_same_rows(c):
    assert len(OBJECTS) >= 20  # the corpus really reaches the relayed path
    for flow, row in ROWS:
        body = json.dumps(row).encode()
        relayed = _post(c, flow, body, {})
        parsed = _post(c, flow, b"[" + body + b"]", {})
        assert relayed.status_code == parsed.status_code == 200, (relayed.text, parsed.text)
        one, other = relayed.json()["rows"], parsed.json()["rows"]
        assert [r.pop("qid") for r in one] == [int(relayed.headers["x-qid-start"])]
        assert [r.pop("qid") for r in other] == [int(parsed.headers["x-qid-start"])]
        assert one == other, (flow, one, other)
        if "x" in row:
            assert one[0]["z"] == 2 * (row["x"] + 1) if "unfused" in flow else one[0]["y"] == row["x"] + 1
        else:
            assert one == [{"key": "emb/a", "v": None}]
        trace = json.loads(relayed.headers["x-flowserve-trace"])
        plan = httpx.get(f"{c.url}/flows/{flow}").json()
        assert trace[0][0] == plan["relay_stage"] and len(trace) == len(plan["stages"]), (trace, plan)


def _arrow_bodies_read(c) -> float:
    text = httpx.get(f"{c.url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("flowserve_executor_relayed_bodies_total{") and 'format="arrow"' in line
    )


ARROW_ROWS = [
    (
        "typed",
        {
            "x": [1],
            "f": [0.5],
            "s": ["é"],
            "b": [b"hi"],
            "img": pa.array([[[1, 2], [3, 4]]], pa.list_(pa.list_(pa.uint8()))),
        },
    ),
    ("typed-unfused", {"x": [7], "f": [-1.0], "s": ["a"], "b": [b""], "img": [[[0, 255], [9, 8]]]}),
    ("free", {"x": [41], "s": ["a"], "v": [[1.5, 2.0]]}),
    ("free-unfused", {"x": [-3]}),
    ("keyed", {"k": ["a"]}),
]


@pytest.mark.parametrize("flow, columns", ARROW_ROWS, ids=[f for f, _ in ARROW_ROWS])
def test_a_relayed_arrow_row_answers_what_the_parsed_paths_give(c, flow, columns):
    one = _arrow(columns)
    assert _relayable(one, {"content-type": ARROW}, lambda: False)  # light: relayed, busy or not
    before = _arrow_bodies_read(c)
    relayed = _post(c, flow, one, {"content-type": ARROW})
    deadline = time.monotonic() + 20
    while _arrow_bodies_read(c) <= before:  # the executor read it (its pong reports it once a second)
        assert time.monotonic() < deadline, "the Arrow row was not relayed"
        time.sleep(0.1)  # polls a condition; the deadline bounds it
    # the same row twice is parsed by the gateway (two rows); and the row as JSON, relayed too
    twice = _post(
        c,
        flow,
        _arrow({k: v * 2 if isinstance(v, list) else pa.concat_arrays([v, v]) for k, v in columns.items()}),
        {"content-type": ARROW},
    )
    row = pa.table(columns).to_pylist()[0]
    as_json = _post(c, flow, json.dumps({k: v.decode() if k == "b" else v for k, v in row.items()}).encode(), {})
    assert relayed.status_code == twice.status_code == 200, (relayed.text, twice.text)
    got, parsed = relayed.json()["rows"], twice.json()["rows"]
    assert [r.pop("qid") for r in got] == [int(relayed.headers["x-qid-start"])]
    for r in parsed:
        r.pop("qid")
    assert got == parsed[:1] == parsed[1:], (got, parsed)
    if flow.startswith("typed"):  # bytes go as base64 in JSON, as raw bytes in Arrow
        return
    assert (
        as_json.status_code == 200
        and [{k: v for k, v in r.items() if k != "qid"} for r in as_json.json()["rows"]] == got
    )


def _relayed_arrow_rows_settle(c, at_least: float) -> float:
    """The executors' count of relayed Arrow bodies once it reaches ``at_least`` (pongs
    report it once a second)."""
    deadline = time.monotonic() + 20
    while (n := _arrow_bodies_read(c)) < at_least:
        assert time.monotonic() < deadline, f"relayed Arrow bodies stayed at {n}, expected {at_least}"
        time.sleep(0.1)  # polls a condition; the deadline bounds it
    return n


def test_a_heavy_arrow_row_goes_to_an_idle_executor_and_is_read_here_while_it_is_busy(c):
    """An image-sized Arrow row is relayed while its executor has nothing in flight, and
    parsed by the gateway while the executor runs another request: the same answer both ways."""
    import threading

    heavy = _arrow({"x": [41], "s": ["a"], "v": [[float(i) for i in range(100)]]})  # 800 bytes of values
    assert not _relayable(heavy, {"content-type": ARROW}, lambda: False)
    before = _arrow_bodies_read(c)
    idle = _post(c, "free", heavy, {"content-type": ARROW})
    assert idle.status_code == 200, idle.text
    assert _relayed_arrow_rows_settle(c, before + 1) == before + 1  # the executor read it

    redis, x = c.kvs.redis, int(time.time_ns() % 1_000_000_000)
    answers = {}
    holding = threading.Thread(target=lambda: answers.update(held=_post(c, "held", json.dumps({"x": x}).encode(), {})))
    holding.start()
    deadline = time.monotonic() + 20
    while not redis.get(f"relay:held:{x}"):  # the executor runs the held request
        assert time.monotonic() < deadline, "the held request never started"
        time.sleep(0.01)  # polls a condition; the deadline bounds it
    # the held request stays in flight on the one executor (its pool runs it) until released
    busy = _post(c, "free", heavy, {"content-type": ARROW})
    assert not answers, "the held request was answered before its release"
    redis.set(f"relay:release:{x}", 1)
    holding.join(30)
    assert answers["held"].status_code == 200 and answers["held"].json()["rows"][0]["y"] == x
    assert busy.status_code == 200, busy.text
    strip = [{k: v for k, v in r.items() if k != "qid"} for r in idle.json()["rows"]]
    assert [{k: v for k, v in r.items() if k != "qid"} for r in busy.json()["rows"]] == strip
    # a light row after both: once the executors report it, the count says the busy heavy row was not relayed
    light = _post(c, "free", _arrow({"x": [1]}), {"content-type": ARROW})
    assert light.status_code == 200, light.text
    assert _relayed_arrow_rows_settle(c, before + 2) == before + 2


def test_qids_stay_unique_and_consecutive_across_both_paths(c):
    starts = []
    for body in (json.dumps(GOOD).encode(), json.dumps([GOOD, GOOD]).encode(), json.dumps(GOOD).encode()):
        r = _post(c, "typed", body, {})
        assert r.status_code == 200, r.text
        starts.append((int(r.headers["x-qid-start"]), [row["qid"] for row in r.json()["rows"]]))
    (a, qa), (b, qb), (d, qd) = starts
    assert qa == [a] and qb == [b, b + 1] and qd == [d] and b == a + 1 and d == b + 2


def test_an_answer_json_cannot_carry_is_the_same_500_on_both_paths(c):
    relayed, parsed = _post(c, "nan-tensor", b'{"x": 1}', {}), _post(c, "nan-tensor", b'[{"x": 1}]', {})
    assert relayed.status_code == parsed.status_code == 500
    assert relayed.content == parsed.content and b"nan_tensor" in relayed.content


def test_an_arrow_answer_and_the_output_schema_after_relayed_answers(c):
    body = json.dumps(GOOD).encode()
    r = _post(c, "typed", body, {"accept": ARROW})  # not relayed: the gateway encodes Arrow
    assert r.status_code == 200 and r.headers["content-type"] == ARROW
    assert pa.ipc.open_stream(r.content).read_all().column("y").to_pylist() == [2]
    fresh = Flow("fresh", schema={"x": int})
    fresh.map(plus_one, names=["y"])
    d = c.deploy(fresh)
    assert _post(c, "fresh", b'{"x": 2}', {}).json()["rows"][0]["y"] == 3  # its first answer: relayed
    answer = httpx.get(f"{c.url}/openapi.json").json()["paths"]["/flows/fresh"]["post"]["responses"]["200"]
    assert "y" in json.dumps(answer), answer  # the answer's columns, learnt from the rendered answer
    assert httpx.get(d.url).json()["relay_stage"] is not None


def test_relayed_bodies_merged_into_batches_each_get_their_own_row(c):
    from concurrent.futures import ThreadPoolExecutor

    def ask(x):
        with httpx.Client(timeout=30) as http:
            r = http.post(f"{c.url}/flows/batched", content=json.dumps({"x": x}).encode())
            assert r.status_code == 200, r.text
            return x, r.json()["rows"], json.loads(r.headers["x-flowserve-trace"])

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(64)))
    assert all([row["y"] for row in rows] == [x + 1] for x, rows, _ in answers)
    assert len({rows[0]["qid"] for _, rows, _ in answers}) == 64
    assert max(trace[0][3] for _, _, trace in answers) > 1  # some ran in a batch of several


def test_a_row_over_the_gateways_table_limit_is_refused_alike_on_both_paths(c):
    """A row takes its schema's bytes as columns whatever its body (a missing tensor: zeros).
    Over this gateway's limit (4x its 1 MiB body limit) it is a 413 here; the executors read
    relayed rows under their own default limit, so such a row is not relayed."""
    big = Flow("big-row", schema={"img": ColumnType.tensor(np.float64, (1000, 1000))})
    big.map(plus_one, names=["y"])
    c.deploy(big)
    relayed = _post(c, "big-row", b'{"img": null}', {})
    parsed = _post(c, "big-row", b'[{"img": null}]', {})
    assert relayed.status_code == parsed.status_code == 413, (relayed.text, parsed.text)
    assert relayed.json() == parsed.json() and "over the limit of 4 MiB" in relayed.text, relayed.text
