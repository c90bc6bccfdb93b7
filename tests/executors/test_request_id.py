"""Every answer carries a request id (X-Request-Id: the client's when it is a sane one, else
a new one), which travels with the request to the executors: an operator's error is logged
once, at WARNING, on the executor where it ran, naming the id, the flow, the stage and the
qid, with the traceback of the user's code."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pyarrow as pa
import pytest

from executors.codec.bodies import ARROW
from executors.wire.messages import RawInput, StageInput, decode
from flow import Flow
from flow.table import Table
from tests.executors.conftest import unique

FRESH = re.compile(r"[0-9a-f]{16}")


def triple(row):
    if row.x < 0:
        raise ValueError(f"x must be >= 0, got {row.x}")  # the line the traceback must name
    return row.x * 3


RAISE_LINE = triple.__code__.co_firstlineno + 2


@pytest.fixture(scope="module")
def tripler(cluster):
    f = Flow(unique("tripler"), schema={"x": int})
    f.map(triple, names=["y"])
    return cluster.deploy(f)


def arrow_body(rows) -> bytes:
    arrow = Table.from_pylist(rows).to_arrow().drop_columns(["qid"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, arrow.schema) as w:
        w.write_table(arrow)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize(
    "how",
    ["relayed", "rows", "arrow"],  # one JSON row goes to the executor unparsed; the others are parsed first
)
def test_the_clients_request_id_comes_back(tripler, http, how):
    rid = f"client-{how}-{time.time_ns()}"
    if how == "arrow":
        r = http.post(
            tripler.url,
            content=arrow_body([{"x": 2}]),
            headers={"X-Request-Id": rid, "Content-Type": ARROW, "Accept": ARROW},
        )
    else:
        r = http.post(tripler.url, json={"x": 2} if how == "relayed" else [{"x": 2}], headers={"X-Request-Id": rid})
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == rid
    assert "x-flowserve-trace" in r.headers and r.headers["server-timing"].startswith("flow;dur=")


@pytest.mark.parametrize(
    "given",
    [None, "", "has space", "tab\tin", "x" * 129, "caf\u00e9"],
    ids=["absent", "empty", "space", "control", "too-long", "not-ascii"],
)
def test_a_missing_or_unfit_request_id_is_replaced_by_a_new_one(tripler, http, given):
    headers = {} if given is None else {"X-Request-Id": given.encode("latin-1")}
    first = http.post(tripler.url, json={"x": 1}, headers=headers).headers["x-request-id"]
    second = http.post(tripler.url, json={"x": 1}, headers=headers).headers["x-request-id"]
    assert FRESH.fullmatch(first) and FRESH.fullmatch(second) and first != second


def test_the_longest_fit_id_is_kept():
    from executors.gateway.invoke import REQUEST_ID_MAX, request_id

    longest = "a" * REQUEST_ID_MAX
    assert request_id(longest) == longest and request_id(longest + "a") != longest + "a"
    assert request_id("!~quoted\"'&;") == "!~quoted\"'&;"  # any visible ASCII


def test_error_answers_and_other_routes_carry_one_too(cluster, tripler, http):
    assert http.post(f"{cluster.url}/flows/nope", json={}, headers={"X-Request-Id": "r404"}).headers[
        "x-request-id"
    ] == ("r404")
    bad = http.post(tripler.url, json={"x": "three"}, headers={"X-Request-Id": "r400"})
    assert bad.status_code == 400 and bad.headers["x-request-id"] == "r400"
    for path in ("/flows", "/healthz", "/openapi.json"):
        r = http.get(cluster.url + path, headers={"X-Request-Id": f"get{path}"})
        assert r.status_code == 200 and r.headers["x-request-id"] == f"get{path}"
    assert FRESH.fullmatch(http.get(cluster.url + "/flows").headers["x-request-id"])


def executor_lines(cluster, needle: str, deadline_s: float = 10.0) -> list[str]:
    """The records of the executors' logs that contain ``needle``, once there is one."""
    logs = Path(cluster.dir) / "logs"
    deadline = time.monotonic() + deadline_s
    while True:
        text = "".join(p.read_text(errors="replace") for p in sorted(logs.glob("*.log")))
        records = re.split(r"\n(?=\d{4}-\d\d-\d\d )", text)
        found = [r for r in records if needle in r]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["relayed", "rows"])
def test_an_operator_error_is_logged_once_on_its_executor_with_the_users_traceback(cluster, tripler, http, how):
    rid = f"boom-{how}-{time.time_ns()}"
    body = {"x": -4} if how == "relayed" else [{"x": 1}, {"x": -4}]
    r = http.post(tripler.url, json=body, headers={"X-Request-Id": rid})
    assert r.status_code == 500 and r.json()["error"] == "OperatorFailedError"
    assert "Traceback" not in r.text  # the client gets the what, the log the where
    qid = r.json()["qid"]
    (record,) = executor_lines(cluster, f"request {rid}:")
    head, *rest = record.rstrip("\n").splitlines()
    assert re.fullmatch(
        rf"\S+ \S+ executor cpu\d WARNING flow {tripler.name} stage triple qid {qid} request {rid}: "
        r"operator 'triple' raised ValueError: x must be >= 0, got -4",
        head,
    ), head
    assert [line for line in rest if line.strip(" ^~")] == [  # carets (where Python draws them) aside
        "Traceback (most recent call last):",
        f'  File "{__file__}", line {RAISE_LINE}, in triple',
        '    raise ValueError(f"x must be >= 0, got {row.x}")  # the line the traceback must name',
        "ValueError: x must be >= 0, got -4",
    ]


# -- on the wire --------------------------------------------------------------------------


def test_the_request_id_travels_in_run_and_body_messages_and_on_to_the_next_stage():
    run = StageInput(1, 0, "f", 1, "s", "__input__", {}, "gw", rid="abc-1", table=Table.from_pylist([{"x": 1}]))
    assert json.loads(bytes(run.encode()[0]))["rid"] == "abc-1"
    back = decode([bytes(f) for f in run.encode()])
    assert back.rid == "abc-1" and back.to("t", "s", (), 0, None).rid == "abc-1"
    assert "rid" not in json.loads(bytes(StageInput(1, 0, "f", 1, "s", "__input__", {}, "gw").encode()[0]))
    body = RawInput(1, 0, "f", 1, "s", {}, "gw", 5, rid="abc-2", body=b'{"x": 1}')
    assert decode([bytes(f) for f in body.encode()]).as_input(None).rid == "abc-2"
