"""One exception tree for the whole project, grouped by what the caller can do.

    FlowError                         root of everything FlowServe raises on purpose
    ├── FlowDefinitionError           the flow script is wrong: fix the script
    │   ├── FlowTypeError             (also TypeError) a non-callable, a wrong argument type
    │   ├── FlowValueError            (also ValueError) a bad argument value
    │   │   ├── UnknownColumnError    an operator names a column its input does not have
    │   │   └── SinkError             no sink, or several sinks that are never merged
    │   └── ForeignNodeError          a node of another Flow was used
    ├── DataError                     the input data is wrong: fix the request
    │   ├── SchemaError               (also ValueError) duplicate/reserved/missing columns
    │   └── DataTypeError             (also TypeError) a value of the wrong type, a ragged tensor
    ├── OperatorError                 a user operator failed at run time (carries operator, qid)
    │   ├── OperatorFailedError       the user function raised
    │   ├── OperatorOutputError       it returned the wrong arity or type
    │   ├── RowRejectedError          it rejected the row on purpose (raise RejectRow)
    │   ├── NoValidResultError        anyof: no alternative produced a valid result
    │   └── LookupKeyError            (also KeyError) a lookup key is missing from the KVS
    └── RetryableError                mixin: the same call may succeed later (connection loss)

Other packages root their families here too (``kvs.KVSError``, ``optimizer.PlanError``,
``executors.ClusterError``, ``k8s.K8sError``), so ``except FlowError`` catches everything
of ours.
"""

from __future__ import annotations


class FlowError(Exception):
    """Root of every error FlowServe raises on purpose."""


class RetryableError(FlowError):
    """The same call may succeed if tried again later (a lost connection, a restart)."""


# -- bad flow definitions -----------------------------------------------------------


class FlowDefinitionError(FlowError):
    """The flow script is wrong; the message names the operator."""


class FlowTypeError(FlowDefinitionError, TypeError):
    """An argument of an operator has the wrong type (e.g. a non-callable)."""


class FlowValueError(FlowDefinitionError, ValueError):
    """An argument of an operator has a wrong value."""


class UnknownColumnError(FlowValueError):
    """An operator names a column that its input does not have."""


class SinkError(FlowValueError):
    """The flow has no sink, or several sinks that are never joined or unioned."""


class ForeignNodeError(FlowDefinitionError):
    """A node that belongs to another Flow was passed to an operator."""


# -- bad input data -----------------------------------------------------------------


class DataError(FlowError):
    """The input data does not fit: the message names the column."""


class SchemaError(DataError, ValueError):
    """Duplicate, reserved, missing or unexpected columns."""


class DataTypeError(DataError, TypeError):
    """A value of the wrong type, or a tensor column whose rows differ in shape."""


# -- operators failing at run time --------------------------------------------------


class OperatorError(FlowError):
    """A user operator failed while running; carries the operator name and the qid."""

    def __init__(self, message: str, *, operator: str | None = None, qid: int | None = None):
        super().__init__(message)
        self.operator = operator
        self.qid = qid

    def __reduce__(self):  # keep operator and qid across processes
        return (_rebuild_operator_error, (type(self), self.args[0], self.operator, self.qid))


def _rebuild_operator_error(cls, message, operator, qid):
    return cls(message, operator=operator, qid=qid)


class OperatorFailedError(OperatorError):
    """The user's function raised an exception."""


class OperatorOutputError(OperatorError):
    """The user's function returned the wrong number of values or an unsupported type."""


class RowRejectedError(OperatorError):
    """The user's function rejected the row on purpose by raising ``RejectRow``."""


class NoValidResultError(OperatorError):
    """``anyof``: none of the alternatives produced a result that ``valid`` accepts."""


class LookupKeyError(OperatorError, KeyError):
    """A ``lookup`` key is missing from the store and ``missing="error"``."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class RejectRow(Exception):
    """Raise inside an operator to reject the current row as invalid input.

    The runtime answers such a query with HTTP 422 instead of 500.

        def parse(row):
            if row.age < 0:
                raise RejectRow("age must be >= 0")
            return row.age
    """
