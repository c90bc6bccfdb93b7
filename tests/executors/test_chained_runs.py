"""Consecutive plain stages hosted on one executor run one after the other in one run, on
one thread (running.Runner._chained): the rows flow.run gives, one trace entry per stage,
a failure or an operator timeout in a chained stage named as in any run, and the executor
serving on after either. ``flowserve_executor_chained_runs_total`` counts such runs: the
tests wait for it to grow, so they fail if nothing is chained."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import Flow


def plus_one(row):
    return row.x + 1


def twice(row):
    return row.y * 2


def less_three(row):
    if row.z == 26:  # x == 12
        raise ValueError("no 26 here")
    if row.z == -2:  # x == -2: the chained stage overruns its timeout_s
        time.sleep(3)
    return row.z - 3


STAGES = ["plus_one", "twice", "less_three"]


def _chained(http: httpx.Client, url: str) -> float:
    total = 0.0
    for line in http.get(f"{url}/metrics").text.splitlines():
        if line.startswith("flowserve_executor_chained_runs_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def chain():
    with LocalCluster(ClusterConfig(executors=1, request_timeout_s=20)) as cluster:
        f = Flow("chain")
        f.map(plus_one, names=["y"]).map(twice, names=["z"]).map(less_three, names=["w"], timeout_s=0.5)
        d = cluster.deploy(f, optimize=False)  # a stage per operator
        assert [s["name"] for s in httpx.get(d.url).json()["stages"]] == STAGES
        yield cluster, d, f


def _warm(http: httpx.Client, cluster, url: str) -> None:
    """Serve until the executor reports chained runs: a stage runs on the IO thread, and so
    chains, once it is measured quick; its pong reports the count once a second."""
    before, deadline, x = _chained(http, cluster.url), time.monotonic() + 60, 100
    while _chained(http, cluster.url) < before + 50:
        assert time.monotonic() < deadline, "no run was chained"
        for _ in range(50):
            x += 1
            r = http.post(url, json={"x": x})
            assert r.status_code == 200 and r.json()["rows"][0]["w"] == 2 * (x + 1) - 3, r.text


def test_a_chain_answers_flow_runs_rows_with_a_trace_entry_per_stage(chain):
    cluster, d, f = chain
    with httpx.Client(timeout=30) as http:
        _warm(http, cluster, d.url)
        for x in (0, 7, -40):
            r = http.post(d.url, json={"x": x})
            assert r.status_code == 200, r.text
            (row,) = r.json()["rows"]
            (expected,) = f.run([{"x": x}]).to_pylist()
            row.pop("qid"), expected.pop("qid", None)
            assert row == expected == {"w": 2 * (x + 1) - 3}
            trace = json.loads(r.headers["x-flowserve-trace"])
            assert [e[0] for e in trace] == STAGES and len({e[1] for e in trace}) == 1, trace
            many = http.post(d.url, json=[{"x": x}, {"x": x + 1}])  # rows the gateway parses: chained too
            assert [r["w"] for r in many.json()["rows"]] == [2 * (x + 1) - 3, 2 * (x + 2) - 3]


def test_a_failure_in_a_chained_stage_names_its_operator_and_the_chain_serves_on(chain):
    cluster, d, _f = chain
    with httpx.Client(timeout=30) as http:
        _warm(http, cluster, d.url)
        r = http.post(d.url, json={"x": 12})
        assert r.status_code == 500, r.text
        assert r.json()["operator"] == "less_three" and "no 26 here" in r.text, r.text
        assert http.post(d.url, json={"x": 13}).json()["rows"][0]["w"] == 25


def test_an_overrun_in_a_chained_stage_is_a_504_naming_its_operator(chain):
    cluster, d, _f = chain
    with httpx.Client(timeout=30) as http:
        _warm(http, cluster, d.url)
        t0 = time.monotonic()
        r = http.post(d.url, json={"x": -2})
        assert r.status_code == 504, r.text
        assert r.json()["operator"] == "less_three" and "timeout_s=0.5" in r.text, r.text
        assert time.monotonic() - t0 < 2.5  # answered at the operator's timeout, not when it returned
        assert http.post(d.url, json={"x": 5}).json()["rows"][0]["w"] == 9  # the executor reads on


def plus_one_t(t):
    return t.column("x").to_numpy() + 1


def twice_t(t):
    return t.column("y").to_numpy() * 2


def _batches(http: httpx.Client, url: str, flow: str) -> dict[str, float]:
    """Runs per stage of ``flow`` in its batch size histogram (``_count``)."""
    out: dict[str, float] = {}
    for line in http.get(f"{url}/metrics").text.splitlines():
        if line.startswith("flowserve_stage_batch_size_count{") and f'flow="{flow}"' in line:
            stage = line.split('stage="', 1)[1].split('"', 1)[0]
            out[stage] = out.get(stage, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_batching_stages_chain_when_a_request_would_run_alone(chain):
    """Table functions (``batching=True``): one request at a time finds each batcher's queue
    empty, so each stage would run it as a batch of one; chained, it does, and each stage
    still counts that batch."""
    cluster, _d, _f = chain
    f = Flow("chain-batching", schema={"x": int})
    f.map(plus_one_t, names=["y"], batching=True).map(twice_t, names=["z"], batching=True)
    d = cluster.deploy(f, rules=["batching"])  # a stage per operator, each with its batcher
    try:
        with httpx.Client(timeout=30) as http:
            before, deadline, x = _chained(http, cluster.url), time.monotonic() + 60, 0
            while _chained(http, cluster.url) < before + 50:
                assert time.monotonic() < deadline, "no batching stage was chained"
                for _ in range(50):
                    x += 1
                    r = http.post(d.url, json={"x": x})
                    assert r.status_code == 200 and r.json()["rows"][0]["z"] == 2 * (x + 1), r.text
            counted = _batches(http, cluster.url, f.name)
            r = http.post(d.url, json=[{"x": 3}, {"x": 4}])
            rows = [{k: v for k, v in row.items() if k != "qid"} for row in r.json()["rows"]]
            assert rows == [{k: v for k, v in e.items() if k != "qid"} for e in f.run([{"x": 3}, {"x": 4}]).to_pylist()]
            trace = json.loads(r.headers["x-flowserve-trace"])
            assert [e[0] for e in trace] == ["plus_one_t", "twice_t"] and [e[3] for e in trace] == [1, 1], trace
            # each stage's batches are counted, chained or not (pongs report them once a second)
            while min(counted.values()) < x:
                assert time.monotonic() < deadline, counted
                counted = _batches(http, cluster.url, f.name)
            assert set(counted) == {"plus_one_t", "twice_t"}, counted
    finally:
        d.undeploy()


def to_key(row):
    return "emb/" + row.k


def total(row):
    return float(row.v.sum())


def lookup_flow(name: str) -> Flow:
    """A per-row lookup between two maps: with the locality rule the lookup is a continuation
    (its rows go to the executors holding their keys) and each map a plain stage."""
    f = Flow(name, schema={"k": str}, key_prefixes=["emb/"])
    f.map(to_key, names=["key"]).lookup(column="key", name="v").map(total, names=["s"])
    return f


VECTORS = {f"emb/{i}": np.full(3, i, dtype=np.float32) for i in range(40)}
KEYED_ROWS = [{"k": str(i)} for i in range(40)]


def _rows(answer: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "qid"} for r in answer]


def test_a_lookup_continuation_hosted_here_alone_chains_with_the_stages_around_it(chain):
    cluster, _d, _f = chain
    cluster.kvs.mput(VECTORS)
    f = lookup_flow("chain-lookup")
    d = cluster.deploy(f, rules=["locality"])
    try:
        assert [s["name"] for s in httpx.get(d.url).json()["stages"]] == ["to_key", "lookup(key)", "total"]
        want = _rows(f.run(KEYED_ROWS[:3], kvs=cluster.kvs).to_pylist())
        with httpx.Client(timeout=30) as http:
            before, deadline = _chained(http, cluster.url), time.monotonic() + 60
            while _chained(http, cluster.url) < before + 100:
                assert time.monotonic() < deadline, "no run was chained"
                for _ in range(25):
                    r = http.post(d.url, json=KEYED_ROWS[:3])
                    assert r.status_code == 200 and _rows(r.json()["rows"]) == want, r.text
            # warm: both hops chain (into the lookup and out of it), not only the plain one
            before = _chained(http, cluster.url)
            for _ in range(100):
                r = http.post(d.url, json=KEYED_ROWS[:3])
                assert r.status_code == 200 and _rows(r.json()["rows"]) == want, r.text
            while _chained(http, cluster.url) < before + 150:  # pongs report it once a second
                assert time.monotonic() < deadline, (before, _chained(http, cluster.url))
            trace = json.loads(r.headers["x-flowserve-trace"])
            assert [e[0] for e in trace] == ["to_key", "lookup(key)", "total"], trace
    finally:
        d.undeploy()


def test_a_part_of_a_key_split_output_goes_to_its_merge_not_on_alone():
    """Over two executors the lookup's rows split by key into two parts, each run where its
    keys live; the stage after it merges the parts: a part must not run on alone, even where
    that stage is hosted on the part's executor (the answer would lose the other's rows)."""
    with LocalCluster(ClusterConfig(executors=2, request_timeout_s=20)) as cluster:
        cluster.kvs.mput(VECTORS)
        f = lookup_flow("split-lookup")
        d = cluster.deploy(f, rules=["locality"])
        want = _rows(f.run(KEYED_ROWS, kvs=cluster.kvs).to_pylist())
        with httpx.Client(timeout=30) as http:
            for _ in range(60):
                r = http.post(d.url, json=KEYED_ROWS)
                assert r.status_code == 200, r.text
                assert _rows(r.json()["rows"]) == want
            trace = json.loads(r.headers["x-flowserve-trace"])
            assert len({e[1] for e in trace if e[0] == "lookup(key)"}) == 2, trace  # split over both
