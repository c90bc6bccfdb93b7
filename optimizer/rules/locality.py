"""Data locality: a per-row ``lookup(column=...)`` starts a continuation stage.

The stage that starts with the lookup gets ``continuation=<key column>``: the runtime
routes each row (or each group of rows with one key) to an executor that has that key
cached, instead of shipping the value to wherever the previous stage ran (the seed: at
8 MB values, fusion plus continuations was 15x faster than fusion alone). Fusion then
pulls the lookup's downstream chain into that stage, but never pulls the lookup into its
upstream stage. Because a continuation stage runs per key group, only row-wise operators
may follow the lookup in it; this rule cuts before the first one that is not (an agg, a
join on a data column). Fixed-key lookups need no routing and fuse like any operator.

    plan = locality.apply(Plan.from_flow(flow))
    plan.stages["lookup(user)"].continuation     # "user"
"""

from __future__ import annotations

from optimizer.plan import Plan, Stage
from optimizer.rules.base import cut, is_dynamic_lookup, rewrite_each

NAME = "locality"


def _cuts(stage: Stage) -> list[int]:
    cuts, routed = [], False
    for i, node in enumerate(stage.nodes):
        if is_dynamic_lookup(node.op):
            cuts.append(i)
            routed = True
        elif routed and (not node.op.rowwise or node.op.generates):  # a continuation keeps rows 1:1
            cuts.append(i)
            routed = False
    return [i for i in cuts if i > 0]


def can_continue(stage: Stage) -> bool:
    """May apply: a per-row lookup inside the stage (or a mixing operator after one) needs
    a cut, or the stage starts with one and is not marked yet."""
    head = stage.nodes[0].op
    return bool(_cuts(stage)) or (is_dynamic_lookup(head) and stage.continuation != head.column)


def continue_at(plan: Plan, name: str) -> Plan:
    """Apply to stage ``name``: cut it at per-row lookups, mark the pieces they start."""
    stage = plan.stages[name]
    plan = cut(plan, name, _cuts(stage))
    for s in list(plan.stages.values()):
        head = s.nodes[0].op
        if (
            is_dynamic_lookup(head)
            and s.continuation != head.column
            and any(n.name == s.nodes[0].name for n in stage.nodes)
        ):
            plan = plan.substitute(s.name, [s.with_(continuation=head.column)])
    return plan


def apply(plan: Plan, options=None) -> Plan:
    """Mark every per-row lookup as a continuation boundary (see module docs)."""
    return rewrite_each(plan, can_continue, continue_at)
