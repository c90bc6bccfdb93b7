"""One HTTP error mapping (executors/errors.py): every error answer the gateway gives,
on its fast invoke path and on its Starlette routes, is made there."""

from __future__ import annotations

import json

import pytest

from executors.codec.bodies import UnencodableError
from executors.errors import (
    EDGE_STATUS,
    BadRequestError,
    ClusterStartError,
    DeployConflictError,
    DeployError,
    NoExecutorError,
    OperatorCrashedError,
    OperatorTimeoutError,
    RequestTooLargeError,
    encode_error,
    error_doc,
    error_for_answer,
    http_error,
    http_error_for,
    status_for,
)
from flow.configuration import ConfigError
from flow.errors import (
    AccessDeniedError,
    DataError,
    DeadlineExceededError,
    FlowError,
    FlowValueError,
    InternalError,
    LookupKeyError,
    NoValidResultError,
    OperatorError,
    OperatorFailedError,
    OperatorOutputError,
    RetryableError,
    RowRejectedError,
    SchemaError,
    UnavailableError,
    UnreachableError,
)
from kvs.errors import KeyNotFoundError, StoreLostError, StoreWriteError


@pytest.mark.parametrize(
    "error, status",
    [
        (SchemaError("bad column"), 400),
        (BadRequestError("not JSON"), 400),
        (UnencodableError("NaN in a tensor"), 400),
        (RowRejectedError("no", operator="op"), 422),
        (NoValidResultError("none", operator="op"), 422),
        (LookupKeyError("k", operator="op"), 422),
        (OperatorFailedError("raised", operator="op"), 500),
        (OperatorOutputError("arity", operator="op"), 500),
        (OperatorCrashedError("poison"), 500),
        (DeployError("build failed"), 500),
        (ConfigError("bad field"), 500),
        (InternalError("a bug"), 500),
        (DeployConflictError("lost", version=1, winner=2), 409),
        (NoExecutorError("none alive"), 503),
        (UnavailableError("retired"), 503),
        (UnreachableError("down", url="redis://kvs"), 503),
        (StoreLostError("lost"), 503),
        (StoreWriteError("disk full"), 503),
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


# -- the client's side: the answer back into the class the server named -------------------


@pytest.mark.parametrize(
    "error",
    [
        SchemaError("column 'x': expected int"),
        RowRejectedError("operator 'p' rejected the row", operator="p", qid=3),
        OperatorFailedError("operator 'p' raised ValueError: no", operator="p", qid=4),
        OperatorTimeoutError("operator 'slow' still running at the deadline", operator="slow", qid=5),
        NoExecutorError("no live executor hosts stage 'a'"),
        UnreachableError("Redis at redis://kvs:6379/0 unreachable"),
        StoreLostError("the KVS lost its data"),
        InternalError("Redis rejected GET"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_client_raises_the_class_the_server_answered(error):
    status, body = http_error_for(error)
    got = error_for_answer(status, json.loads(body), f"flow 'f' answered {status}: {error}")
    assert type(got) is type(error) and (got.status, got.body) == (status, json.loads(body))
    assert (got.operator, got.qid) == (error.operator, error.qid)
    assert isinstance(got, FlowError) and str(got) == f"flow 'f' answered {status}: {error}"


def test_a_class_that_takes_no_message_first_is_built_too():
    got = error_for_answer(404, {"error": "KeyNotFoundError", "message": "key 'k' not found"}, "said")
    assert type(got) is KeyNotFoundError and str(got) == "said" and got.key is None


@pytest.mark.parametrize(
    "status, name, cls",
    [
        (504, "RequestTimeout?", DeadlineExceededError),
        (503, "ShuttingDown", UnavailableError),
        (503, "TooManyConnections", UnavailableError),
        (429, None, UnavailableError),
        (503, "NoExecutor", NoExecutorError),
        (409, "DeployConflict", DeployConflictError),
        (401, "Unauthorized", AccessDeniedError),
        (404, "UnknownFlow", BadRequestError),
        (413, "PayloadTooLarge", RequestTooLargeError),
        (413, "TooManyRows", RequestTooLargeError),
        (400, "ValueError", BadRequestError),  # not a class of ours: never imported, by status
        (500, "InternalError", InternalError),
        (500, "ZeroDivisionError", InternalError),
        (502, None, InternalError),
    ],
)
def test_names_the_tree_does_not_have_go_by_status(status, name, cls):
    body = {"message": "why"} if name is None else {"error": name, "message": "why"}
    got = error_for_answer(status, body, "m")
    assert type(got) is cls and got.status == status
    assert isinstance(got, RetryableError) is (status in (503, 429, 409))
    assert isinstance(got, DataError) is (status in (400, 404, 413))


def test_a_500_naming_an_operator_is_the_operators():
    got = error_for_answer(500, {"error": "KeyError", "message": "m", "operator": "net", "qid": 1}, "m")
    assert type(got) is OperatorError and (got.operator, got.qid) == ("net", 1)


def test_the_registry_holds_only_the_trees_classes():
    assert type(error_for_answer(400, {"error": "FlowError", "message": "m"}, "m")) is FlowError
    assert type(error_for_answer(400, {"error": "ClusterStartError", "message": "m"}, "m")) is ClusterStartError
    for name in ("RequestFailed", "Exception", "SystemExit", "os.system", "__class__", 3, None):
        assert type(error_for_answer(400, {"error": name, "message": "m"}, "m")) is BadRequestError
    assert type(error_for_answer(400, ["not", "a", "dict"], "m")) is BadRequestError
    assert type(error_for_answer(400, {"error": "FlowValueError", "message": "m"}, "m")) is FlowValueError


def test_error_bodies_are_bounded_whatever_they_quote():
    """A message quoting a 20 MB lookup key is cut to its start and end with a note of
    what was cut, in every body: one made here, and one an executor made (``encode_error``)."""
    key = "k" * 20_000_000
    message = f"operator 'lookup(key)': key {key!r} is not in the store (qid 7)"
    status, body = http_error_for(LookupKeyError(message, operator="lookup(key)", qid=7))
    doc = json.loads(body)
    assert status == 422 and len(body) < 3000 and doc["operator"] == "lookup(key)" and doc["qid"] == 7
    assert doc["message"].startswith("operator 'lookup(key)': key 'kkk") and doc["message"].endswith("store (qid 7)")
    assert f"...[{len(message) - 2000 + 40} characters cut]..." in doc["message"]
    relayed = encode_error({"error": "LookupKeyError", "message": message, "qid": 7})  # a Failure's body
    assert len(relayed) < 3000 and json.loads(relayed)["message"] == doc["message"]
    assert error_doc("E", "short")["message"] == "short"


def test_a_request_over_a_size_limit_is_413():
    assert http_error_for(RequestTooLargeError("too big"))[0] == 413
    assert isinstance(RequestTooLargeError("x"), BadRequestError)
