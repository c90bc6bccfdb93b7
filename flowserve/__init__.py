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
``fs.wait(seconds)`` (a racing copy that lost stops waiting). The names
come from the project's packages (``flow``, ``optimizer``, ``executors``, ``kvs``); the
runtime's are imported on first use, so ``import flowserve`` stays light.
"""

from __future__ import annotations

from flow import (
    ColumnType,
    DataError,
    DataTypeError,
    Flow,
    FlowDefinitionError,
    FlowError,
    FlowTypeError,
    FlowValueError,
    ForeignNodeError,
    GroupedNode,
    LookupKeyError,
    Node,
    NoValidResultError,
    OperatorError,
    OperatorFailedError,
    OperatorOutputError,
    RejectRow,
    RetryableError,
    Row,
    RowRejectedError,
    SchemaError,
    SinkError,
    Table,
    UnknownColumnError,
    cancelled,
    current_device,
    current_store,
    optimize,
    wait,
)

# name -> module it comes from: imported when first used (the runtime pulls in httpx,
# uvicorn and the cluster code, which building and running flows in-process never needs)
_LAZY = {
    "OptimizerOptions": "optimizer",
    "ClusterClient": "executors.cluster",
    "ClusterConfig": "executors.config",
    "Deployment": "executors.cluster",
    "LocalCluster": "executors.cluster",
    "default_cluster": "executors.cluster",
    "ClusterError": "executors.errors",
    "ClusterStartError": "executors.errors",
    "DeadlineExceededError": "executors.errors",
    "DeployError": "executors.errors",
    "InvocationError": "executors.errors",
    "NoExecutorError": "executors.errors",
    "OperatorCrashedError": "executors.errors",
    "OperatorTimeoutError": "executors.errors",
    "AutoscalingConfig": "executors.autoscale",
    "KVS": "kvs",
    "KVSError": "kvs",
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
    "wait",
    "optimize",
    "OptimizerOptions",
    "RejectRow",
    # errors
    "DataError",
    "DataTypeError",
    "FlowDefinitionError",
    "FlowError",
    "FlowTypeError",
    "FlowValueError",
    "ForeignNodeError",
    "LookupKeyError",
    "NoValidResultError",
    "OperatorError",
    "OperatorFailedError",
    "OperatorOutputError",
    "RetryableError",
    "RowRejectedError",
    "SchemaError",
    "SinkError",
    "UnknownColumnError",
    "ClusterError",
    "ClusterStartError",
    "DeadlineExceededError",
    "DeployError",
    "InvocationError",
    "NoExecutorError",
    "OperatorCrashedError",
    "OperatorTimeoutError",
    "KVSError",
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
