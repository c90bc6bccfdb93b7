"""Runtime errors, and the HTTP status each error gives a client.

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
    if isinstance(error, (NoExecutorError, RetryableError)):
        return 503  # e.g. the KVS is restarting: the same request may succeed shortly
    return 500
