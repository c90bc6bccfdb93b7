"""One exception tree for the whole project, grouped by what the caller can do.

Every error FlowServe raises on purpose is a ``FlowError``, and its branch says what to do
about it (redis-py's model: retryable connection errors apart from bad requests). Each class
has one parent in the tree; ``(TypeError)``, ``(ValueError)``, ``(KeyError)`` ... below are
the builtin bases it also has, so ``except ValueError`` keeps working where Python's own
protocols expect it. The leaves live beside the code that raises them (``kvs/``,
``executors/errors.py``, ``k8s/``, ``optimizer/slo/``); the branches live here.

    FlowError                        root: ``except FlowError`` catches everything of ours
    ├── FlowDefinitionError          FIX THE FLOW OR ITS SETUP: the same call fails until what you
    │   │                            wrote (script, options, config, install) changes    -> 500
    │   ├── FlowTypeError            (TypeError) an argument of the wrong type
    │   │   └── SerializationError   (TypeError) the store's codec refuses a value, or refuses
    │   │                            to read bytes (unknown tag, a plan signed by another key)
    │   ├── FlowValueError           (ValueError) an argument with a wrong value: an unknown
    │   │   │                        column, no sink, another flow's node, a bad plan, rule,
    │   │   │                        SLO, manifest or URI
    │   │   ├── ConfigError          a config field (ClusterConfig, KVSOptions, KubeConfig,
    │   │   │   │                    AutoscalingConfig, OptimizerOptions ...), an option, a flag
    │   │   │   └── ConfigTypeError  (TypeError) a config field of the wrong type
    │   │   └── InfeasibleSLOError   no configuration meets the SLO: relax it or speed up ``.stage``
    │   ├── AccessDeniedError        credentials missing or refused: a Redis password, AWS
    │   │                            keys, Kubernetes RBAC, the cluster's admin token
    │   ├── NotInstalledError        (ImportError) a package, binary or entry point is missing
    │   ├── DeployError              the cluster could not build the flow (a constructor raised)
    │   ├── ClusterNotOwnedError     stop() of a cluster this process did not start (`flowserve down`)
    │   ├── ArtifactNotFoundError    (FileNotFoundError) kvs.fetch: no such object, bucket, file
    │   └── K8sNotFoundError         a Kubernetes object or namespace does not exist
    ├── DataError                    FIX THE REQUEST: the input does not fit; the same request
    │   │                            fails again                                    -> 4xx
    │   ├── BadRequestError          (ValueError) not JSON/Arrow, over a limit; the client's
    │   │   │                        class for any 4xx answer it cannot name      -> 400 (4xx)
    │   │   └── RequestTooLargeError a body, its rows or their memory over a limit   -> 413
    │   ├── SchemaError              (ValueError) duplicate/reserved/missing columns  -> 400
    │   ├── DataTypeError            (TypeError) a value of the wrong type, a ragged tensor -> 400
    │   ├── RowRejectedError         an operator rejected the row (``raise RejectRow``) -> 422
    │   ├── NoValidResultError       anyof: no alternative gave a valid result        -> 422
    │   ├── LookupKeyError           (KeyError) a lookup key is missing from the store -> 422
    │   ├── KeyNotFoundError         (KeyError) ``KVS.get`` of a missing key, no default
    │   ├── FeedbackError            (ValueError) feedback for an unknown qid, or a bad reward
    │   ├── RolloutStateError        (ValueError) promote/rollback with nothing to act on,
    │   │                            a second canary while one runs                 -> 409
    │   └── UnencodableError         (ValueError) an answer JSON cannot carry: ask for Arrow
    ├── OperatorError                FIX THE OPERATOR: user code failed on this input (.operator,
    │   │                            .qid name it; retrying the input fails again)   -> 500
    │   ├── OperatorFailedError      the user's function raised
    │   ├── OperatorOutputError      it returned the wrong arity or type
    │   └── OperatorCrashedError     the input crashed two executors: it is not run again
    ├── RetryableError               RETRY: the same call may succeed shortly         -> 503
    │   ├── UnreachableError         a connection failed or broke (the gateway, the KVS, the
    │   │                            Kubernetes API, an artifact store): a call already sent
    │   │                            may have run
    │   ├── UnavailableError         the service cannot take the call now (overloaded, stopping,
    │   │   │                        a flow version retired); the call did not run
    │   │   └── ExecutorLost         (the gateway's own) an executor died while a deploy waited
    │   ├── NoExecutorError          no live executor can run a stage yet (they are restarting)
    │   ├── StoreLostError           the store restarted empty: retry once the data is back
    │   ├── StoreWriteError          the store refuses writes (disk full or read-only, OOM)
    │   ├── DeployConflictError      a newer deploy of the flow won (409): deploy again to win
    │   └── K8sConflictError         a Kubernetes object changed meanwhile (409)
    ├── DeadlineExceededError        WAIT OR GIVE UP: the deadline passed; retry only with a
    │   │                            longer one (``X-Request-Timeout``, ``wait_s``)  -> 504
    │   └── OperatorTimeoutError     an operator was still running at its timeout_s or the deadline
    └── InternalError                REPORT IT: FlowServe or its machine failed; nothing in the
        │                            request or the flow to fix                      -> 500
        ├── ClusterStartError        the local cluster did not start (message: its log's tail)
        └── WireError                (ValueError) a malformed message between FlowServe's processes

What you pass as keywords names what failed and becomes attributes (``operator``, ``qid``,
``url``, ``uri``, ``verb``, ``kind`` ...), kept when the error crosses a process (pickle).
An error the client raises for a server's answer (``Deployment.invoke``, ``ClusterClient``)
is the class the answer names, with ``.status`` (the HTTP status) and ``.body`` (its JSON).

``RejectRow`` is not an error FlowServe raises but one a user raises inside an operator; the
runtime turns it into ``RowRejectedError``, so no caller ever sees it.
"""

