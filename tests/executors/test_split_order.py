"""Key-split requests on a real cluster: racing copies feeding key-routed lookups give
exactly flow.run's rows, whatever the executors' caches hold; answers keep the request's
row order; an empty request is a request.

The caches are warmed unevenly on purpose (tests/executors/caches.py): one executor holds
keys the other does not. Each racing copy of a producer used to split its
rows by its own cache's view, so the copies' parts (labelled alike) did not fit together.
"""

from __future__ import annotations

import httpx
import numpy as np
import pyarrow as pa

from executors.codec.bodies import ARROW
from flow import Flow
from flow.table import Table
from tests.executors.caches import CacheWarmer
from tests.executors.conftest import unique


def key_of(row):
    return row.k


def _keyed_store(cluster, prefix: str, n: int) -> list[str]:
    keys = [f"{prefix}:{i}" for i in range(n)]
    cluster.kvs.mput({k: np.full(3, float(i)) for i, k in enumerate(keys)})
    return keys


def test_racing_copies_feeding_a_key_routed_lookup_give_flow_runs_rows(cluster, http):
    name = unique("race-lookup")
    keys = _keyed_store(cluster, name, 16)
    CacheWarmer(cluster, http).warm(keys[:8])  # one executor holds half the keys, the other none
    f = Flow(name, schema={"k": str})
    f.map(key_of, names=["k"], high_variance=True).lookup(column="k")
    d = cluster.deploy(f)
    stages = list(d.plan.stages.values())
    assert [s.competitive for s in stages] == [3, 1] and stages[1].continuation == "k"
    rows = [{"k": k} for k in reversed(keys)]
    store = {k: cluster.kvs.get(k) for k in keys}
    for i in range(50):
        r = http.post(d.url, json=rows, headers={"X-Request-Timeout": "5"})
        assert r.status_code == 200, f"request {i}: {r.status_code} {r.text}"
        start = int(r.headers["x-qid-start"])
        expected = f.run(Table.from_pylist(rows, qid=range(start, start + len(rows))), kvs=store)
        got = r.json()["rows"]
        assert len(got) == 16, f"request {i}: {len(got)} rows"
        assert [(row["qid"], row["k"], row["k_value"]) for row in got] == [
            (q, k, v.tolist()) for q, k, v in zip(expected.qid.tolist(), expected["k"], expected["k_value"])
        ], f"request {i}"


def shifted(row):
    return row.k, row.x + 1


def next_key(row):
    """The second lookup's key: another key than the first's, so rows regroup."""
    prefix, i = row.k.rsplit(":", 1)
    return row.k, row.x, float(row.v.sum()), f"{prefix}:{(int(i) * 7 + 3) % 40}"


def test_a_large_request_keeps_its_row_order_through_per_row_lookups(cluster, http):
    """Two per-row lookups in a row: the second splits each part of the first again (paths
    nest); a filter drops rows inside the parts. Executors' caches hold different keys."""
    name = unique("order")
    keys = _keyed_store(cluster, name, 40)
    CacheWarmer(cluster, http).warm(keys[::3])
    f = Flow(name, schema={"k": str, "x": int})
    f.map(shifted, names=["k", "x"]).lookup(column="k", name="v").filter(lambda r: r.x % 7 != 3).map(
        next_key, names=["k", "x", "s", "k2"]
    ).lookup(column="k2", name="v2").map(lambda r: (r.k, r.x, r.s + float(r.v2[0])), names=["k", "x", "s"])
    d = cluster.deploy(f)
    assert [s.continuation for s in d.plan.stages.values()] == [None, "k", "k2"]
    rng = np.random.default_rng(7)
    rows = [{"k": keys[int(j)], "x": i} for i, j in enumerate(rng.integers(0, len(keys), 2000))]
    answer = d.call(rows)
    expected = f.run(Table.from_pylist(rows, qid=answer.input_qids), kvs={k: cluster.kvs.get(k) for k in keys})
    assert len(expected) > 1500
    assert answer.table.qid.tolist() == expected.qid.tolist()  # row by row, in flow.run's order
    assert answer.table["k"].tolist() == expected["k"].tolist()
    assert answer.table["s"].tolist() == expected["s"].tolist()


def unsure(row):
    return float(row.v[0]), 0.5 if row.x % 3 else 0.99  # valid for every third row only


def sure(row):
    return float(row.v[0]), 0.95  # the same value, always valid


def test_alternatives_racing_after_a_key_split_keep_row_order(cluster):
    """anyof after a per-row lookup: the alternatives (competing stages) merge the key
    groups, the first valid result per row wins; rows in flow.run's order."""
    name = unique("split-anyof")
    keys = _keyed_store(cluster, name, 12)
    f = Flow(name, schema={"k": str, "x": int})
    f.lookup(column="k", name="v").anyof(unsure, sure, names=["y", "conf"], valid=lambda r: r.conf > 0.9)
    d = cluster.deploy(f)
    assert any(s.wait == "first_valid" for s in d.plan.stages.values())
    rows = [{"k": keys[(i * 5) % 12], "x": i} for i in range(60)]
    for _ in range(5):
        answer = d.call(rows)
        expected = f.run(Table.from_pylist(rows, qid=answer.input_qids), kvs={k: cluster.kvs.get(k) for k in keys})
        assert answer.table.qid.tolist() == expected.qid.tolist()
        assert answer.table["y"].tolist() == expected["y"].tolist()


