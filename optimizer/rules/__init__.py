"""The optimizer's rules: each a pure function ``apply(plan, options) -> plan``, one module each.

Every rule separates "may apply" from "apply" (``can_fuse``/``fuse``,
``can_compete``/``compete``, ...), returns a new Plan and never changes its argument.
``RULES`` maps the names ``optimize(rules=[...])`` accepts to the rules; the default order
is ``optimizer.options.DEFAULT_RULES`` (competition, locality, placement, fusion, batching).
"""

from __future__ import annotations

from optimizer.options import RULE_NAMES
from optimizer.rules import batching, competition, fusion, locality, placement

RULES = {
    "competition": competition.apply,
    "locality": locality.apply,
    "placement": placement.apply,
    "fusion": fusion.apply,
    "batching": batching.apply,
}
if set(RULES) != RULE_NAMES:  # options validate rule names against RULE_NAMES: keep them one list
    raise ImportError(f"optimizer.options.RULE_NAMES {sorted(RULE_NAMES)} != the rules here {sorted(RULES)}")

__all__ = ["RULES", "batching", "competition", "fusion", "locality", "placement"]
