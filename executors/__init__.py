"""The runtime: executors, gateway, local cluster, and the Python client of deployments."""

from executors.cluster import Deployment, LocalCluster, default_cluster
from executors.config import ClusterConfig
from executors.errors import (
    ClusterError,
    ClusterStartError,
    DeadlineExceededError,
    DeployError,
    InvocationError,
    NoExecutorError,
)

__all__ = [
    "ClusterConfig",
    "ClusterError",
    "ClusterStartError",
    "DeadlineExceededError",
    "Deployment",
    "DeployError",
    "InvocationError",
    "LocalCluster",
    "NoExecutorError",
    "default_cluster",
]
