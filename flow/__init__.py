"""FlowServe's user API: build a Flow of operators over a Table of queries.

    from flow import Flow, Table
    flow = Flow("demo")
    flow.map(lambda r: r.x + 1, names=["y"])
    flow.run([{"x": 1}])
"""

from flow.exceptions import (
    DataError,
    DataTypeError,
    FlowDefinitionError,
    FlowError,
    FlowTypeError,
    FlowValueError,
    ForeignNodeError,
    LookupKeyError,
    NoValidResultError,
    OperatorError,
    OperatorFailedError,
    OperatorOutputError,
    RejectRow,
    RetryableError,
    RowRejectedError,
    SchemaError,
    SinkError,
    UnknownColumnError,
)
from flow.context import current_store


def current_device() -> str:
    """Where operator code should put its models: "cuda" on a gpu executor with a GPU, else "cpu"."""
    from executors.gpu import current_device as _current_device

    return _current_device()

from flow.flow import Flow, GroupedNode, Node
from flow.table import Row, Table
from flow.types import ColumnType


def optimize(flow, rules=None, options=None):
    """The optimized physical plan of a flow (see optimizer.optimize)."""
    from optimizer import optimize as _optimize

    return _optimize(flow, rules=rules, options=options)


__all__ = [
    "ColumnType", "current_device", "current_store", "DataError", "DataTypeError", "Flow", "FlowDefinitionError", "FlowError",
    "FlowTypeError", "FlowValueError", "ForeignNodeError", "GroupedNode", "LookupKeyError",
    "NoValidResultError", "Node", "OperatorError", "OperatorFailedError", "OperatorOutputError",
    "RejectRow", "RetryableError", "Row", "RowRejectedError", "SchemaError", "SinkError", "Table",
    "UnknownColumnError", "optimize",
]
