"""Streamed answers over real HTTP on a real local cluster (executors/gateway/streaming.py):
a stream's rows are flow.run's for every operator kind upstream, each row leaves as it
completes (across batching stages), an error mid-stream names the operator as the
non-streamed body does, generator maps' rows (each output as it is yielded, through the
row-wise operators fused after it), SSE, and the Python client's stream."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

import flowserve as fs
from executors.gateway.streaming import NDJSON, SSE
from executors.worker.stage_runner import BoundStage
from flow import Flow, Table
from flow.errors import OperatorFailedError
from optimizer import OptimizerOptions, optimize
from tests.executors.conftest import unique
from tests.flowgen import assert_same_rows

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


def whole_answer(http, d, rows: list[dict]) -> list[tuple[int, dict]]:
    """The rows of a plain (not streamed) POST, numbered from the request's first qid."""
    plain = http.post(d.url, json=rows)
    assert plain.status_code == 200 and plain.headers["content-type"] == "application/json", plain.text
    start = int(plain.headers["x-qid-start"])
    return [(r.pop("qid") - start, r) for r in plain.json()["rows"]]


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
            # the whole answer is unchanged beside it
            assert whole_answer(http, d, rows) == reference(flow, rows, kvs=cluster.kvs)
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
        assert whole_answer(http, d, rows) == expected
        got, end = streamed(http, d, rows)
        assert by_qid(got) == expected and end["rows"] == 5
        one = http.post(d.url, json={"s": "x y"})  # one row: the stage's executor parses it
        assert [r["out"] for r in one.json()["rows"]] == ["X0", "Y1"]
    finally:
        d.undeploy()


def gate_opens(path: str) -> None:
    """Returns once the file ``path`` exists (a test creates it); fails after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} never opened")
        fs.wait(0.005)  # polls a condition under a deadline


def gated_words(row):
    """Yields the first word, then, once the row's gate is open (none: at once), the others."""
    words = row.s.split()
    yield words[0], 0
    if row.gate:
        gate_opens(row.gate)
    for i, w in enumerate(words[1:], 1):
        yield w, i


def test_a_generators_outputs_are_streamed_one_by_one_as_it_yields_them(cluster, http, tmp_path):
    flow = Flow(unique("s-gen-yield"), schema={"s": str, "gate": str})
    flow.map(gated_words, names=["w", "i"])
    gate = tmp_path / "open"
    rows = [{"s": "a b c", "gate": str(gate)}]
    d = flow.deploy(cluster=cluster)
    try:
        with cluster.http.stream("POST", d.url, json=rows, headers={"Accept": NDJSON}, timeout=30) as r:
            assert r.status_code == 200
            start = int(r.headers["x-qid-start"])
            lines = r.iter_lines()
            first = json.loads(next(lines))
            # the generator cannot yield its later outputs before the gate opens: the first
            # reached the client while the generator still runs
            assert not gate.exists()
            assert first == {"qid": start, "row": {"w": "a", "i": 0}}  # a row of the answer: no "final"
            gate.touch()
            rest = [json.loads(line) for line in lines if line]
        end = rest.pop()
        assert end["end"] is True and end["rows"] == 3
        got = [(e["qid"] - start, e["row"]) for e in [first, *rest]]
        assert (
            got == reference(flow, rows) == [(0, {"w": "a", "i": 0}), (0, {"w": "b", "i": 1}), (0, {"w": "c", "i": 2})]
        )
        assert whole_answer(http, d, rows) == reference(flow, rows)  # the whole answer is unchanged
    finally:
        d.undeploy()


def test_a_generator_then_a_fused_map_streams_each_transformed_output(cluster, http, tmp_path):
    flow = Flow(unique("s-gen-fused"), schema={"s": str, "gate": str})
    flow.map(gated_words, names=["w", "i"]).map(shout, names=["out"])
    gate = tmp_path / "open"
    rows = [{"s": "a b c", "gate": str(gate)}, {"s": "d e", "gate": ""}]
    d = flow.deploy(cluster=cluster)
    try:
        assert len(d.plan.stages) == 1  # the map is fused after the generator, in the flow's last stage
        with cluster.http.stream("POST", d.url, json=rows, headers={"Accept": NDJSON}, timeout=30) as r:
            assert r.status_code == 200
            start = int(r.headers["x-qid-start"])
            lines = r.iter_lines()
            ahead = [json.loads(next(lines)) for _ in range(3)]
            # the gated row's first output, through the map, came while its generator waits
            assert not gate.exists()
            assert sorted((e["qid"] - start, e["row"]["out"]) for e in ahead) == [(0, "A0"), (1, "D0"), (1, "E1")]
            gate.touch()
            rest = [json.loads(line) for line in lines if line]
        end = rest.pop()
        assert end["end"] is True and end["rows"] == 5
        assert [(e["qid"] - start, e["row"]["out"]) for e in rest] == [(0, "B1"), (0, "C2")]
        assert all("final" not in e for e in ahead + rest)
        got = [(e["qid"] - start, e["row"]) for e in ahead + rest]
        assert by_qid(got) == reference(flow, rows)
        assert whole_answer(http, d, rows) == reference(flow, rows)  # the whole answer is unchanged
    finally:
        d.undeploy()


