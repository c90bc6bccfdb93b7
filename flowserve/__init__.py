"""FlowServe's public API in one import: ``import flowserve as fs``.

    import flowserve as fs

    flow = fs.Flow("demo", schema={"x": int})
    flow.map(lambda r: r.x + 1, names=["y"])
    flow.run([{"x": 1}])                       # in-process: what the flow means
    print(flow.explain())                      # the optimized physical plan
    d = flow.deploy()                          # the embedded local cluster
    d.invoke({"x": 1})                         # over HTTP

Operator code reads the store with ``fs.current_store()``, places models on
``fs.current_device()``, rejects a row with ``raise fs.RejectRow(...)`` and waits with
``fs.wait(seconds)`` (a run the runtime gave up on stops waiting: its client left, its
deadline passed, or it lost a race; ``fs.deadline()`` is the time left). The names
come from the project's packages (``flow``, ``optimizer``, ``executors``, ``kvs``); the
runtime's are imported on first use, so ``import flowserve`` stays light.

Errors are one tree (``flow/errors.py`` draws it) whose branches say what to do:

    try:
        d.invoke(rows, timeout=2)
    except fs.RetryableError:           # 503: no executor yet, store restarting: try again
        ...
    except fs.DeadlineExceededError:    # 504: give up, or ask for a longer deadline
        ...
    except fs.DataError as e:           # 4xx: fix the request (e.status, e.body say how)
        ...
"""

from __future__ import annotations

from flow import (
    AccessDeniedError,
    ColumnType,
    ConfigError,
    ConfigTypeError,
    DataError,
    DataTypeError,
    DeadlineExceededError,
    FeedbackError,
    Flow,
    FlowDefinitionError,
    FlowError,
    FlowTypeError,
    FlowValueError,
    GroupedNode,
    InternalError,
    LookupKeyError,
    Node,
    NotInstalledError,
    NoValidResultError,
    OperatorError,
    OperatorFailedError,
    OperatorOutputError,
    RejectRow,
    RetryableError,
    Row,
    RowRejectedError,
    SchemaError,
    Table,
    UnavailableError,
    UnreachableError,
    cancelled,
    current_device,
    current_store,
    deadline,
    optimize,
    wait,
)

# name -> module it comes from: imported when first used (the runtime pulls in httpx,
# uvicorn and the cluster code, which building and running flows in-process never needs)
_LAZY = {
    "OptimizerOptions": "optimizer",
    "ClusterClient": "executors.hosts.cluster",
    "ClusterConfig": "executors.hosts.cluster_config",
    "Deployment": "executors.hosts.cluster",
    "LocalCluster": "executors.hosts.cluster",
    "default_cluster": "executors.hosts.cluster",
    "BadRequestError": "executors.errors",
    "ClusterNotOwnedError": "executors.errors",
    "ClusterStartError": "executors.errors",
    "DeployConflictError": "executors.errors",
    "RequestTooLargeError": "executors.errors",
    "DeployError": "executors.errors",
    "NoExecutorError": "executors.errors",
    "OperatorCrashedError": "executors.errors",
    "OperatorTimeoutError": "executors.errors",
    "KeyNotFoundError": "kvs.errors",
    "StoreLostError": "kvs.errors",
    "StoreWriteError": "kvs.errors",
    "AutoscalingConfig": "executors.hosts.autoscale",
    "KVS": "kvs",
    "KubernetesCluster": "k8s",
    "KubeConfig": "k8s",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flowserve' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    # building and running flows (flow/, optimizer/)
    "ColumnType",
    "Flow",
    "GroupedNode",
    "Node",
    "Row",
    "Table",
    "current_device",
    "current_store",
    "cancelled",
    "deadline",
    "wait",
    "optimize",
    "OptimizerOptions",
    "RejectRow",
    # errors: one tree (flow/errors.py), its branches say what to do
    "FlowError",
    "FlowDefinitionError",  # fix the flow or its setup
    "FlowTypeError",
    "FlowValueError",
    "ConfigError",
    "ConfigTypeError",
    "AccessDeniedError",
    "NotInstalledError",
    "DeployError",
    "ClusterNotOwnedError",
    "DataError",  # fix the request
    "BadRequestError",
    "RequestTooLargeError",
    "SchemaError",
    "DataTypeError",
    "RowRejectedError",
    "NoValidResultError",
    "LookupKeyError",
    "KeyNotFoundError",
    "FeedbackError",
    "OperatorError",  # fix the operator
    "OperatorFailedError",
    "OperatorOutputError",
    "OperatorCrashedError",
    "RetryableError",  # retry
    "UnreachableError",
    "UnavailableError",
    "NoExecutorError",
    "StoreLostError",
    "StoreWriteError",
    "DeployConflictError",
    "DeadlineExceededError",  # wait longer or give up
    "OperatorTimeoutError",
    "InternalError",  # report it
    "ClusterStartError",
    # deploy targets and the client (executors/, k8s/, kvs/)
    "AutoscalingConfig",
    "ClusterClient",
    "ClusterConfig",
    "Deployment",
    "KubeConfig",
    "KubernetesCluster",
    "KVS",
    "LocalCluster",
    "default_cluster",
]