def _arrow_body(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def test_an_empty_json_list_is_a_request_of_no_rows(cluster, http):
    name = unique("empty")
    keys = _keyed_store(cluster, name, 4)
    with_schema = Flow(name, schema={"k": str, "x": float})
    with_schema.map(lambda r: r.x * 2, names=["y"], high_variance=True).join(with_schema).lookup(
        column="k", name="v"
    ).map(lambda r: float(r.v.sum()) + r.y, names=["s"], batching=False)
    no_schema = Flow(name + "-free")
    no_schema.map(lambda t: t["x"] * 2, names=["y"], batching=True).anyof(
        lambda r: (r.y, 0.5), lambda r: (r.y, 0.95), names=["v", "conf"], valid=lambda r: r.conf > 0.9
    )
    for f in (with_schema, no_schema):
        d = cluster.deploy(f)
        spec = http.get(f"{cluster.url}/openapi.json").json()
        body = spec["paths"][f"/flows/{f.name}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        rows = [s for s in body["oneOf"] if s.get("type") == "array"]
        assert rows[0]["items"] == body["oneOf"][0] and rows[0].get("minItems", 0) == 0  # any number of rows, also none
        expected = f.run([], kvs={k: cluster.kvs.get(k) for k in keys})
        r = http.post(d.url, json=[])
        assert r.status_code == 200, r.text
        assert r.json() == {"rows": []} == {"rows": expected.to_pylist()}
        r = http.post(
            d.url,
            content=_arrow_body(Table.from_pylist([], schema=f.schema).to_arrow().drop_columns(["qid"]))
            if f.schema
            else _arrow_body(pa.table({})),
            headers={"Content-Type": ARROW, "Accept": ARROW},
        )
        assert r.status_code == 200, r.text
        got = pa.ipc.open_stream(r.content).read_all()
        assert got.num_rows == 0
        assert got.column_names == ["qid", *expected.columns]
        # a real request right after: the empty ones left nothing behind
        if f.schema:
            r = http.post(d.url, json=[{"k": keys[1], "x": 1.0}])
        else:
            r = http.post(d.url, json=[{"x": 1.0}])
        assert r.status_code == 200 and len(r.json()["rows"]) == 1, r.text


def test_a_request_cannot_use_the_reserved_position_column(cluster, http):
    f = Flow(unique("reserved"))
    f.map(lambda r: 1, names=["y"])
    d = cluster.deploy(f)
    r = httpx.post(d.url, json=[{"#pos": 1}])
    assert r.status_code == 400, r.text
    assert "#pos" in r.json()["message"]


def tripled(table):
    return table["x"] * 3


def test_empty_requests_batched_with_others_and_split_by_key(cluster):
    """Empty and non-empty requests at once: batching stages merge them (and split the
    result back), the lookup splits each by key; every answer is its own flow.run's."""
    import threading

    from optimizer import BatchConfig, OptimizerOptions

    name = unique("empty-mix")
    keys = _keyed_store(cluster, name, 6)
    f = Flow(name, schema={"k": str, "x": float})
    f.map(tripled, names=["x"], batching=True).join(f.map(key_of, names=["k"])).lookup(column="k", name="v").map(
        tripled, names=["y"], batching=True
    )
    d = cluster.deploy(f, options=OptimizerOptions(batch=BatchConfig(max_batch_size=16, max_wait_ms=20.0)))
    assert sum(s.batch is not None for s in d.plan.stages.values()) >= 2
    requests = [[] if i % 2 else [{"k": keys[(i + j) % 6], "x": float(j)} for j in range(i)] for i in range(12)]
    answers, barrier = {}, threading.Barrier(len(requests))

    def call(i):
        barrier.wait()
        answers[i] = d.call(Table.from_pylist(requests[i], schema=f.schema), timeout=30)  # typed, also when empty

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store = {k: cluster.kvs.get(k) for k in keys}
    assert sorted(answers) == list(range(len(requests)))
    first = next(s.name for s in d.plan.stages.values() if s.batch is not None)
    assert _metric(cluster, f'flowserve_stage_batch_size_sum{{flow="{name}",stage="{first}"}}') > _metric(
        cluster, f'flowserve_stage_batch_size_count{{flow="{name}",stage="{first}"}}'
    ), "no batch merged"
    for i, answer in answers.items():
        expected = f.run(Table.from_pylist(requests[i], qid=answer.input_qids, schema=f.schema), kvs=store)
        assert answer.table.qid.tolist() == expected.qid.tolist(), i
        assert answer.table["y"].tolist() == expected["y"].tolist(), i


def _metric(cluster, name: str) -> float:
    for line in cluster.http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"metric {name} not found")
