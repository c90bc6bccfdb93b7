"""Readiness: whether a gateway can answer every flow it should serve, and if not, what is
missing (``GET /readyz``, ``GET /readyz/{flow}``; status.py answers them).

A flow is ready when each of its stages has a *warm* replica: placed on an executor that is
alive, answered a ping lately (liveness.py) and has built the flow's version (it said so:
``Loaded``). A stage placed nowhere (zero replicas) is not ready, nor is a flow the registry
lists that is still being loaded here or failed to load (deploys.py). A deploy still being
built on the executors is named but does not make the gateway unready: it is not deployed
until it is registered, and the flows already served answer meanwhile. A canary or shadow
version (rollouts.py) is named under ``notes`` when it has no warm replica, without making
the gateway unready: the primary answers every request but the candidate's own share.
"""

from __future__ import annotations

from executors.gateway.liveness import RECENT_S
from executors.gateway.records import DeployedFlow


def flow_problems(flow: DeployedFlow, dispatcher, answering: set[str]) -> list[str]:
    """What keeps ``flow`` (a version being served) from answering: per stage, zero
    replicas or none warm (which executors, and why each is not)."""
    name, key = flow.plan.flow_name, (flow.plan.flow_name, flow.version)
    problems = []
    for stage in flow.plan.stages:
        ids = flow.placement.get(stage) or []
        if not ids:
            problems.append(f"flow {name!r} v{flow.version} stage {stage!r} has zero replicas")
            continue
        why = []
        for i in ids:
            info = dispatcher.executors.get(i)
            if info is None:
                why.append(f"{i} left")
            elif not info.alive:
                why.append(f"{i} is down")
            elif i not in answering:
                why.append(f"{i} answers no ping")
            elif key not in info.loaded:
                why.append(f"{i} has not built it")
            else:
                why = []
                break
        if why:
            problems.append(
                f"flow {name!r} v{flow.version} stage {stage!r} has no warm replica (built and answering): "
                + ", ".join(why)
            )
    return problems


def readiness(gateway, flow: str | None = None) -> tuple[bool, dict]:
    """(ready, the body of the answer) for the whole gateway, or for one ``flow``. A flow
    this gateway neither serves nor is loading is not asked about here (the route says 404)."""
    d, deploys = gateway.dispatcher, gateway.deploys
    missing: list[str] = []
    if not gateway.accepting:
        missing.append("the gateway is stopping (draining the requests in flight)")
    elif not gateway.ready:
        missing.append("the gateway is still starting (restoring its flows)")
    answering = {e.id for e in d.answering(RECENT_S)}
    if not answering and not missing:
        missing.append("no executor answers pings")
    names = sorted(set(d.flows) | set(deploys.loading) | set(deploys.unserved))
    if flow is not None:
        names = [n for n in names if n == flow]
    flows: dict[str, dict] = {}
    notes: list[str] = []
    for name in names:
        served = d.flows.get(name)
        entry: dict = {"version": None if served is None else served.version}
        problems = [] if served is None else flow_problems(served, d, answering)
        loading = deploys.loading.get(name)
        if loading is not None:
            version, listed = loading
            entry["deploying"] = version
            what = f"flow {name!r} v{version} is being deployed (its stages are being built)"
            if listed and served is None:
                problems.append(what)
            else:
                notes.append(what)  # a first deploy not registered yet, or a new version of a served flow
        failed = deploys.unserved.get(name)
        if failed is not None and (served is None or served.version < failed[0]):
            problems.append(f"flow {name!r} v{failed[0]} is registered but not served here: {failed[1]}")
        candidate = d.candidates.get(name)
        if candidate is not None:
            entry["candidate"] = candidate.version
            notes += [f"{p} (the candidate)" for p in flow_problems(candidate, d, answering)]
        if served is None and loading is not None and not loading[1] and failed is None:
            entry["ready"] = False  # a first deploy: named, not counted against the gateway
            flows[name] = entry
            continue
        entry["ready"] = not problems
        flows[name] = entry
        missing += problems
    ready = not missing and (flow is None or flows.get(flow, {}).get("ready", False))
    body: dict = {"ready": ready, "executors": len(answering), "flows": flows}
    if missing:
        body["missing"] = missing
    if notes:
        body["notes"] = notes
    return ready, body
