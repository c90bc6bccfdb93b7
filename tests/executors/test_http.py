"""Every operator and every error code through real HTTP on a real local cluster."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from executors.codec.bodies import ARROW
from flow import ColumnType, Flow, RejectRow, RowRejectedError
from flow.errors import FlowError
from flow.table import Table
from tests.executors.conftest import unique


def rows_by_qid(rows):
    return sorted(tuple(sorted((k, v) for k, v in r.items() if k != "qid")) for r in rows)


def same_answers(deployed: Table, reference: Table):
    """Deployed qids are the gateway's; compare the multiset of rows without qids."""
    a = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()} for r in deployed.to_pylist()]
    b = [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.items()} for r in reference.to_pylist()]
    assert rows_by_qid(a) == rows_by_qid(b)


def double(row):
    return row.x * 2


def test_map_json_single_row_and_list(cluster, http):
    f = Flow(unique("double"), schema={"x": int})
    f.map(double, names=["y"])
    d = cluster.deploy(f)
    one = http.post(d.url, json={"x": 21})
    assert one.status_code == 200
    assert [r["y"] for r in one.json()["rows"]] == [42]
    assert isinstance(one.json()["rows"][0]["qid"], int)
    many = http.post(d.url, json=[{"x": 1}, {"x": 2}, {"x": 3}]).json()["rows"]
    assert [r["y"] for r in many] == [2, 4, 6]
    assert len({r["qid"] for r in many}) == 3


