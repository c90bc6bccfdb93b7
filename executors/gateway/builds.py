"""Building deployed flows' stages on an executor that (re)joins, for both gateway hosts."""

from __future__ import annotations

import logging

log = logging.getLogger("flowserve.membership")


async def build_on(dispatcher, executor_id: str, pick, load_timeout_s: float) -> list[tuple[object, list[str]]]:
    """Build on one executor the stages ``pick(flow)`` chooses of each deployed flow, and
    return ``(flow, stages)`` for each flow built there. Both gateway hosts call it when an
    executor (re)joins: the local cluster's supervisor for an executor it restarted (the
    stages placed on it), the standalone gateway for one that registered (its share). A
    build that failed is logged and left out: the store watch (durability.py) or the next
    membership change builds it again."""
    built = []
    # the served versions, and the canaries and shadows beside them (rollouts.py)
    for name, flow in [*dispatcher.flows.items(), *dispatcher.candidates.items()]:
        stages = pick(flow)
        if not stages:
            continue
        errors = await dispatcher.load(name, flow.version, {s: [executor_id] for s in stages}, load_timeout_s)
        if errors.get(executor_id):
            log.warning(
                "executor %s: building flow %s v%s failed: %s", executor_id, name, flow.version, errors[executor_id]
            )
            continue
        built.append((flow, stages))
    return built
