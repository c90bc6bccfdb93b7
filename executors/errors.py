"""Runtime errors, and the HTTP answer each error gives a client: the one place that
turns an exception (``http_error_for``) or an error the HTTP edge names itself
(``http_error``: a missing token, an unknown flow, a body too large) into a status and
the JSON body ``{"error": <name>, "message": ..., "operator"?, "qid"?, "winner"?}``.
The gateway's two paths (the bare-ASGI invoke path and Starlette's routes), the HTTP
protocol limits and the executors' error messages all answer through it.

    ClusterError                   the runtime itself (rooted at flow.FlowError)
    ├── ClusterStartError          the local cluster did not come up (message has the log tail)
    ├── DeployError                a flow could not be deployed (names the flow and stage)
    │   └── DeployConflictError    a concurrent deploy of the same flow won (409; names both versions)
    ├── NoExecutorError            (retryable) no live executor can run a stage   -> 503
    ├── DeadlineExceededError      (retryable) the request's deadline passed       -> 504
    │   └── OperatorTimeoutError   an operator was still running at its timeout_s or the
    │                              request's deadline; its work was abandoned        -> 504
    ├── OperatorCrashedError       the request's attempts crashed two executors: it is not
    │                              retried again (a poison input)                   -> 500
    ├── FlowUnavailableError       (retryable) an executor cannot run a flow version: it was
    │                              retired (redeployed, undeployed), or its plan is gone from
    │                              the store                                       -> 503
    └── InvocationError            an HTTP call to a deployed flow failed; carries .status and
                                   .body (the server's JSON error)
"""

from __future__ import annotations

import json

from flow.exceptions import (
    DataError,
    FlowError,
    LookupKeyError,
    NoValidResultError,
    OperatorError,
    RetryableError,
    RowRejectedError,
)


class ClusterError(FlowError):
    """Something in the runtime (cluster, gateway, executors) went wrong."""


class ClusterStartError(ClusterError):
    """The local cluster did not start; the message includes the tail of its log."""


class DeployError(ClusterError, ValueError):
    """A flow could not be deployed."""


class DeployConflictError(DeployError):
    """A concurrent deploy of the same flow name won: this one is not served (HTTP 409).

    ``version`` is this deploy's version, ``winner`` the one served instead."""

    def __init__(self, message: str, version: int | None = None, winner: int | None = None):
        super().__init__(message)
        self.version, self.winner = version, winner


class NoExecutorError(ClusterError, RetryableError):
    """No live executor can run a stage right now."""


class DeadlineExceededError(ClusterError, RetryableError):
    """The request's deadline passed before it was answered."""


class OperatorTimeoutError(DeadlineExceededError):
    """An operator did not finish within its ``timeout_s`` or the request's deadline."""

    def __init__(self, message: str, *, operator: str | None = None, qid: int | None = None):
        super().__init__(message)
        self.operator = operator
        self.qid = qid


class OperatorCrashedError(ClusterError):
    """A request's attempts crashed two executors (a poison input): not retried again."""

    def __init__(self, message: str, *, operator: str | None = None, qid: int | None = None):
        super().__init__(message)
        self.operator = operator
        self.qid = qid


class FlowUnavailableError(ClusterError, RetryableError):
    """An executor was asked to run a flow version it cannot run: the version was retired
    (a newer one replaced it, or it was undeployed), or its plan is gone from the store."""


class InvocationError(ClusterError):
    """An HTTP call to a deployed flow failed; ``status`` and ``body`` say how."""

    def __init__(self, message: str, status: int, body: dict | None = None):
        super().__init__(message)
        self.status = status
        self.body = body or {}


def status_for(error: BaseException) -> int:
    """The HTTP status for an error raised while answering a request."""
    if isinstance(error, (RowRejectedError, NoValidResultError, LookupKeyError)):
        return 422  # the operator could not give a valid answer for this input
    if isinstance(error, OperatorError):
        return 500
    if isinstance(error, DataError):
        return 400
    if isinstance(error, DeadlineExceededError):
        return 504
    if isinstance(error, OperatorCrashedError):
        return 500
    if isinstance(error, DeployConflictError):
        return 409
    if isinstance(error, (NoExecutorError, RetryableError)):
        return 503  # e.g. the KVS is restarting: the same request may succeed shortly
    return 500


# Errors the HTTP edge answers by name: conditions it finds itself, not exceptions raised
# below it (those go through ``status_for``). Any other name answers 500.
EDGE_STATUS = {
    "Unauthorized": 401,  # missing or wrong bearer token
    "UnknownFlow": 404,  # no deployed flow of that name
    "UnknownPlan": 404,  # a deploy named a flow version that is not registered
    "NotFound": 404,  # no such route
    "MethodNotAllowed": 405,
    "RequestTimeout": 408,  # the request head or body came too slowly
    "DeployConflict": 409,  # a newer version of the flow won a concurrent deploy
    "PayloadTooLarge": 413,
    "TooManyRows": 413,
    "HeadersTooLarge": 431,
    "InternalError": 500,  # a bug: the handler raised something unexpected
    "ShuttingDown": 503,  # a graceful stop is draining the gateway: retry
    "NoExecutor": 503,  # no executor answers to build a flow on (they are being restarted)
    "StoreUnavailable": 503,  # the store refused a write a deploy needs (its disk is full or read-only)
    "TooManyConnections": 503,
}

JSON_CONTENT_TYPE = (b"content-type", b"application/json")


def status_for_name(error: str) -> int:
    """The HTTP status of an error the edge answers by name (``EDGE_STATUS``; else 500)."""
    return EDGE_STATUS.get(error, 500)


def error_doc(error: str, message: str, **extra) -> dict:
    """The JSON error body: ``error`` and ``message``, and the extras that are set
    (``operator``, ``qid``, ``winner``)."""
    doc = {"error": error, "message": message}
    doc.update((k, v) for k, v in extra.items() if v is not None)
    return doc


def error_doc_for(error: BaseException) -> dict:
    """The JSON error body for an exception: its class name, its message, and the
    operator and qid it names (OperatorError, OperatorTimeoutError ...)."""
    return error_doc(
        type(error).__name__, str(error), operator=getattr(error, "operator", None), qid=getattr(error, "qid", None)
    )


def encode_error(doc: dict) -> bytes:
    """An error body as the bytes sent (compact JSON)."""
    return json.dumps(doc, separators=(",", ":")).encode()


def http_error(error: str, message: str, *, status: int | None = None, **extra) -> tuple[int, bytes]:
    """(status, body) for an error the HTTP edge names itself (``EDGE_STATUS``; ``status``
    only where the status comes from elsewhere, e.g. Starlette's own HTTP exceptions).

        >>> http_error("ShuttingDown", "retry shortly")
        (503, b'{"error":"ShuttingDown","message":"retry shortly"}')
    """
    return (status_for_name(error) if status is None else status), encode_error(error_doc(error, message, **extra))


def http_error_for(error: BaseException) -> tuple[int, bytes]:
    """(status, body) for an exception raised while answering a request (``status_for``)."""
    return status_for(error), encode_error(error_doc_for(error))
