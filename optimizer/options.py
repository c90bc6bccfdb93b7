"""``OptimizerOptions``: every optimizer switch in one frozen, validated object.

    from optimizer import OptimizerOptions, optimize
    plan = optimize(flow, options=OptimizerOptions(competitive_replicas=5))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from optimizer.plan import BatchConfig, PlanError, PlanTypeError, _is_int

#: The default rule order, and why (see optimizer.rules for each rule):
#: 1. competition, 2. locality, 3. placement mark boundaries (high-variance operators and
#:    anyof alternatives get stages of their own; a per-row lookup starts a continuation
#:    stage; CPU and GPU operators get separate stages) before
#: 4. fusion merges what the marks allow, so no fused stage has to be cut again; then
#: 5. batching sees the final stages (a stage batches only if every operator in it is
#:    merge-safe, which depends on what was fused into it).
#: Each marking rule also cuts stages fused before it, so any order gives a correct plan;
#: the default order is the one that never fuses what a later rule would have to undo.
DEFAULT_RULES: tuple[str, ...] = ("competition", "locality", "placement", "fusion", "batching")
# The rules there are (optimizer/rules/__init__.py implements exactly these; it checks so):
# named here, so options can be validated without importing the rules that read them.
RULE_NAMES: frozenset[str] = frozenset(DEFAULT_RULES)


@dataclass(frozen=True)
class OptimizerOptions:
    """Switches for ``optimize``; every field has a documented default.

    - ``rules``: rule names applied in this order (default ``DEFAULT_RULES``:
      competition, locality, placement, fusion, batching).
    - ``competitive_replicas``: k replicas race for a ``high_variance`` operator's stage
      (default 3, the seed's knee: 1 -> 3 replicas cut p99 by 71-94%). 1 turns racing off.
    - ``batch``: the BatchConfig given to batching stages (default: up to 20 requests, no wait window).
    - ``fuse_branches``: let fusion also merge fork-join regions (a stage, the branches it
      feeds and the stage that joins them) into one stage that runs the branches one after
      the other (default True: a hop costs more than most branches; operators that race,
      route by key or choose among alternatives are never merged this way).
    - ``fuse_across_devices``: let fusion merge CPU operators into GPU stages (default
      False: a CPU operator in a GPU stage would hold the GPU while it runs).

        OptimizerOptions(batch=BatchConfig(max_batch_size=8, max_wait_ms=1))
    """

    rules: tuple[str, ...] = DEFAULT_RULES
    competitive_replicas: int = 3
    batch: BatchConfig = field(default_factory=BatchConfig)
    fuse_branches: bool = True
    fuse_across_devices: bool = False

    def __post_init__(self):
        object.__setattr__(self, "rules", check_rules(self.rules))
        if not _is_int(self.competitive_replicas) or self.competitive_replicas < 1:
            raise PlanError(f"OptimizerOptions.competitive_replicas must be an int >= 1, "
                            f"got {self.competitive_replicas!r}")
        if not isinstance(self.batch, BatchConfig):
            raise PlanTypeError(f"OptimizerOptions.batch must be a BatchConfig, got {self.batch!r}")
        if not isinstance(self.fuse_branches, bool):
            raise PlanTypeError(f"OptimizerOptions.fuse_branches must be a bool, got {self.fuse_branches!r}")
        if not isinstance(self.fuse_across_devices, bool):
            raise PlanTypeError(f"OptimizerOptions.fuse_across_devices must be a bool, "
                                f"got {self.fuse_across_devices!r}")


def check_rules(rules) -> tuple[str, ...]:
    """``rules`` as a tuple of known rule names; a PlanError quoting the bad value if not."""
    if isinstance(rules, (str, bytes)) or not isinstance(rules, (list, tuple)):
        raise PlanTypeError(f"rules must be a list of rule names such as {list(DEFAULT_RULES)}, got {rules!r}")
    for r in rules:
        if not isinstance(r, str):
            raise PlanTypeError(f"rules must be rule names (str), got {r!r} in {list(rules)!r}")
        if r not in RULE_NAMES:
            raise PlanError(f"unknown optimizer rule {r!r}; known rules are {sorted(RULE_NAMES)}")
    if len(set(rules)) != len(rules):
        dup = next(r for r in rules if list(rules).count(r) > 1)
        raise PlanError(f"optimizer rule {dup!r} is listed twice in {list(rules)!r}")
    return tuple(rules)