def gated_twice(row):
    """Yields x, then, once the row's gate is open (none: at once), x + 1."""
    yield row.x
    if row.gate:
        gate_opens(row.gate)
    yield row.x + 1


def test_a_batched_stages_generator_streams_each_requests_outputs_as_yielded(cluster, http, tmp_path):
    flow = Flow(unique("s-gen-batch"), schema={"x": int, "gate": str})
    flow.map(plus_one_keep_gate, names=["x", "gate"], batching=True).map(gated_twice, names=["x"]).map(
        plus_one, names=["y"]
    )
    gate = tmp_path / "open"
    rows = [{"x": 1, "gate": str(gate)}, *({"x": x, "gate": ""} for x in range(2, 8))]
    d = flow.deploy(cluster=cluster)
    try:
        (stage,) = d.plan.stages.values()
        assert stage.batch is not None  # the rows' requests may run merged in one batch: each gets its own rows
        with cluster.http.stream("POST", d.url, json=rows, headers={"Accept": NDJSON}, timeout=30) as r:
            assert r.status_code == 200
            start = int(r.headers["x-qid-start"])
            lines = r.iter_lines()
            ahead = []
            while not any(e.get("qid") == start for e in ahead):  # the gated row's first output
                ahead.append(json.loads(next(lines)))
                assert "row" in ahead[-1], ahead[-1]
            assert not gate.exists()  # it came while the generator waits for the gate
            gate.touch()
            rest = [json.loads(line) for line in lines if line]
        end = rest.pop()
        assert end["end"] is True and end["rows"] == 14
        got = [(e["qid"] - start, e["row"]) for e in ahead + rest]
        assert by_qid(got) == reference(flow, rows)
        assert whole_answer(http, d, rows) == reference(flow, rows)  # the whole answer is unchanged
    finally:
        d.undeploy()


def words_until_boom(row):
    for w in row.s.split():
        if w == "boom":
            raise ValueError("boom is not a word")
        yield w, 0


def test_a_stage_run_output_by_output_gives_the_whole_runs_rows_and_errors():
    """The sink's run for a stream (executors/worker/fused.py ``each_output``): each output
    through the operators after the generator (a filter dropping some), handed on one by
    one, and together the rows and error of the run that is not streamed."""
    flow = Flow("yield-chain", schema={"s": str})
    flow.map(split_words, names=["w", "i"]).filter(lambda r: r.i != 1).map(shout, names=["out"])
    (stage,) = optimize(flow).stages.values()
    bound = BoundStage(stage)
    assert bound.chain.yields == 0
    table = Table.from_pylist([{"s": "a b c"}, {"s": ""}, {"s": "d e"}], qid=np.array([4, 5, 6]))
    emitted: list = []
    out = bound.chain.each_output([table], None, None, emitted.append)
    whole = bound([table])
    assert_same_rows(out, whole)
    assert out.qid.tolist() == whole.qid.tolist() == [4, 4, 6]
    assert [(t.qid.tolist(), t.to_pylist(qid=False)) for t in emitted] == [
        ([4], [{"out": "A0"}]),
        ([4], [{"out": "C2"}]),
        ([6], [{"out": "D0"}]),
    ]
    nothing = table.take(np.array([1]))  # no output at all: the run's empty answer
    assert len(bound.chain.each_output([nothing], None, None, emitted.append)) == 0 and len(emitted) == 3
    failing = Flow("yield-boom", schema={"s": str})
    failing.map(words_until_boom, names=["w", "i"]).map(shout, names=["out"])
    (stage,) = optimize(failing).stages.values()
    bound, bad = BoundStage(stage), Table.from_pylist([{"s": "a boom b"}], qid=np.array([9]))
    with pytest.raises(OperatorFailedError) as whole_error:
        bound([bad])
    emitted.clear()
    with pytest.raises(OperatorFailedError) as error:
        bound.chain.each_output([bad], None, None, emitted.append)
    assert (str(error.value), error.value.operator, error.value.qid) == (
        str(whole_error.value),
        "words_until_boom",
        9,
    )
    assert [t.to_pylist(qid=False) for t in emitted] == [[{"out": "A0"}]]  # what came before the error


def test_a_stage_whose_generator_feeds_a_join_sends_its_outputs_together():
    flow = Flow("yield-join", schema={"s": str})
    words = flow.map(split_words, names=["w", "i"])
    words.join(words.map(shout, names=["out"]))
    plan = optimize(flow, options=OptimizerOptions(fuse_branches=True))
    (stage,) = [s for s in plan.stages.values() if any(n.op.generates for n in s.nodes)]
    assert [n.op.kind for n in stage.nodes] == ["map", "map", "join"]  # one stage: the join reads both
    assert BoundStage(stage).chain.yields is None  # one output alone cannot be joined with its branch's rows


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
        assert whole_answer(http, d, rows) == reference(flow, rows)
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
