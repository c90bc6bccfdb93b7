"""One HTTP error mapping (executors/errors.py): every error answer the gateway gives,
on its fast invoke path and on its Starlette routes, is made there."""

from __future__ import annotations

import json

import pytest

from executors.errors import (
    EDGE_STATUS,
    DeadlineExceededError,
    DeployConflictError,
    DeployError,
    FlowUnavailableError,
    NoExecutorError,
    OperatorCrashedError,
    OperatorTimeoutError,
    error_doc,
    http_error,
    http_error_for,
    status_for,
)
from executors.httpcodec import BadRequestError
from flow.exceptions import (
    LookupKeyError,
    NoValidResultError,
    OperatorFailedError,
    OperatorOutputError,
    RowRejectedError,
    SchemaError,
)
from kvs.exceptions import KVSConnectionError, StoreLostError


@pytest.mark.parametrize(
    "error, status",
    [
        (SchemaError("bad column"), 400),
        (BadRequestError("not JSON"), 400),
        (RowRejectedError("no", operator="op"), 422),
        (NoValidResultError("none", operator="op"), 422),
        (LookupKeyError("k", operator="op"), 422),
        (OperatorFailedError("raised", operator="op"), 500),
        (OperatorOutputError("arity", operator="op"), 500),
        (OperatorCrashedError("poison"), 500),
        (DeployError("build failed"), 500),
        (DeployConflictError("lost", version=1, winner=2), 409),
        (NoExecutorError("none alive"), 503),
        (FlowUnavailableError("retired"), 503),
        (KVSConnectionError("down", url="redis://kvs"), 503),
        (StoreLostError("lost"), 503),
        (DeadlineExceededError("late"), 504),
        (OperatorTimeoutError("slow", operator="op"), 504),
        (RuntimeError("a bug"), 500),
    ],
)
def test_each_exception_has_its_status_and_its_body(error, status):
    got, body = http_error_for(error)
    assert got == status == status_for(error)
    doc = json.loads(body)
    assert doc["error"] == type(error).__name__ and doc["message"] == str(error)


def test_the_body_names_the_operator_and_qid_only_when_known():
    _, body = http_error_for(OperatorFailedError("boom", operator="parse", qid=7))
    assert json.loads(body) == {"error": "OperatorFailedError", "message": "boom", "operator": "parse", "qid": 7}
    _, body = http_error_for(NoExecutorError("none"))
    assert json.loads(body) == {"error": "NoExecutorError", "message": "none"}


@pytest.mark.parametrize("name, status", sorted(EDGE_STATUS.items()))
def test_errors_the_edge_names_itself(name, status):
    got, body = http_error(name, "why", winner=None)
    assert got == status and json.loads(body) == {"error": name, "message": "why"}


def test_an_unknown_name_is_a_500_and_a_given_status_wins():
    assert http_error("SomethingNew", "?")[0] == 500
    assert http_error("HTTPError", "teapot", status=418)[0] == 418
    assert error_doc("DeployConflict", "lost", winner=3) == {"error": "DeployConflict", "message": "lost", "winner": 3}


def test_both_gateway_paths_answer_through_errors_py(cluster, http):
    """The fast invoke path (POST) and a Starlette route (GET) of the same unknown flow:
    the same JSON error format, status and content type."""
    fast = http.post(cluster.url + "/flows/no-such-flow", json={"x": 1})
    routed = http.get(cluster.url + "/flows/no-such-flow")
    for r in (fast, routed):
        assert r.status_code == EDGE_STATUS["UnknownFlow"] == 404
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error"] == "UnknownFlow" and "'no-such-flow'" in r.json()["message"]
    missing = http.get(cluster.url + "/no/such/route")
    assert missing.status_code == 404 and missing.json()["error"] == "NotFound"
    wrong = http.put(cluster.url + "/healthz")
    assert wrong.status_code == 405 and wrong.json()["error"] == "MethodNotAllowed"
