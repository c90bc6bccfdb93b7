"""Device placement: stages with a ``gpu=True`` operator run on GPU executors.

A stage's device is ``"gpu"`` if any of its operators asked for a GPU, else ``"cpu"``.
CPU-only operators (preprocessing, filters, joins, pickers) are kept out of GPU stages:
an executor runs a stage as one call, so a CPU operator fused into a GPU stage would hold
the GPU, the scarce and expensive resource, for its whole run, and the stage could only
scale on GPU executors. This rule therefore cuts a stage wherever the device changes
between neighbouring operators, and fusion does not merge across devices. With
``OptimizerOptions(fuse_across_devices=True)`` (for setups where the hop costs more than
the GPU time, e.g. one machine with a dedicated GPU) neither happens, and a mixed stage
goes to the GPU.

    plan = placement.apply(Plan.from_flow(flow))
    plan.stages["SmallNet"].device              # "gpu"
"""

from __future__ import annotations

from optimizer.options import OptimizerOptions
from optimizer.plan import Plan, Stage
from optimizer.rules.base import cut_between, op_device, rewrite_each

NAME = "placement"


def device_of(stage: Stage) -> str:
    """The device a stage needs: gpu if any of its operators is gpu=True."""
    return "gpu" if any(n.op.gpu for n in stage.nodes) else "cpu"


def can_place(stage: Stage, options) -> bool:
    """May apply: the stage's device mark is wrong, or it mixes devices and must be cut."""
    mixed = len({op_device(n.op) for n in stage.nodes}) > 1
    return stage.device != device_of(stage) or (mixed and not options.fuse_across_devices)


def place(plan: Plan, name: str, options) -> Plan:
    """Apply to stage ``name``: cut it at device changes (unless allowed), set devices."""
    stage = plan.stages[name]
    if not options.fuse_across_devices:
        plan = cut_between(plan, name, lambda a, b: op_device(a) != op_device(b))
    names = {n.name for n in stage.nodes}
    for s in list(plan.stages.values()):
        if s.nodes[0].name in names and s.device != device_of(s):
            plan = plan.substitute(s.name, [s.with_(device=device_of(s))])
    return plan


def apply(plan: Plan, options=None) -> Plan:
    """Put every stage on the device its operators need (see module docs)."""
    options = options or OptimizerOptions()
    return rewrite_each(plan, lambda s: can_place(s, options), lambda p, name: place(p, name, options))
