"""The runtime: executors, gateway, local cluster, and the Python client of deployments."""

from executors.errors import (
    ClusterStartError,
    DeadlineExceededError,
    DeployConflictError,
    DeployError,
    NoExecutorError,
)
from executors.hosts.cluster import Deployment, LocalCluster, default_cluster
from executors.hosts.cluster_config import ClusterConfig

__all__ = [
    "ClusterConfig",
    "ClusterStartError",
    "DeadlineExceededError",
    "Deployment",
    "DeployConflictError",
    "DeployError",
    "LocalCluster",
    "NoExecutorError",
    "default_cluster",
]
