"""Batching: stages that may merge requests get a ``BatchConfig``.

A stage batches if at least one of its operators asked for ``batching=True`` and every
operator in it is merge-safe (``op.rowwise``): merging the Tables of several requests
(disjoint qids) into one call and splitting the result by qid then gives each request the
rows it would get alone. ``agg`` and joins on data columns mix rows of different queries,
so a stage holding one never batches. The config is ``OptimizerOptions.batch`` (default
up to 20 requests, no wait window: ``max_wait_ms=0``). The rule runs last by default because fusion decides which
operators share a stage (fusion itself never merges a batching stage with a mixing one).

    plan = batching.apply(Plan.from_flow(flow))
    plan.stages["SmallNet"].batch               # BatchConfig(max_batch_size=20, max_wait_ms=0.0)
"""

from __future__ import annotations

from optimizer.options import OptimizerOptions
from optimizer.plan import Plan, Stage
from optimizer.rules.base import wants_batching

NAME = "batching"


def can_batch(stage: Stage) -> bool:
    """May apply: some operator asked for batching and all are merge-safe."""
    return wants_batching(stage)


def batch(stage: Stage, options) -> Stage:
    """The stage with the batch config it should have (None if it may not batch)."""
    want = options.batch if can_batch(stage) else None
    return stage if stage.batch == want else stage.with_(batch=want)


def apply(plan: Plan, options=None) -> Plan:
    """Give every stage that may batch the configured BatchConfig (see module docs)."""
    options = options or OptimizerOptions()
    for s in list(plan.stages.values()):
        new = batch(s, options)
        if new is not s:
            plan = plan.substitute(s.name, [new])
    return plan
