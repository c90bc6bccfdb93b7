"""The OpenAPI document against the server it describes, judged by an outside fuzzer:
schemathesis (PyPI) reads GET /openapi.json of a live cluster whose flows take every
column type, sends what the document calls valid and what it calls invalid, and checks
each answer against the document. A server error, a valid request refused, an invalid one
taken, a status, header or body the document does not declare, or a 405 without ``Allow``
fails the test with schemathesis's report, which shows the request that reproduces it
(``st replay`` is not needed: the report has a curl line).

The seed is fixed and the budget small (about 30 s on 2 cores): the test is a regression
net for the document, not a search; run schemathesis by hand with a bigger
``--max-examples`` to search (the module's ``run_schemathesis`` takes any budget).
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from flow import ColumnType, Flow

TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SEED = 20261127
EXAMPLES = 40  # per operation and phase


def echo_scalars(row):
    return row.i, row.f, row.b, row.s, row.raw


def echo_tensors(row):
    return row.img, row.v, row.mask, row.half, row.wide


def count_rows(table):
    return np.arange(len(table))


def parity(row):
    return (row.x or 0) % 2  # x may be null (a missing value)


def zero(row):
    return 0


def flows() -> list[Flow]:
    """One flow per family of column types, a lookup whose missing keys answer 422, a flow
    without an input schema, and one with a select (which takes feedback)."""
    scalars = Flow("scalars", schema={"i": int, "f": float, "b": bool, "s": str, "raw": bytes})
    scalars.map(echo_scalars, names=["i", "f", "b", "s", "raw"])
    tensors = Flow(
        "tensors",
        schema={
            "img": ColumnType.tensor(np.uint8, (2, 2)),
            "v": ColumnType.tensor(np.float32, (3,)),
            "mask": ColumnType.tensor(np.bool_, (2,)),
            "half": ColumnType.tensor(np.float16, (2,)),
            "wide": ColumnType.tensor(np.int64, (2,)),
        },
    )
    tensors.map(echo_tensors, names=["img", "v", "mask", "half", "wide"])
    lookup = Flow("lookup", schema={"key": str})
    lookup.lookup(column="key", name="vec")
    free = Flow("free")
    free.map(count_rows, names=["n"], batching=True)
    chooser = Flow("chooser", schema={"x": int})
    chooser.select([parity, zero], names=["cls"])
    return [scalars, tensors, lookup, free, chooser]


CONFIG = """
seed = {seed}
workers = 1
continue-on-failure = true

[cache]
enabled = false

[generation]
max-examples = {examples}
database = "none"

[auth.openapi.bearer]
bearer = "{token}"

[checks]
enabled = true

# a key the store does not hold is a valid request answered 422 (LookupKeyError)
[[operations]]
include-path = "/flows/lookup"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2XX", 422]

# feedback for a query the select has no record of (most qids) is a valid request answered 404
[[operations]]
include-path = "/flows/chooser/feedback"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2XX", 404]

# a flow without an input schema declares no column types: which rows its operators take
# (one type per column across the rows, regular tensors) the document cannot say
[[operations]]
include-path = "/flows/free"
include-method = "POST"
checks.positive_data_acceptance.enabled = false
"""


@pytest.fixture(scope="module")
def fuzzed():
    with LocalCluster(ClusterConfig(executors=1, threads=4, token=TOKEN, max_body_bytes=1 << 20)) as c:
        c.kvs.put("vec/a", np.ones(3, dtype=np.float32))
        for f in flows():
            c.deploy(f)
        doc = httpx.get(c.url + "/openapi.json", headers=AUTH).json()
        for name in ("scalars", "tensors"):  # one answer each, so the document types their outputs too
            body = doc["paths"][f"/flows/{name}"]["post"]["requestBody"]["content"]["application/json"]
            answer = httpx.post(c.url + f"/flows/{name}", json=body["examples"]["one row"]["value"], headers=AUTH)
            assert answer.status_code == 200, answer.text
        yield c


def run_schemathesis(url: str, tmp_path, examples: int = EXAMPLES, seed: int = SEED) -> tuple[int, str]:
    """Run schemathesis on the gateway at ``url`` (its document, as it is now, read with
    the token): its exit code and its report."""
    document = tmp_path / "openapi.json"
    document.write_text(httpx.get(url + "/openapi.json", headers=AUTH).text)
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG.format(seed=seed, examples=examples, token=TOKEN))
    command = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "--no-color"]
    r = subprocess.run(
        [*command, "run", str(document), "--url", url], capture_output=True, text=True, cwd=tmp_path, timeout=240
    )
    return r.returncode, r.stdout + r.stderr


def test_the_document_is_what_the_server_does(fuzzed, tmp_path):
    code, text = run_schemathesis(fuzzed.url, tmp_path)
    assert code == 0, text[-20000:]  # schemathesis's report: each failure with the request to reproduce it
    doc = httpx.get(fuzzed.url + "/openapi.json", headers=AUTH).json()
    operations = sum(len(ops) for ops in doc["paths"].values())
    assert f"Tested: {operations}" in text, text[-5000:]  # every operation was reached