from __future__ import annotations

from typing import Any


class FlowError(Exception):
    """Root of every error FlowServe raises on purpose.

    Keywords become attributes naming what failed; ``status`` and ``body`` are set on an
    error the client raised for a server's HTTP answer (else None)."""

    status: int | None = None  # the HTTP status of the answer this error came from
    body: dict | None = None  # that answer's JSON error body
    operator: str | None = None  # the operator that failed, when known
    qid: int | None = None  # the query (row) it failed on, when known

    def __init__(self, message: str = "", **context: Any):
        super().__init__(message)
        for key, value in context.items():
            setattr(self, key, value)

    # pickling: BaseException's own (the class, args, and __dict__ with the keywords) rebuilds it


# -- the branches --------------------------------------------------------------------


class FlowDefinitionError(FlowError):
    """What was written or set up is wrong (the flow script, an option, a config, the
    installation): the same call fails until it is changed; the message names it."""


class DataError(FlowError):
    """The request does not fit (its data, its schema, its size): fix the request; the
    message names the column. HTTP 4xx."""


class OperatorError(FlowError):
    """A user operator failed on this input; ``operator`` and ``qid`` name it. HTTP 500."""


class RetryableError(FlowError):
    """The same call may succeed if tried again shortly (a lost connection, a restart, an
    overload). HTTP 503."""


class DeadlineExceededError(FlowError):
    """The deadline passed before the call was answered: wait longer (a longer
    ``X-Request-Timeout``) or give up. HTTP 504."""


class InternalError(FlowError):
    """FlowServe or the machine it runs on failed; nothing in the request or the flow to
    fix (read the message and the logs, report it). HTTP 500."""


# -- fix the flow or its setup --------------------------------------------------------


class FlowTypeError(FlowDefinitionError, TypeError):
    """An argument has the wrong type (e.g. a non-callable operator, a non-str key)."""


class FlowValueError(FlowDefinitionError, ValueError):
    """An argument has a wrong value: an unknown column, no sink, a node of another flow,
    a bad plan, rule, option, SLO, manifest or URI; the message quotes it."""


class AccessDeniedError(FlowDefinitionError):
    """Credentials are missing or refused (a Redis password, AWS keys, Kubernetes RBAC, the
    cluster's admin token): fix the credentials or what they are allowed to do."""


class NotInstalledError(FlowDefinitionError, ImportError):
    """A package, binary or entry point the call needs is not installed; the message says
    what to install."""


# -- fix the request -----------------------------------------------------------------


class SchemaError(DataError, ValueError):
    """Duplicate, reserved, missing or unexpected columns."""


class DataTypeError(DataError, TypeError):
    """A value of the wrong type, or a tensor column whose rows differ in shape."""


class RowRejectedError(DataError):
    """A user operator rejected the row on purpose (it raised ``RejectRow``). HTTP 422."""


class NoValidResultError(DataError):
    """``anyof``: none of the alternatives produced a result that ``valid`` accepts. HTTP 422."""


class LookupKeyError(DataError, KeyError):
    """A ``lookup`` key is missing from the store and ``missing="error"``. HTTP 422."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


# -- fix the operator ----------------------------------------------------------------


class OperatorFailedError(OperatorError):
    """The user's function raised an exception."""


class OperatorOutputError(OperatorError):
    """The user's function returned the wrong number of values or an unsupported type."""


# -- retry ---------------------------------------------------------------------------


class UnreachableError(RetryableError):
    """A connection failed or broke (the gateway, the KVS, the Kubernetes API, an artifact
    store did not answer); ``url`` names where when known. A call already sent may have run."""


class UnavailableError(RetryableError):
    """The service answered that it cannot take the call now (overloaded, stopping, the
    flow version retired); the call did not run: retry after a moment."""


# -- raised by users, never seen by callers ------------------------------------------


class RejectRow(Exception):
    """Raise inside an operator to reject the current row as invalid input.

    The runtime answers such a query with HTTP 422 (``RowRejectedError``) instead of 500.

        def parse(row):
            if row.age < 0:
                raise RejectRow("age must be >= 0")
            return row.age
    """
