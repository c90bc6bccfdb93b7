"""FlowServe's user API: build a Flow of operators over a Table of queries.

from flow import Flow, Table
flow = Flow("demo")
flow.map(lambda r: r.x + 1, names=["y"])
flow.run([{"x": 1}])
"""

from flow import targets
from flow.configuration import ConfigError, ConfigTypeError
from flow.context import cancelled, current_device, current_store, deadline, wait
from flow.errors import (
    AccessDeniedError,
    DataError,
    DataTypeError,
    DeadlineExceededError,
    FlowDefinitionError,
    FlowError,
    FlowTypeError,
    FlowValueError,
    InternalError,
    LookupKeyError,
    NotInstalledError,
    NoValidResultError,
    OperatorError,
    OperatorFailedError,
    OperatorOutputError,
    RejectRow,
    RetryableError,
    RowRejectedError,
    SchemaError,
    UnavailableError,
    UnreachableError,
)
from flow.flow import Flow, GroupedNode, Node
from flow.prediction import CacheSpec, FeedbackError, feedback
from flow.table import Row, Table
from flow.types import ColumnType


def optimize(flow, rules=None, options=None):
    """The optimized physical plan of a flow (see optimizer.optimize)."""
    return targets.planner()(flow, rules=rules, options=options)


__all__ = [
    "AccessDeniedError",
    "ConfigError",
    "ConfigTypeError",
    "DeadlineExceededError",
    "InternalError",
    "NotInstalledError",
    "UnavailableError",
    "UnreachableError",
    "CacheSpec",
    "cancelled",
    "ColumnType",
    "current_device",
    "current_store",
    "DataError",
    "deadline",
    "DataTypeError",
    "Flow",
    "FeedbackError",
    "feedback",
    "FlowDefinitionError",
    "FlowError",
    "FlowTypeError",
    "FlowValueError",
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
    "Table",
    "optimize",
    "wait",
]
