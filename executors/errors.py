"""Runtime errors, and the HTTP answer each error gives a client and back: the one place
that turns an exception (``http_error_for``) or an error the HTTP edge names itself
(``http_error``: a missing token, an unknown flow, a body too large) into a status and the
JSON body ``{"error": <name>, "message": ..., "operator"?, "qid"?, "winner"?}``, and the
one place the client turns such an answer back into an exception (``error_for_answer``).
The gateway's two paths (the bare-ASGI invoke path and Starlette's routes), the HTTP
protocol limits and the executors' error messages all answer through it.

The runtime's own leaves of the one tree (``flow.errors`` draws all of it):

    BadRequestError        (DataError, ValueError) a body that is not rows of the flow's
                           input, a deploy that asks too much; the client's class for a
                           4xx answer that names no class of the tree            -> 400
    RequestTooLargeError   (BadRequestError) a body, its rows, or the memory its rows
                           would take, over the gateway's limits                  -> 413
    DeployError            (FlowDefinitionError) the executors could not build a flow
                           (names the flow and the stages' errors)              -> 500
    DeployConflictError    (RetryableError) a concurrent deploy of a newer version of the
                           same flow won (names both versions; deploy again to win) -> 409
    RolloutStateError      (DataError, ValueError) a promote or rollback with nothing to act
                           on, a second canary while one is in progress           -> 409
    NoExecutorError        (RetryableError) no live executor can run a stage yet -> 503
    OperatorTimeoutError   (DeadlineExceededError) an operator was still running at its
                           timeout_s or the request's deadline; its work was abandoned -> 504
    OperatorCrashedError   (OperatorError) the request's attempts crashed two executors:
                           it is not retried again (a poison input)               -> 500
    ClusterStartError      (InternalError) the local cluster did not come up (log tail)
    ClusterNotOwnedError   (FlowDefinitionError) stop() of a cluster this process did not
                           start (a `flowserve up` one it connected to)
"""

from __future__ import annotations

import json

from flow.errors import (
    AccessDeniedError,
    DataError,
    DeadlineExceededError,
    FlowDefinitionError,
    FlowError,
    InternalError,
    LookupKeyError,
    NoValidResultError,
    OperatorError,
    RetryableError,
    RowRejectedError,
    UnavailableError,
)


class BadRequestError(DataError, ValueError):
    """The request is wrong: a body that is not valid JSON/Arrow or not rows of the flow's
    input, a deploy asking for more than the cluster allows. The client raises it for a 4xx
    answer that names no class of the tree (``.status`` says which)."""


class RequestTooLargeError(BadRequestError):
    """A request over the gateway's limits (HTTP 413): a body over ``max_body_bytes``,
    more rows than ``max_rows``, or rows whose columns would take more memory than a body
    at the limit makes (a column of nulls takes no bytes in a body, and 256 KiB in a
    (256, 256) float32 tensor column). Send fewer rows a request."""


class DeployError(FlowDefinitionError):
    """The executors could not build a flow (an operator's constructor raised, a plan was
    refused); the message names the flow and each failed stage's error."""


class DeployConflictError(RetryableError):
    """A concurrent deploy of the same flow name won: this one is not served (HTTP 409).
    ``version`` is this deploy's version, ``winner`` the one served instead; deploying
    again makes a newer version, which wins."""

    version: int | None = None
    winner: int | None = None


class RolloutStateError(DataError, ValueError):
    """A rollout action the flow's state does not allow (HTTP 409): promoting or rolling
    back a flow with no canary or shadow in progress (or no earlier version recorded), a
    canary while another is in progress. The same call fails until the state changes."""


class NoExecutorError(RetryableError):
    """No live executor can run a stage right now (they are being restarted)."""


class OperatorTimeoutError(DeadlineExceededError):
    """An operator did not finish within its ``timeout_s`` or the request's deadline
    (``operator`` and ``qid`` name it)."""


class OperatorCrashedError(OperatorError):
    """A request's attempts crashed two executors (a poison input): not retried again."""


class ClusterStartError(InternalError):
    """The local cluster did not start, or none answers where one should run; the message
    includes the tail of its log."""


class ClusterNotOwnedError(FlowDefinitionError):
    """``stop()`` of a cluster this process did not start (``LocalCluster.connect``, or
    ``default_cluster()`` finding the `flowserve up` cluster): it serves others, so it is
    left running. `flowserve down` stops it, as does ``stop(force=True)``; ``release()``
    stops only a cluster this process started."""


def status_for(error: BaseException) -> int:
    """The HTTP status for an error raised while answering a request: its branch of the
    tree says it (``flow.errors``), a few leaves more precisely."""
    if isinstance(error, (RowRejectedError, NoValidResultError, LookupKeyError)):
        return 422  # the operator could not give a valid answer for this input
    if isinstance(error, RolloutStateError):
        return 409  # the flow's rollout state does not allow it
    if isinstance(error, RequestTooLargeError):
        return 413  # send fewer rows a request
    if isinstance(error, DataError):
        return 400  # fix the request
    if isinstance(error, DeadlineExceededError):
        return 504
    if isinstance(error, DeployConflictError):
        return 409
    if isinstance(error, RetryableError):
        return 503  # e.g. the KVS is restarting: the same request may succeed shortly
    return 500  # an operator's error, the flow's or ours: retrying the request does not help
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


