"""What an example does on a cluster it may share with its user.

``fs.default_cluster()`` is the `flowserve up` cluster when one runs: the user's flows
serve there, among them perhaps this very example, deployed with `flowserve deploy`. So
an example deploys under a name no flow there has (``own_name``), undeploys only that,
and lets go of the cluster with ``cluster.release()``, which stops it only if the example
started it (an embedded cluster), never the user's.
"""

from __future__ import annotations


def own_name(cluster, name: str) -> str:
    """``name``, or ``name-2``, ``name-3`` ... when the cluster serves a flow of that name
    already (the user's, which this run must neither replace nor undeploy)."""
    served = {f["name"] for f in cluster.request("GET", "/flows", "listing the flows").json()["flows"]}
    if name not in served:
        return name
    n = 2
    while f"{name}-{n}" in served:
        n += 1
    print(f"the cluster serves a flow named {name!r} already: this run deploys its own as '{name}-{n}'")
    return f"{name}-{n}"
