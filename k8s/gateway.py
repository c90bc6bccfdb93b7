"""The gateway of a Kubernetes deployment: the runtime's standalone gateway
(executors/hosts/standalone.py) with Kubernetes plugged in as its executor backend.

    python -m k8s.gateway --host 0.0.0.0 --port 8000 --address tcp://10.0.0.7:5556 \\
        --kvs redis://:pw@kvs:6379/0 --autoscale '{...}' --scaler k8s \\
        --k8s-namespace ml --k8s-instance flowserve

``--scaler k8s`` lets the autoscaler add and remove executors by scaling this instance's
executor Deployments (k8s/scaling.py); without it the gateway serves the executors that
register, like ``python -m executors.hosts.standalone``. ``--leader-election k8s`` elects
the replica that runs the control loop through the Lease ``<instance>-leader``
(k8s/leadership.py), so any number of gateway replicas may serve one autoscaled instance.
The rendered manifests run this module.
"""

from __future__ import annotations

import argparse
import functools
import os

from executors.hosts.standalone import main as standalone_main
from k8s.kube_config import KubeConfig
from k8s.leadership import KubeLease
from k8s.manifests import object_name
from k8s.scaling import KubernetesExecutors


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--k8s-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of this instance (default: $POD_NAMESPACE)",
    )
    p.add_argument("--k8s-instance", default="flowserve", help="instance name (the objects' name prefix)")


def _kubernetes_scaler(args: argparse.Namespace):
    if not args.k8s_namespace:
        raise ValueError("--scaler k8s needs --k8s-namespace (or POD_NAMESPACE)")
    # the baseline (executors never removed) is read from the Deployments when it starts
    return functools.partial(KubernetesExecutors.from_incluster, args.k8s_namespace, args.k8s_instance)


def lease_name(instance: str) -> str:
    """The Lease that elects the gateway replica running the control loop of ``instance``."""
    return object_name(KubeConfig(name=instance), "leader")


def _kubernetes_lease(args: argparse.Namespace):
    if not args.k8s_namespace:
        raise ValueError("--leader-election k8s needs --k8s-namespace (or POD_NAMESPACE)")
    return functools.partial(KubeLease.from_incluster, args.k8s_namespace, lease_name(args.k8s_instance))


def main(argv=None) -> None:
    standalone_main(
        argv,
        prog="python -m k8s.gateway",
        scalers={"k8s": _kubernetes_scaler},
        leases={"k8s": _kubernetes_lease},
        add_arguments=_add_arguments,
    )


if __name__ == "__main__":
    main()
