"""The OpenAPI document says exactly what the gateway accepts and answers: bodies at the
edges of each column type, judged by the live document (a JSON Schema validator) and by
the live server, get the same verdict; every status a route answers is declared; a 405
names the allowed methods. test_openapi_fuzz.py searches the same with schemathesis; these
are the cases it found, kept as plain regression tests."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from executors.gateway.openapi import column_schema, example_row, openapi_document, row_schema
from flow import ColumnType, Flow
from tests.executors.conftest import unique

TYPES = {
    "i": ColumnType("int"),
    "f": ColumnType("float"),
    "b": ColumnType("bool"),
    "s": ColumnType("str"),
    "raw": ColumnType("bytes"),
    "img": ColumnType.tensor(np.uint8, (2,)),
    "v": ColumnType.tensor(np.float32, (2,)),
    "half": ColumnType.tensor(np.float16, (1,)),
    "wide": ColumnType.tensor(np.int64, (1,)),
    "mask": ColumnType.tensor(np.bool_, (2,)),
}
# one good row; each probe replaces one column's value (as JSON text, so 75.0 stays 75.0)
GOOD = {
    "i": "1",
    "f": "0.5",
    "b": "true",
    "s": '"text"',
    "raw": '"Ynl0ZXM="',
    "img": "[1, 2]",
    "v": "[0.5, 1]",
    "half": "[1]",
    "wide": "[1]",
    "mask": "[true, false]",
}
PROBES = [
    # (column, JSON value): the verdict is the document's, checked against the server's
    ("i", "1234567890123456789012345678901234"),  # 34 digits: over int64
    ("i", "9223372036854775807"),
    ("i", "9223372036854775808"),
    ("i", "-9223372036854775808"),
    ("i", "-9223372036854775809"),  # orjson reads it as a float
    ("i", "5.0"),  # an integer, to JSON Schema
    ("i", "5.5"),
    ("i", "true"),
    ("i", "null"),
    ("f", "1"),
    ("f", "1e308"),
    ("f", "1" + "0" * 400),  # an integer no float64 holds
    ("f", "true"),
    ("f", "null"),
    ("b", "1"),
    ("b", "null"),
    ("s", "null"),  # a missing value, as in every column
    ("s", "5"),
    ("raw", '""'),
    ("raw", '"AAAA="'),  # padding after a whole group
    ("raw", '"AA=A"'),
    ("raw", '"E"'),
    ("raw", "null"),
    ("img", "[75.0, 0]"),  # an integer, to JSON Schema
    ("img", "[75.5, 0]"),
    ("img", "[256, 0]"),
    ("img", "[-1, 0]"),
    ("img", "[true, 0]"),
    ("img", "[1, 2, 3]"),
    ("img", "[1, null]"),
    ("img", "null"),
    ("v", "[true, 0]"),  # a boolean among numbers
    ("v", "[1e39, 0]"),  # beyond float32
    ("v", "[3.4e38, 0]"),
    ("half", "[65519]"),  # rounds to float16's largest
    ("half", "[65520]"),  # rounds to its infinity
    ("wide", "[-9223372036854775809]"),
    ("wide", "[9223372036854775807]"),
    ("wide", "[9.3e18]"),
    ("mask", "[1, 0]"),
    ("mask", "[true, null]"),
]


def echo(row):
    return tuple(getattr(row, c) for c in TYPES)


@pytest.fixture(scope="module")
def typed(cluster):
    f = Flow(unique("typed-probes"), schema=TYPES)
    f.map(echo, names=list(TYPES))
    return cluster.deploy(f)


def _request_schema(http, cluster, name) -> dict:
    doc = http.get(cluster.url + "/openapi.json").json()
    return doc["paths"][f"/flows/{name}"]["post"]["requestBody"]["content"]["application/json"]["schema"]


def test_the_server_takes_what_the_document_calls_valid_and_nothing_else(cluster, http, typed):
    validator = jsonschema.Draft202012Validator(_request_schema(http, cluster, typed.name))
    disagree = []
    for column, value in PROBES:
        text = "{" + ", ".join(f'"{c}": {value if c == column else v}' for c, v in GOOD.items()) + "}"
        valid = validator.is_valid(json.loads(text))
        r = http.post(typed.url, content=text, headers={"Content-Type": "application/json"})
        if (r.status_code == 200) != valid or r.status_code not in (200, 400):
            disagree.append((column, value[:40], "valid" if valid else "invalid", r.status_code, r.text[:200]))
    assert not disagree, "\n".join(map(str, disagree))
    assert validator.is_valid(json.loads("{" + ", ".join(f'"{c}": {v}' for c, v in GOOD.items()) + "}"))


def test_each_flow_has_an_example_body_the_server_takes(cluster, http, typed):
    op = http.get(cluster.url + "/openapi.json").json()["paths"][f"/flows/{typed.name}"]["post"]
    body = op["requestBody"]["content"]["application/json"]
    validator = jsonschema.Draft202012Validator(body["schema"])
    for example in body["examples"].values():
        assert validator.is_valid(example["value"])
        r = http.post(typed.url, json=example["value"])
        assert r.status_code == 200, r.text


def test_a_missing_lookup_key_is_a_declared_422(cluster, http):
    f = Flow(unique("keyed"), schema={"key": str})
    f.lookup(column="key", name="value")
    d = cluster.deploy(f)
    r = http.post(d.url, json={"key": "no-such-key"})
    assert r.status_code == 422 and r.json()["error"] == "LookupKeyError"
    doc = http.get(cluster.url + "/openapi.json").json()
    declared = doc["paths"][f"/flows/{f.name}"]["post"]["responses"]["422"]
    schema = declared["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/Error"}
    jsonschema.validate(r.json(), doc["components"]["schemas"]["Error"])


def first(row):
    return row.x % 2


def second(row):
    return 0


FEEDBACK_PROBES = [
    '{"qid": QID, "label": 1}',
    '{"qid": QID.0, "label": 1}',
    '{"qid": QID, "reward": 0.5}',
    '{"qid": QID, "reward": 1, "label": null}',
    '{"qid": QID, "label": [1, "a"], "reward": null}',
    '{"qid": QID}',
    '{"qid": QID, "reward": null}',
    '{"qid": QID, "label": null}',
    '{"qid": QID, "reward": 1, "label": 1}',
    '{"qid": QID, "reward": 1.5}',
    '{"qid": QID, "reward": true}',
    '{"qid": QID, "reward": "1"}',
    '{"qid": QID, "label": 1, "extra": 1}',
    '{"qid": true, "label": 1}',
    '{"qid": "QID", "label": 1}',
    '{"label": 1}',
    "[]",
]


def test_feedback_is_declared_for_a_flow_with_a_select_and_judged_as_the_server_does(cluster, http, typed):
    f = Flow(unique("chooser"), schema={"x": int})
    f.select([first, second], names=["cls"])
    d = cluster.deploy(f)
    answer = http.post(d.url, json=[{"x": 1}, {"x": 2}])
    assert answer.status_code == 200, answer.text
    qid = int(answer.headers["x-qid-start"])
    doc = http.get(cluster.url + "/openapi.json").json()
    assert f"/flows/{typed.name}/feedback" not in doc["paths"]  # no select: no feedback to take
    op = doc["paths"][f"/flows/{f.name}/feedback"]["post"]
    body = op["requestBody"]["content"]["application/json"]
    validator = jsonschema.Draft202012Validator(body["schema"])
    disagree = []
    for probe in FEEDBACK_PROBES:
        text = probe.replace("QID", str(10**12 + qid))  # no record of it: a valid body is a 404
        valid = validator.is_valid(json.loads(text))
        r = http.post(d.url + "/feedback", content=text, headers={"Content-Type": "application/json"})
        if r.status_code != (404 if valid else 400) or str(r.status_code) not in op["responses"]:
            disagree.append((probe, "valid" if valid else "invalid", r.status_code, r.text[:200]))
    assert not disagree, "\n".join(map(str, disagree))
    for example, q in zip(body["examples"].values(), (qid, qid + 1)):  # each taken once, for a query answered
        assert validator.is_valid(example["value"])
        r = http.post(d.url + "/feedback", json={**example["value"], "qid": q})
        assert r.status_code == 200, r.text
        jsonschema.validate(r.json(), op["responses"]["200"]["content"]["application/json"]["schema"])


def test_every_operation_declares_its_errors_as_json_errors(cluster, http, typed):
    doc = http.get(cluster.url + "/openapi.json").json()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            codes = set(op["responses"])
            assert {"500", "408", "431"} <= codes, (method, path)
            for code, answer in op["responses"].items():
                if code.startswith(("4", "5")) and not (path.startswith("/readyz") and code == "503"):
                    assert answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    invoke = doc["paths"][f"/flows/{typed.name}"]["post"]["responses"]
    assert set(invoke) >= {"200", "400", "404", "413", "422", "500", "503", "504"}
    assert "401" not in invoke  # this cluster has no token


def test_a_405_names_the_methods_the_path_takes(cluster, http, typed):
    for method, path, allowed in (
        ("PUT", typed.url, {"GET", "HEAD", "POST"}),
        ("TRACE", cluster.url + "/flows", {"GET", "HEAD"}),
        ("DELETE", cluster.url + "/openapi.json", {"GET", "HEAD"}),
    ):
        r = http.request(method, path)
        assert r.status_code == 405 and r.json()["error"] == "MethodNotAllowed", (method, path)
        assert {m.strip() for m in r.headers["allow"].split(",")} == allowed, (method, path)


# -- the document's schemas, without a server -------------------------------------------


def test_integer_and_float_bounds_are_the_dtypes():
    assert column_schema(ColumnType("int"))["maximum"] == 2**63 - 1
    assert column_schema(ColumnType("int"))["type"] == ["integer", "null"]
    u8 = column_schema(ColumnType.tensor(np.uint8, (2,)))
    assert u8["items"] == {"type": "integer", "minimum": 0, "maximum": 255} and u8["type"] == ["array", "null"]
    f16 = column_schema(ColumnType.tensor(np.float16, (1,)))["items"]
    assert f16["exclusiveMaximum"] == 65520.0  # 65519.99 rounds to 65504, 65520 to infinity
    f32 = column_schema(ColumnType.tensor(np.float32, (1,)))["items"]["exclusiveMaximum"]
    with np.errstate(over="ignore"):
        assert np.isfinite(np.float16(65519.99)) and np.isinf(np.float16(65520.0))
        assert np.isinf(np.float32(f32)) and np.isfinite(np.float32(np.nextafter(f32, 0)))


def test_a_flow_without_a_schema_takes_any_named_columns_but_the_servers():
    row = row_schema(None)
    validator = jsonschema.Draft202012Validator(row)
    assert validator.is_valid({"x": 1, "y": [1.5, 2], "z": None})
    assert not validator.is_valid({"qid": 1}) and not validator.is_valid({"": 1})
    assert not validator.is_valid({"x": {"nested": 1}})
    assert example_row(None) is None


def test_the_document_declares_the_token_where_the_cluster_asks_for_one():
    class Plan:
        input_schema = {"x": ColumnType("int")}
        sink = "s"
        stages = {"s": type("S", (), {"nodes": [type("N", (), {"op": type("O", (), {"names": ["y"]})()})()]})()}

    flows = {"f": type("F", (), {"plan": Plan()})()}
    doc = openapi_document(flows, token=True, public_metrics=True)
    assert doc["security"] == [{"bearer": []}]
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert doc["paths"]["/healthz"]["get"]["security"] == [] and doc["paths"]["/metrics"]["get"]["security"] == []
    assert "401" in doc["paths"]["/flows/f"]["post"]["responses"] and "security" not in doc["paths"]["/flows"]["get"]
    assert "security" not in openapi_document(flows)
