"""FlowServe's user API: build a Flow of operators over a Table of queries.

from flow import Flow, Table
flow = Flow("demo")
flow.map(lambda r: r.x + 1, names=["y"])
flow.run([{"x": 1}])
"""

from flow import targets
from flow.clipper import CacheSpec, FeedbackError, feedback
from flow.context import cancelled, current_device, current_store, wait
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
from flow.flow import Flow, GroupedNode, Node
from flow.table import Row, Table
from flow.types import ColumnType


def optimize(flow, rules=None, options=None):
    """The optimized physical plan of a flow (see optimizer.optimize)."""
    return targets.planner()(flow, rules=rules, options=options)


__all__ = [
    "CacheSpec",
    "cancelled",
    "ColumnType",
    "current_device",
    "current_store",
    "DataError",
    "DataTypeError",
    "Flow",
    "FeedbackError",
    "feedback",
    "FlowDefinitionError",
    "FlowError",
    "FlowTypeError",
    "FlowValueError",
    "ForeignNodeError",
    "GroupedNode",
    "LookupKeyError",
    "NoValidResultError",
    "Node",
    "OperatorError",
    "OperatorFailedError",
    "OperatorOutputError",
    "RejectRow",
    "RetryableError",
    "Row",
    "RowRejectedError",
    "SchemaError",
    "SinkError",
    "Table",
    "UnknownColumnError",
    "optimize",
    "wait",
]
