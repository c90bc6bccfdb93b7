"""Streamed answers over real HTTP on a real local cluster (executors/gateway/streaming.py):
a stream's rows are flow.run's for every operator kind upstream, each row leaves as it
completes (across batching stages), an error mid-stream names the operator as the
non-streamed body does, generator maps' rows, SSE, and the Python client's stream."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

import flowserve as fs
from executors.gateway.streaming import NDJSON, SSE
from flow import Flow
from tests.executors.conftest import unique

WAIT_S = 20  # the most an operator waits for its gate (a test that never opens it fails, not hangs)


def wait_for_gate(row):
    """Row ``x`` passes once the file ``row.gate`` exists (a test opens it): a row whose
    answer cannot be done before the test says so."""
    if row.gate:
        deadline = time.monotonic() + WAIT_S
        while not Path(row.gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gate {row.gate} never opened")
            fs.wait(0.005)  # polls a condition under a deadline
    if row.x < 0:
        raise ValueError(f"x must be >= 0, got {row.x}")
    return row.x * 10


def plus_one_batch(table):
    return table["x"] + 1


def plus_one_keep_gate(table):
    return table["x"] + 1, table["gate"]


def plus_one(row):
    return row.x + 1


def odd(row):
    return row.x % 2 == 1


def to_key(row):
    return f"stream-test/{row.x % 3}"


def small(row):
    return row.x * 2, 0.5 if row.x % 2 else 0.99


def big(row):
    return row.x * 2, 0.97


def confident(row):
    return row.conf > 0.9


def split_words(row):
    for i, w in enumerate(row.s.split()):
        yield w, i


def shout(row):
    return f"{row.w.upper()}{row.i}"


def events(response) -> list[dict]:
    """The JSON documents of an NDJSON answer."""
    return [json.loads(line) for line in response.text.splitlines() if line]


def by_qid(rows: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """Rows in qid order, rows of one qid in the order sent (a generator's)."""
    return sorted(rows, key=lambda item: item[0])


def reference(flow: Flow, rows: list[dict], kvs=None) -> list[tuple[int, dict]]:
    table = flow.run(rows, kvs=kvs)
    return [(r.pop("qid"), r) for r in table.to_pylist()]


def streamed(http, d, rows: list[dict]) -> tuple[list[tuple[int, dict]], dict]:
    r = http.post(d.url, json=rows, headers={"Accept": NDJSON})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == NDJSON
    docs = events(r)
    end = docs[-1]
    assert end["end"] is True and end["rows"] == len(docs) - 1, docs
    start = int(r.headers["x-qid-start"])
    return [(e["qid"] - start, e["row"]) for e in docs[:-1]], end


def _flows(cluster):
    cluster.kvs.mput({f"stream-test/{i}": i * 100 for i in range(3)})
    mapped = Flow(unique("s-map"), schema={"x": int})
    mapped.map(plus_one, names=["y"]).map(lambda r: r.y * 3, names=["z"])
    filtered = Flow(unique("s-filter"), schema={"x": int})
    filtered.filter(odd).map(plus_one, names=["y"])
    looked = Flow(unique("s-lookup"), schema={"x": int})
    looked.map(to_key, names=["key"]).lookup(column="key", name="v")
    raced = Flow(unique("s-anyof"), schema={"x": int})
    raced.anyof(small, big, names=["cls", "conf"], valid=confident)
    batched = Flow(unique("s-batch"), schema={"x": int})
    batched.map(plus_one_batch, names=["x"], batching=True).map(plus_one, names=["y"])
    grouped = Flow(unique("s-groupby"), schema={"x": int})
    grouped.map(lambda r: r.x % 2, names=["k"]).groupby("k").agg("count")
    joined = Flow(unique("s-join"), schema={"x": int})
    joined.map(plus_one, names=["y"]).join(joined.map(lambda r: r.x * 2, names=["z"]))  # on qid: row-wise
    keyed = Flow(unique("s-keyjoin"), schema={"x": int})
    left = keyed.map(lambda r: r.x % 3, names=["k"])
    left.join(keyed.map(lambda r: (r.x % 3, r.x), names=["k", "v"]), on="k")  # on a data key: mixes rows
    return [mapped, filtered, looked, raced, batched, grouped, joined, keyed]


def test_a_streams_rows_are_flow_runs_for_every_operator_kind(cluster, http):
    rows = [{"x": i} for i in range(12)]
    for flow in _flows(cluster):
        d = flow.deploy(cluster=cluster)
        try:
            got, end = streamed(http, d, rows)
            assert by_qid(got) == by_qid(reference(flow, rows, kvs=cluster.kvs)), flow.name
            assert end["trace"], flow.name  # where the stages ran, as X-Flowserve-Trace says
            plain = http.post(d.url, json=rows)  # the whole answer is unchanged beside it
            assert plain.status_code == 200 and plain.headers["content-type"] == "application/json"
            start = int(plain.headers["x-qid-start"])
            assert [(r.pop("qid") - start, r) for r in plain.json()["rows"]] == reference(flow, rows, kvs=cluster.kvs)
        finally:
            d.undeploy()


def test_a_multi_row_request_streams_its_first_row_before_its_slowest_is_done(cluster, tmp_path):
    flow = Flow(unique("s-gated"), schema={"x": int, "gate": str})
    flow.map(plus_one_keep_gate, names=["x", "gate"], batching=True).map(wait_for_gate, names=["y"])
    gate = tmp_path / "open"
    rows = [{"x": 1, "gate": str(gate)}, {"x": 2, "gate": ""}, {"x": 3, "gate": ""}]
    d = flow.deploy(cluster=cluster)
    try:
        with cluster.http.stream("POST", d.url, json=rows, headers={"Accept": NDJSON}, timeout=30) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            start = int(r.headers["x-qid-start"])
            first = [json.loads(next(lines)), json.loads(next(lines))]
            # the gated row cannot be done yet: the stream sent the others while it waits
            assert not gate.exists()
            assert sorted((e["qid"] - start, e["row"]["y"]) for e in first) == [(1, 30), (2, 40)]
            gate.touch()
            rest = [json.loads(line) for line in lines if line]
        assert rest[0] == {"qid": start, "row": {"y": 20}}
        assert rest[1]["end"] is True and rest[1]["rows"] == 3
    finally:
        d.undeploy()


def test_an_error_mid_stream_is_a_line_naming_the_operator(cluster, http, tmp_path):
    flow = Flow(unique("s-error"), schema={"x": int, "gate": str})
    flow.map(wait_for_gate, names=["y"])
    gate = tmp_path / "open"
    d = flow.deploy(cluster=cluster)
    try:
        # the whole answer's error body, for the same failing row
        whole = http.post(d.url, json=[{"x": -1, "gate": ""}])
        assert whole.status_code == 500
        expected = whole.json()
        rows = [{"x": 1, "gate": ""}, {"x": -1, "gate": str(gate)}]
        with cluster.http.stream("POST", d.url, json=rows, headers={"Accept": NDJSON}, timeout=30) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            start = int(r.headers["x-qid-start"])
            assert json.loads(next(lines)) == {"qid": start, "row": {"y": 10}}
            gate.touch()
            rest = [json.loads(line) for line in lines if line]
        assert len(rest) == 1, rest  # the error ends the stream: no end event
        error = rest[0]
        assert error["status"] == 500
        assert error["error"] == expected["error"] == "OperatorFailedError"
        assert error["operator"] == expected["operator"] == "wait_for_gate"
        assert error["message"] == expected["message"]
        assert error["qid"] == start + 1
        # a failure before anything was sent is the whole answer's error, status and body
        first = http.post(d.url, json=[{"x": -1, "gate": ""}], headers={"Accept": NDJSON})
        assert first.status_code == 500 and first.json()["operator"] == "wait_for_gate"
        assert first.headers["content-type"] == "application/json"
    finally:
        d.undeploy()


def test_a_generator_maps_rows_deployed_and_streamed_are_flow_runs(cluster, http):
    flow = Flow(unique("s-generator"), schema={"s": str})
    flow.map(split_words, names=["w", "i"]).map(shout, names=["out"])
    rows = [{"s": "a b c"}, {"s": ""}, {"s": "d e"}]
    expected = reference(flow, rows)
    assert expected == [
        (0, {"out": "A0"}),
        (0, {"out": "B1"}),
        (0, {"out": "C2"}),
        (2, {"out": "D0"}),
        (2, {"out": "E1"}),
    ]
    d = flow.deploy(cluster=cluster)
    try:
        plain = http.post(d.url, json=rows)
        assert plain.status_code == 200, plain.text
        start = int(plain.headers["x-qid-start"])
        assert [(r.pop("qid") - start, r) for r in plain.json()["rows"]] == expected
        got, end = streamed(http, d, rows)
        assert by_qid(got) == expected and end["rows"] == 5
        one = http.post(d.url, json={"s": "x y"})  # one row: the stage's executor parses it
        assert [r["out"] for r in one.json()["rows"]] == ["X0", "Y1"]
    finally:
        d.undeploy()


def test_server_sent_events_carry_the_same_events(cluster, http):
    flow = Flow(unique("s-sse"), schema={"x": int})
    flow.map(plus_one, names=["y"])
    d = flow.deploy(cluster=cluster)
    try:
        r = http.post(d.url, json=[{"x": 1}, {"x": 2}], headers={"Accept": SSE})
        assert r.status_code == 200 and r.headers["content-type"] == SSE
        blocks = [b for b in r.text.split("\n\n") if b]
        assert all(b.startswith("data: ") for b in blocks)
        docs = [json.loads(b[len("data: ") :]) for b in blocks]
        start = int(r.headers["x-qid-start"])
        assert sorted((e["qid"] - start, e["row"]["y"]) for e in docs[:-1]) == [(0, 2), (1, 3)]
        assert docs[-1]["end"] is True and docs[-1]["rows"] == 2
    finally:
        d.undeploy()


def test_the_python_clients_stream(cluster):
    flow = Flow(unique("s-client"), schema={"x": int, "gate": str})
    flow.map(wait_for_gate, names=["y"])
    d = flow.deploy(cluster=cluster)
    try:
        items = list(d.invoke([{"x": i, "gate": ""} for i in range(5)], stream=True))
        qids = sorted(q for q, _ in items)
        assert qids == list(range(qids[0], qids[0] + 5))
        assert sorted(row["y"] for _, row in items) == [0, 10, 20, 30, 40]
        stream = d.invoke([{"x": 1, "gate": ""}, {"x": -1, "gate": ""}], stream=True)
        with pytest.raises(fs.OperatorFailedError, match="x must be >= 0") as caught:
            list(stream)
        assert caught.value.operator == "wait_for_gate" and caught.value.status == 500
    finally:
        d.undeploy()


def test_a_tensor_row_streams_as_nested_lists(cluster, http):
    flow = Flow(unique("s-tensor"), schema={"x": int})
    flow.map(lambda r: np.full((2, 2), r.x, dtype=np.float32), names=["t"])
    d = flow.deploy(cluster=cluster)
    try:
        got, _ = streamed(http, d, [{"x": 1}, {"x": 2}])
        assert by_qid(got) == [(0, {"t": [[1.0, 1.0], [1.0, 1.0]]}), (1, {"t": [[2.0, 2.0], [2.0, 2.0]]})]
    finally:
        d.undeploy()


def gated_big(row):
    """The slow branch: waits for the gate file named in the row."""
    deadline = time.monotonic() + WAIT_S
    while not Path(row.gate).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {row.gate} never opened")
        fs.wait(0.005)
    return row.x * 100, 0.99


def small_for_gate(row):
    return row.x, 0.5 if row.x % 2 else 0.95


def test_a_progressive_cascade_sends_two_events_per_unsure_row_and_one_per_sure_row(cluster, http, tmp_path):
    flow = Flow(unique("s-progressive"), schema={"x": int, "gate": str})
    flow.first_then(small_for_gate, gated_big, names=["cls", "conf"], when=lambda r: r.conf < 0.9)
    gate = tmp_path / "open"
    rows = [{"x": i, "gate": str(gate)} for i in range(6)]
    d = flow.deploy(cluster=cluster)
    try:
        with cluster.http.stream("POST", d.url, json=rows, headers={"Accept": NDJSON}, timeout=30) as r:
            assert r.status_code == 200
            start = int(r.headers["x-qid-start"])
            lines = r.iter_lines()
            # every row's fast answer arrives while the slow branch cannot have finished
            ahead = [json.loads(next(lines)) for _ in range(6)]
            assert not gate.exists()
            gate.touch()
            rest = [json.loads(line) for line in lines if line]
        assert sorted((e["qid"] - start, e["row"]["cls"], e["final"]) for e in ahead) == [
            (i, i, i % 2 == 0) for i in range(6)
        ]
        end = rest.pop()
        assert end["end"] is True and end["rows"] == 6
        assert sorted((e["qid"] - start, e["row"]["cls"], e["final"]) for e in rest) == [
            (1, 100, True),
            (3, 300, True),
            (5, 500, True),
        ]
        per_row = {}
        for e in ahead + rest:
            per_row.setdefault(e["qid"] - start, []).append(e)
        assert {i: len(v) for i, v in per_row.items()} == {0: 1, 1: 2, 2: 1, 3: 2, 4: 1, 5: 2}
        # each row's last event is flow.run's row; a plain POST answers the final rows only
        final = by_qid([(q, v[-1]["row"]) for q, v in per_row.items()])
        assert final == reference(flow, rows)
        plain = http.post(d.url, json=rows)
        start = int(plain.headers["x-qid-start"])
        assert [(r.pop("qid") - start, r) for r in plain.json()["rows"]] == reference(flow, rows)
    finally:
        d.undeploy()


def test_a_nan_in_a_tensor_is_the_same_error_streamed_as_whole(cluster, http):
    flow = Flow(unique("s-nan"), schema={"x": int})
    flow.map(lambda r: np.full(2, np.nan if r.x else 1.0), names=["t"])
    d = flow.deploy(cluster=cluster)
    try:
        whole = http.post(d.url, json=[{"x": 1}])
        assert whole.status_code == 500 and whole.json()["error"] == "OperatorOutputError"
        first = http.post(d.url, json=[{"x": 1}], headers={"Accept": NDJSON})
        assert (first.status_code, first.json()) == (500, whole.json())
        r = http.post(d.url, json=[{"x": 0}, {"x": 1}], headers={"Accept": NDJSON})
        docs = events(r)
        error = docs[-1] if "error" in docs[-1] else docs[0]
        assert {k: error[k] for k in whole.json()} == whole.json()
    finally:
        d.undeploy()


def twice_each(row):
    yield row.x
    yield row.x + 1


def test_a_progressive_stream_after_a_generator_sends_every_rows_final_answer(cluster, http):
    flow = Flow(unique("s-gen-progressive"), schema={"x": int})
    flow.map(twice_each, names=["x"]).first_then(small, big, names=["cls", "conf"], when=lambda r: r.conf < 0.9)
    rows = [{"x": 0}, {"x": 2}]  # each gives x and x + 1: one sure row and one unsure row per qid
    d = flow.deploy(cluster=cluster)
    try:
        r = http.post(d.url, json=rows, headers={"Accept": NDJSON})
        docs = events(r)
        start = int(r.headers["x-qid-start"])
        assert docs[-1]["end"] is True and docs[-1]["rows"] == 4
        final = sorted((e["qid"] - start, e["row"]["cls"]) for e in docs[:-1] if e["final"])
        assert final == sorted((q, row["cls"]) for q, row in reference(flow, rows))
        assert len(docs) - 1 == 6  # 2 sure rows (1 event), 2 unsure rows (2 events)
    finally:
        d.undeploy()