# An error body's texts are cut to this many characters: a message quotes what was wrong
# (a missing lookup key, a bad value), and a client must not get a 20 MB key back for it.
MAX_ERROR_CHARS = 2000
_KEPT_TAIL = 300  # of a cut text, its end is kept too: it often says where (operator, qid)


def bounded(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` if it has at most ``limit`` characters, else its start and its end around
    a note of how many were cut."""
    if len(text) <= limit:
        return text
    cut = len(text) - limit + 40  # room for the note
    head = limit - 40 - _KEPT_TAIL
    return f"{text[:head]} ...[{cut} characters cut]... {text[-_KEPT_TAIL:]}"


def error_doc(error: str, message: str, **extra) -> dict:
    """The JSON error body: ``error`` and ``message``, and the extras that are set
    (``operator``, ``qid``, ``winner``); every text in it ``bounded``. Every error body a
    client gets passes here (``encode_error`` too), so none is longer than that."""
    doc = {"error": bounded(str(error), 200), "message": bounded(str(message))}
    doc.update((k, bounded(v, 200) if isinstance(v, str) else v) for k, v in extra.items() if v is not None)
    return doc


def error_doc_for(error: BaseException) -> dict:
    """The JSON error body for an exception: its class name, its message, and the
    operator and qid it names (OperatorError, OperatorTimeoutError ...)."""
    return error_doc(
        type(error).__name__, str(error), operator=getattr(error, "operator", None), qid=getattr(error, "qid", None)
    )


def encode_error(doc: dict) -> bytes:
    """An error body as the bytes sent (compact JSON), its texts bounded (``error_doc``):
    bodies made elsewhere (an executor's ``Failure``) come here too."""
    doc = dict(doc)
    return json.dumps(
        error_doc(doc.pop("error", "InternalError"), doc.pop("message", ""), **doc), separators=(",", ":")
    ).encode()


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


# -- the client's side: an answer back into an exception -----------------------------

PACKAGES = ("flow", "optimizer", "kvs", "executors", "k8s")  # whose classes make the tree

# Names the edge answers that stand for a class of the tree (the others go by status)
EDGE_ERRORS: dict[str, type[FlowError]] = {
    "Unauthorized": AccessDeniedError,  # fix the token
    "PayloadTooLarge": RequestTooLargeError,  # send fewer rows a request
    "TooManyRows": RequestTooLargeError,
    "DeployConflict": DeployConflictError,
    "NoExecutor": NoExecutorError,
}


def tree_classes() -> dict[str, type[FlowError]]:
    """Every class of the tree loaded in this process, by name: ``FlowError`` and what
    derives from it in the project's packages (a name is one class:
    tests/flow/test_exceptions.py). An answer's ``error`` is looked up here, never imported."""
    found: dict[str, type[FlowError]] = {}
    todo: list[type[FlowError]] = [FlowError]
    while todo:
        cls = todo.pop()
        if cls.__module__.split(".")[0] in PACKAGES:
            found.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return found


def class_for_status(status: int, body: dict | None = None) -> type[FlowError]:
    """The class of an error answer that names none of the tree's: 504 a deadline, 503
    and 429 a retryable refusal, another 4xx a bad request, else ours (or the operator's,
    when the answer names one)."""
    if status == 504:
        return DeadlineExceededError
    if status in (503, 429):
        return UnavailableError
    if 400 <= status < 500:
        return BadRequestError
    if body and body.get("operator") is not None:
        return OperatorError
    return InternalError


def error_for_answer(status: int, body: dict | None, message: str) -> FlowError:
    """The exception a client raises for an HTTP error answer: the class of the tree the
    body's ``error`` names (``tree_classes``; an edge name in ``EDGE_ERRORS``), else the
    one ``class_for_status`` picks; with ``.status``, ``.body``, and the ``operator``,
    ``qid``, ``winner`` the body names.

        >>> e = error_for_answer(504, {"error": "OperatorTimeoutError", "message": "slow"}, "flow 'f': slow")
        >>> type(e).__name__, e.status, isinstance(e, DeadlineExceededError)
        ('OperatorTimeoutError', 504, True)
    """
    body = body if isinstance(body, dict) else {}
    name = body.get("error")
    cls = None
    if isinstance(name, str):
        cls = tree_classes().get(name) or EDGE_ERRORS.get(name)
    if cls is None:
        cls = class_for_status(status, body)
    context = {k: body[k] for k in ("operator", "qid", "winner") if body.get(k) is not None}
    # built without the class's own __init__ (KeyNotFoundError's takes a key, not a
    # message): BaseException.__new__ keeps the message, the root sets the rest
    error = cls.__new__(cls, message)
    FlowError.__init__(error, message, status=status, body=body, **context)
    return error
