"""``OptimizerOptions``: every optimizer switch in one frozen, validated object.

from optimizer import OptimizerOptions, optimize
plan = optimize(flow, options=OptimizerOptions(competitive_replicas=5))
"""

from __future__ import annotations

from dataclasses import dataclass

from flow.configuration import Bool, Config, ConfigError, ConfigTypeError, Int, Nested, setting
from optimizer.plan import BatchConfig

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
class OptimizerOptions(Config):
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
    - ``fuse_into_race``: let fusion merge cheap neighbouring maps and filters into a
      racing stage, so each copy runs them too (default True: a stage boundary costs more
      than such an operator; see ``optimizer.rules.fusion.cheap_to_race`` for "cheap").
    - ``fuse_across_devices``: let fusion merge CPU operators into GPU stages (default
      False: a CPU operator in a GPU stage would hold the GPU while it runs).

        OptimizerOptions(batch=BatchConfig(max_batch_size=8, max_wait_ms=1))
    """

    rules: tuple[str, ...] = setting(DEFAULT_RULES, lambda value, name: check_rules(value))
    competitive_replicas: int = setting(3, Int(1))
    batch: BatchConfig = setting(default_factory=BatchConfig, check=Nested(BatchConfig))
    fuse_branches: bool = setting(True, Bool())
    fuse_across_devices: bool = setting(False, Bool())
    fuse_into_race: bool = setting(True, Bool())


def check_rules(rules) -> tuple[str, ...]:
    """``rules`` as a tuple of known rule names; an ConfigError (a FlowValueError) quoting
    the bad value if not."""
    if isinstance(rules, (str, bytes)) or not isinstance(rules, (list, tuple)):
        raise ConfigTypeError(f"rules must be a list of rule names such as {list(DEFAULT_RULES)}, got {rules!r}")
    for r in rules:
        if not isinstance(r, str):
            raise ConfigTypeError(f"rules must be rule names (str), got {r!r} in {list(rules)!r}")
        if r not in RULE_NAMES:
            raise ConfigError(f"unknown optimizer rule {r!r}; known rules are {sorted(RULE_NAMES)}")
    if len(set(rules)) != len(rules):
        dup = next(r for r in rules if list(rules).count(r) > 1)
        raise ConfigError(f"optimizer rule {dup!r} is listed twice in {list(rules)!r}")
    return tuple(rules)
