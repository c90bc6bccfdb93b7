"""Kubernetes: the same plans as the local cluster, on pods instead of processes.

    from k8s import KubeConfig, render, to_yaml, KubernetesCluster
    config = KubeConfig(namespace="ml", image="registry.example.com/flowserve:0.1.0")
    print(to_yaml(render(config, plan)))                 # review / commit (GitOps)
    cluster = KubernetesCluster(config=config)           # kubeconfig or in-cluster credentials
    cluster.ensure_secrets(); cluster.apply(render(config, plan))
    cluster.scale("executor-gpu", 3)                     # what an autoscaler calls
    d = cluster.deploy(flow)                             # or flow.deploy(cluster=cluster)

Modules: ``config`` (KubeConfig, Resources, Toleration), ``manifests`` (render, to_yaml),
``backend`` (KubernetesCluster; needs the ``kubernetes`` package), ``scaling``
(KubernetesExecutors: the gateway autoscaler's backend), ``cli`` (``flowserve k8s
render``), ``exceptions``.
"""

from k8s.errors import K8sConflictError, K8sNotFoundError
from k8s.kube_config import KubeConfig, Resources, Toleration, parse_quantity
from k8s.manifests import COMPONENTS, SCALABLE, render, to_yaml


def __getattr__(name):  # the backend imports the kubernetes client: only when asked for
    if name == "KubernetesCluster":
        from k8s.backend import KubernetesCluster

        return KubernetesCluster
    if name == "KubernetesExecutors":
        from k8s.scaling import KubernetesExecutors

        return KubernetesExecutors
    raise AttributeError(f"module 'k8s' has no attribute {name!r}")


__all__ = [
    "COMPONENTS",
    "SCALABLE",
    "KubeConfig",
    "KubernetesCluster",
    "KubernetesExecutors",
    "Resources",
    "Toleration",
    "parse_quantity",
    "render",
    "to_yaml",
    "K8sNotFoundError",
    "K8sConflictError",
]
