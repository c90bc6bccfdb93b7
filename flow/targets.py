"""Where a Flow goes beyond this package: the optimizer that plans it and the deploy target
that serves it, found by name rather than imported.

The flow package is the ground floor: the optimizer and the runtime are built on it, so it
cannot import them. ``Flow.explain()`` and ``Flow.deploy()`` reach them through Python
entry points that the project declares in pyproject.toml (and that any installed package
may add to: a third-party deploy target registers itself the same way):

    [project.entry-points."flowserve.planners"]
    default = "optimizer:optimize"              # (flow, rules=, options=) -> Plan
    [project.entry-points."flowserve.targets"]
    local = "executors.hosts.cluster:default_cluster"   # () -> a cluster with .deploy(flow, ...)

``Flow.deploy(cluster=...)`` takes any object with ``.deploy(flow, *, optimize, rules,
options)`` (LocalCluster, KubernetesCluster); without one it uses the ``local`` target.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

from flow.errors import NotInstalledError

PLANNERS = "flowserve.planners"
TARGETS = "flowserve.targets"


@cache
def _load(group: str, name: str):
    found = entry_points(group=group, name=name)
    if not found:
        known = sorted(ep.name for ep in entry_points(group=group))
        raise NotInstalledError(  # no installed package registers it
            f"no {group!r} entry point named {name!r} (registered: {known or 'none'}); "
            f"install the project (pip install -e .) so its entry points are registered"
        )
    return next(iter(found)).load()


def planner():
    """The optimizer: ``planner()(flow, rules=None, options=None)`` -> its physical Plan."""
    return _load(PLANNERS, "default")


def cluster(name: str = "local"):
    """The cluster of the deploy target ``name`` (started or reused by the target)."""
    return _load(TARGETS, name)()
