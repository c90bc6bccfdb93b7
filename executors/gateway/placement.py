"""Which executors host a replica of each stage of a deployed plan.

Any executor can host any stage. A stage gets ``max(replicas, competitive)`` replicas,
spread round-robin from a per-stage offset so stages of one flow land on different
executors; a plan sized by the SLO planner (``plan.slo``) gets exactly its replicas. GPU
stages go to gpu-class executors when the cluster has any; on a machine without them they
run on CPU executors (the executors log a warning; torch code falls back to the CPU). CPU
stages prefer cpu-class executors so they do not hold a GPU.
"""

from __future__ import annotations

import logging

from executors.errors import NoExecutorError

log = logging.getLogger("flowserve.placement")


def place(plan, executors: dict) -> dict[str, list[str]]:
    """stage name -> ids of the executors hosting its replicas."""
    live = sorted((e for e in executors.values() if e.alive), key=lambda e: e.id)
    if not live:
        raise NoExecutorError(f"flow {plan.flow_name!r}: the cluster has no live executor")
    gpus = [e for e in live if e.device == "gpu"]
    cpus = [e for e in live if e.device == "cpu"] or live
    placement = {}
    for offset, (name, stage) in enumerate(plan.stages.items()):
        pool = cpus
        if stage.device == "gpu":
            if gpus:
                pool = gpus
            else:
                log.warning("stage %s wants a GPU; none in the cluster, running it on CPU executors", name)
        if stage.continuation is not None:
            # key-routed: every executor may own some keys, so all of them host it
            placement[name] = [e.id for e in pool]
            continue
        wanted = max(stage.replicas, stage.competitive)
        if stage.replicas == 1 and stage.competitive == 1 and not getattr(plan.slo, "planned", False):
            wanted = len(pool)  # default: any executor may take it, the least loaded does
        n = min(wanted, len(pool))
        placement[name] = [pool[(offset + j) % len(pool)].id for j in range(n)]
    return placement
