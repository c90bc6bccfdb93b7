"""One meaning on every path, on a real local cluster: the same input gives the same
answer, or the same error class and message, through ``flow.run``, ``Deployment.invoke``
(Arrow), HTTP JSON (one row, relayed to the executor, and a list, parsed by the gateway)
and HTTP Arrow; qids count from 0 on both sides; a request too big for memory is a 413;
error bodies are bounded."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import pyarrow as pa
import pytest

from executors.errors import RequestTooLargeError
from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import ColumnType, Flow
from flow.errors import DataTypeError

ARROW = "application/vnd.apache.arrow.stream"


def fit_flow(name: str) -> Flow:
    f = Flow(
        name, schema={"img": ColumnType.tensor(np.uint8, (2,)), "v": ColumnType.tensor(np.float32, (2,)), "n": int}
    )
    f.map(_total, names=["s"])
    return f


def _total(row):
    return float(row.img.sum()) + float(row.v.sum()) + row.n


def _arrow(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


@pytest.fixture(scope="module")
def served():
    """A fresh cluster, the flow deployed, and the answer to the very first request it got."""
    with LocalCluster(ClusterConfig(executors=1, request_timeout_s=30)) as c:
        d = c.deploy(fit_flow("fit"))
        first = httpx.post(d.url, json=[{"img": [1, 2], "v": [0.5, 0.5], "n": 0}, {"img": [3, 4], "v": [0, 0], "n": 1}])
        yield c, d, first


GOOD = {"img": [1, 2], "v": [0.5, 0.25], "n": 3}


@pytest.mark.parametrize(
    "column, value, says",
    [
        ("img", [300.7, 1], "column 'img': row 0: 300.7 does not fit in tensor[uint8, (2,)] (integers 0..255)"),
        ("img", [-1, 2], "column 'img': row 0: -1 does not fit in tensor[uint8, (2,)] (integers 0..255)"),
        ("img", [1, 300], "column 'img': row 0: 300 does not fit in tensor[uint8, (2,)] (integers 0..255)"),
        ("img", [2.5, 1], "column 'img': row 0: 2.5 does not fit in tensor[uint8, (2,)] (integers 0..255)"),
        (
            "v",
            [1.0, 1e39],
            "column 'v': row 0: 1e+39 does not fit in tensor[float32, (2,)] (numbers within ±3.4028235e+38)",
        ),
        ("n", 10**33, f"column 'n': row 0: {10**33} does not fit in int64 (integers {-(2**63)}..{2**63 - 1})"),
        ("img", [1, 2, 3], "column 'img': row 0: expected shape (2,), got (3,)"),
        (
            "img",
            [[1, 2], 3],
            "column 'img': row 0: not an array of numbers (are its nested lists of different lengths?)",
        ),
    ],
)
def test_a_value_that_does_not_fit_is_the_same_error_on_every_path(served, column, value, says):
    """numpy's casts wrapped these on the Python paths (300.7 as uint8 was 44, -1 was 255)
    while HTTP JSON answered 400: now each path refuses them with one message."""
    c, d, _ = served
    row = dict(GOOD, **{column: value})
    with pytest.raises(DataTypeError) as run:
        fit_flow("fit").run(row)
    assert str(run.value) == says
    with pytest.raises(DataTypeError) as invoked:
        d.invoke(row)
    assert _message(invoked.value) == says
    for body in (row, [GOOD, row]):  # one row (relayed: the executor parses it), and a list (the gateway does)
        r = httpx.post(d.url, content=json.dumps(body), headers={"content-type": "application/json"}, timeout=30)
        want = says if isinstance(body, dict) else says.replace("row 0", "row 1")
        assert (r.status_code, r.json()) == (400, {"error": "DataTypeError", "message": want}), body
    if column != "n" and value != [[1, 2], 3]:  # Arrow has no integer of 34 digits, no ragged list
        table = pa.table({k: pa.array([v]) for k, v in row.items()})
        r = httpx.post(d.url, content=_arrow(table), headers={"content-type": ARROW}, timeout=30)
        assert (r.status_code, r.json()) == (400, {"error": "DataTypeError", "message": says})


def _message(error) -> str:
    """The message the error's path gave: the server's, or the client's own check's."""
    body = getattr(error, "body", None)
    return body["message"] if isinstance(body, dict) else str(error)


def test_values_that_fit_mean_the_same_on_every_path(served):
    """75.0 is the integer 75 (as JSON Schema's "integer" says); ints become floats."""
    c, d, _ = served
    row = {"img": [75.0, 2], "v": [1, 2], "n": 3}
    want = fit_flow("fit").run(row)["s"].tolist()
    assert want == [83.0]
    assert d.invoke(row)["s"].tolist() == want
    assert httpx.post(d.url, json=row).json()["rows"][0]["s"] == want[0]
    assert httpx.post(d.url, json=[row]).json()["rows"][0]["s"] == want[0]
    table = pa.table({k: pa.array([v]) for k, v in row.items()})
    r = httpx.post(d.url, content=_arrow(table), headers={"content-type": ARROW, "accept": ARROW})
    assert pa.ipc.open_stream(r.content).read_all()["s"].to_pylist() == want


def test_one_dict_is_one_row_on_every_path(served):
    """flow.run took one dict as a dict of columns (and refused it); invoke and HTTP took it
    as one row. Now all take it as one row, and a dict of columns still works."""
    c, d, _ = served
    flow = fit_flow("fit")
    one = flow.run(GOOD)
    assert len(one) == 1 and one["s"].tolist() == [6.75]
    assert d.invoke(GOOD)["s"].tolist() == [6.75]
    assert [r["s"] for r in httpx.post(d.url, json=GOOD).json()["rows"]] == [6.75]
    columns = {"img": np.array([[1, 2], [3, 4]], np.uint8), "v": np.zeros((2, 2), np.float32), "n": [0, 1]}
    assert flow.run(columns)["s"].tolist() == d.invoke(columns)["s"].tolist() == [3.0, 8.0]


def test_qids_count_from_0_locally_and_over_http(served):
    """docs/flow-semantics.md, "qids": the first request to a fresh cluster gets the qids
    flow.run gives the same rows, and the next ones continue from there."""
    c, d, first = served
    rows = [{"img": [1, 2], "v": [0.5, 0.5], "n": 0}, {"img": [3, 4], "v": [0, 0], "n": 1}]
    assert first.status_code == 200 and first.headers["x-qid-start"] == "0"
    assert [r["qid"] for r in first.json()["rows"]] == fit_flow("fit").run(rows).qid.tolist() == [0, 1]
    later = d.call(rows)
    assert later.input_qids[0] >= 2 and later.table.qid.tolist() == later.input_qids.tolist()


def test_rows_that_would_not_fit_in_memory_are_a_413_not_a_500(served):
    """600,000 null rows of a (256, 256) float32 tensor are a 9 MB body and would be 146 GiB
    of columns: refused from the schema before anything is allocated; the cluster serves on."""
    c, _, _ = served
    big = Flow("big-tensor", schema={"img": ColumnType.tensor(np.float32, (256, 256))})
    big.map(lambda r: 0 if r.img is None else 1, names=["y"])
    d = c.deploy(big)
    body = json.dumps([{"img": None}] * 600_000).encode()
    r = httpx.post(d.url, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error"] == "RequestTooLargeError" and "MiB as columns" in r.json()["message"]
    r = httpx.post(d.url, content=_arrow(pa.table({"img": pa.nulls(600_000)})), headers={"content-type": ARROW})
    assert r.status_code == 413 and r.json()["error"] == "RequestTooLargeError", r.text[:300]
    with pytest.raises(RequestTooLargeError):
        d.invoke(pa.table({"img": pa.nulls(600_000)}))
    assert [r["y"] for r in httpx.post(d.url, json=[{"img": None}] * 3).json()["rows"]] == [0, 0, 0]


def test_an_error_body_never_echoes_a_huge_value(served):
    """A missing lookup key of 20 MB was echoed whole in the 422's body."""
    c, _, _ = served
    f = Flow("lookup-key", schema={"key": str})
    f.lookup(column="key", name="v")
    d = c.deploy(f)
    r = httpx.post(d.url, json={"key": "k" * 20_000_000}, timeout=60)
    assert r.status_code == 422 and len(r.content) < 3000, len(r.content)
    message = r.json()["message"]
    assert "'kkkk" in message and "characters cut]" in message
