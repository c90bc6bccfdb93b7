"""Which executors answer: a ping to each every ``LIVENESS_S``, by either gateway host.

An executor whose process runs is not necessarily one that can answer (a thread may hold
the interpreter, its event loop may be wedged), so health and readiness count only the
executors whose last pong is recent (``Dispatcher.answering``), and an executor silent for
the grace period is handed to ``on_silent`` (the local cluster has it killed and restarted;
on Kubernetes its pod's own liveness probe does that, and the gateway only logs it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("flowserve.gateway")

LIVENESS_S = 1.0  # how often each executor is pinged
RECENT_S = 5.0  # a pong younger than this counts as answering (health, readiness, deploys)


async def watch_liveness(
    dispatcher,
    grace_s: float,
    *,
    on_silent: Callable[[str], Awaitable[None]] | None = None,
    running: Callable[[str], bool] = lambda _id: True,
    still: Callable[[], bool] = lambda: True,
    period_s: float = LIVENESS_S,
) -> None:
    """Ping every live executor each ``period_s`` (each ping waits up to ``grace_s``); call
    ``on_silent(id)`` for one that answered none in that time while its process still
    runs (``running(id)``) and the gateway still serves (``still()``)."""
    while True:
        await asyncio.sleep(period_s)
        checks = [i for i, info in dispatcher.executors.items() if info.alive and running(i)]
        pongs = await asyncio.gather(
            *(
                dispatcher.ping(
                    dispatcher.executors[i].address, grace_s, still_worth_it=lambda i=i: running(i) and still()
                )
                for i in checks
            )
        )
        for id_, pong in zip(checks, pongs):
            if pong is None and running(id_) and still() and id_ in dispatcher.executors:
                if on_silent is not None:
                    await on_silent(id_)
                else:
                    log.error("executor %s answered no ping for %.0f s", id_, grace_s)