def test_arrow_in_and_out(cluster, http):
    f = Flow(unique("tensor"))
    f.map(lambda r: (r.img.astype(np.float32) / 255.0, r.x + 1), names=["norm", "x1"])
    d = cluster.deploy(f)
    imgs = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4)
    t = Table.from_dict({"img": imgs, "x": [1.0, 2.0]})
    arrow = t.to_arrow().drop_columns(["qid"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, arrow.schema) as w:
        w.write_table(arrow)
    r = http.post(d.url, content=sink.getvalue().to_pybytes(), headers={"Content-Type": ARROW, "Accept": ARROW})
    assert r.status_code == 200, r.text
    out = Table.from_arrow(pa.ipc.open_stream(r.content).read_all(), qid="qid")
    assert out["norm"].dtype == np.float32 and out["norm"].shape == (2, 4, 4)
    np.testing.assert_allclose(out["norm"], imgs / 255.0, rtol=1e-6)
    assert out["x1"].tolist() == [2.0, 3.0]


def test_tensor_columns_as_nested_json_lists(cluster, http):
    f = Flow(unique("nested"), schema={"v": ColumnType.tensor(np.float32, (3,))})
    f.map(lambda r: float(r.v.sum()), names=["s"])
    d = cluster.deploy(f)
    r = http.post(d.url, json=[{"v": [1, 2, 3]}, {"v": [0.5, 0.5, 0.5]}])
    assert r.status_code == 200, r.text
    assert [x["s"] for x in r.json()["rows"]] == [6.0, 1.5]
    bad = http.post(d.url, json={"v": [1, 2]})
    assert bad.status_code == 400
    assert "'v'" in bad.json()["message"] and "(3,)" in bad.json()["message"]


def test_every_operator_matches_run(cluster):
    f = Flow(unique("all-ops"))
    base = f.map(lambda r: (r.k, r.v, r.v % 2 == 0), names=["k", "v", "even"])
    evens = base.filter(lambda r: r.even)
    odds = base.filter(lambda r: not r.even)
    both = evens.union(odds)
    looked = both.lookup("scale", name="scale").lookup(column="k", name="kv", missing="null")
    scored = looked.map(lambda r: (r.k, r.v * r.scale + (0 if r.kv is None else r.kv)), names=["k", "score"])
    joined = scored.join(base, how="left")
    best = joined.anyof(
        lambda r: r.score if r.score > 10 else -1, lambda r: r.score + 100, names=["pick"], valid=lambda r: r.pick >= 0
    )
    final = best.join(joined).map(lambda r: (r.k, r.pick), names=["k", "pick"])
    final.groupby("k").agg("sum", "pick")
    cluster.kvs.put("scale", 3)
    cluster.kvs.put("a", 1)
    cluster.kvs.put("b", 2)
    rows = [{"k": k, "v": v} for k, v in zip("abcab", [1, 2, 3, 4, 5])]
    expected = f.run(rows, kvs={"scale": 3, "a": 1, "b": 2})
    for optimize in (False, True):
        d = cluster.deploy(f, optimize=optimize)
        got = d.invoke(rows)
        # agg gives each group the smallest qid of its rows: qids differ, answers do not
        assert sorted(zip(got["k"].tolist(), got["sum_pick"].tolist())) == sorted(
            zip(expected["k"].tolist(), expected["sum_pick"].tolist())
        )


def rejecting(row):
    if row.x < 0:
        raise RejectRow("x must be >= 0")
    return row.x


def exploding(row):
    raise ZeroDivisionError("boom")


def test_error_codes(cluster, http):
    f = Flow(unique("typed"), schema={"x": int})
    f.map(rejecting, names=["y"])
    d = cluster.deploy(f)
    r = http.post(d.url, content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["message"]
    r = http.post(d.url, json={"x": "seven"})
    assert r.status_code == 400 and "'x'" in r.json()["message"] and "int" in r.json()["message"]
    r = http.post(d.url, json={"y": 1})
    assert r.status_code == 400 and "'x'" in r.json()["message"]
    r = http.post(cluster.url + "/flows/no-such-flow", json={"x": 1})
    assert r.status_code == 404
    r = http.post(
        d.url, content=b"[" + b'{"x": 1},' * 200_000 + b'{"x": 1}]', headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 413
    r = http.post(d.url, json={"x": -1})
    assert r.status_code == 422
    assert r.json()["operator"] == "rejecting" and "x must be >= 0" in r.json()["message"]
    g = Flow(unique("exploding"))
    g.map(exploding, names=["y"])
    d2 = cluster.deploy(g)
    r = http.post(d2.url, json={"x": 1})
    assert r.status_code == 500
    body = r.json()
    assert body["operator"] == "exploding" and "ZeroDivisionError" in body["message"] and "boom" in body["message"]
    assert "Traceback" not in r.text
    # the failures above did not take anything down
    assert http.post(d.url, json={"x": 5}).json()["rows"][0]["y"] == 5


def slow(row):
    import time

    time.sleep(2)
    return row.x


def test_deadline_gives_504(cluster, http):
    f = Flow(unique("slow"))
    f.map(slow, names=["y"])
    d = cluster.deploy(f)
    r = http.post(d.url, json={"x": 1}, headers={"X-Request-Timeout": "0.3"})
    body = r.json()
    # the executor running it answers at the deadline, naming the operator it was in
    assert r.status_code == 504 and body["operator"] == "slow" and "deadline" in body["message"], body
    assert body["error"] == "OperatorTimeoutError"


def test_invoke_raises_with_status(cluster):
    f = Flow(unique("rej"), schema={"x": int})
    f.map(rejecting, names=["y"])
    d = cluster.deploy(f)
    with pytest.raises(RowRejectedError) as e:  # the class the gateway named, a DataError: fix the input
        d.invoke({"x": -5})
    assert e.value.status == 422 and e.value.operator == "rejecting" and e.value.body["error"] == "RowRejectedError"
    assert isinstance(e.value, FlowError)  # the root catches every error the client raises


def test_listing_describe_health_metrics_openapi(cluster, http):
    f = Flow(unique("listed"), schema={"x": int})
    f.map(double, names=["y"])
    d = cluster.deploy(f)
    http.post(d.url, json={"x": 1})
    flows = {x["name"]: x for x in http.get(cluster.url + "/flows").json()["flows"]}
    assert flows[f.name]["input_schema"] == {"x": {"kind": "int"}}
    desc = http.get(d.url).json()
    assert [s["name"] for s in desc["stages"]] == ["double"]
    assert desc["stages"][0]["replicas"] >= 1 and desc["stages"][0]["p50_ms"] is not None
    assert http.get(cluster.url + "/healthz").json()["status"] == "ok"
    metrics = http.get(cluster.url + "/metrics").text
    assert f'flowserve_stage_latency_ms_count{{flow="{f.name}",stage="double"}}' in metrics
    spec = http.get(cluster.url + "/openapi.json").json()
    assert f"/flows/{f.name}" in spec["paths"]
    assert set(spec["paths"][f"/flows/{f.name}"]["post"]["responses"]) >= {
        "200",
        "400",
        "404",
        "413",
        "422",
        "500",
        "503",
        "504",
    }


def test_metrics_trace_listing_and_openapi_agree(cluster, http):
    import numpy as np

    from flow import ColumnType
    from tests.executors.test_runtime_paths import _metric

    f = Flow(unique("agree"), schema={"img": ColumnType.tensor(np.uint8, (2, 2))})
    a = f.map(lambda r: int(r.img.sum()), names=["s"])
    b = f.map(lambda r: int(r.img.max()), names=["m"])
    a.join(b).map(lambda r: r.s + r.m, names=["t"])
    d = cluster.deploy(f, optimize=False)  # a fork-join: every stage's entry reaches the sink twice
    ok = http.post(d.url, json={"img": [[1, 2], [3, 4]]})
    assert ok.status_code == 200 and ok.json()["rows"][0]["t"] == 14
    trace = json.loads(ok.headers["x-flowserve-trace"])
    assert len(trace) == len({tuple(e) for e in trace}) == 4, trace  # each stage once
    assert http.post(d.url, json={"img": "no"}).status_code == 400
    assert http.post(cluster.url + "/flows/no-such-flow-xyz", json={}).status_code == 404
    text = http.get(cluster.url + "/metrics").text
    assert _metric(text, f'flowserve_requests_total{{flow="{f.name}",status="200"}}') == 1
    assert _metric(text, f'flowserve_requests_total{{flow="{f.name}",status="400"}}') == 1
    assert _metric(text, f'flowserve_errors_total{{flow="{f.name}",status="400"}}') == 1
    assert _metric(text, 'flowserve_errors_total{flow="-",status="404"}') >= 1
    assert "no-such-flow-xyz" not in text
    listed = {x["name"]: x for x in http.get(cluster.url + "/flows").json()["flows"]}
    assert listed[f.name]["input_schema"] == {"img": {"kind": "tensor", "dtype": "uint8", "shape": [2, 2]}}
    op = http.get(cluster.url + "/openapi.json").json()["paths"][f"/flows/{f.name}"]["post"]
    row = op["requestBody"]["content"]["application/json"]["schema"]["oneOf"][0]
    assert row["properties"]["img"]["items"]["items"] == {"type": "integer", "minimum": 0, "maximum": 255}
    out = op["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["rows"]["items"]
    # the flow has answered: its output columns are known by name and type, as answered
    assert set(out["required"]) == set(ok.json()["rows"][0]) and "t" in out["required"]
    assert out["properties"]["t"]["type"] == ["integer", "null"]  # int64, or null for a missing value


def test_openapi_names_outputs_before_the_first_answer_and_types_them_after(cluster, http):
    import numpy as np

    f = Flow(unique("typed"), schema={"x": int})
    f.map(lambda r: np.full((2, 3), r.x, dtype=np.uint8), names=["img"])
    d = cluster.deploy(f)

    def output_row():
        op = http.get(cluster.url + "/openapi.json").json()["paths"][f"/flows/{f.name}"]["post"]
        return op["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["rows"]["items"]

    before = output_row()
    assert before["required"] == ["qid", "img"] and "type" not in before["properties"]["img"]
    assert http.post(d.url, json={"x": 7}).status_code == 200
    img = output_row()["properties"]["img"]
    assert img["minItems"] == img["maxItems"] == 2 and img["items"]["maxItems"] == 3
    assert img["items"]["items"] == {"type": "integer", "minimum": 0, "maximum": 255}


def test_docs_page_is_served_from_the_package_without_a_cdn(cluster, http):
    page = http.get(cluster.url + "/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in page.text and "//" not in page.text.replace("<!DOCTYPE", "").split("<body>")[0]
    assert "http" not in page.text  # nothing loaded from another host
    js = http.get(cluster.url + "/docs/static/swagger-ui-bundle.js")
    assert js.status_code == 200 and "SwaggerUIBundle" in js.text[:200000]
    assert http.get(cluster.url + "/docs/static/swagger-ui.css").status_code == 200
