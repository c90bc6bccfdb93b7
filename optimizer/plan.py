"""The physical plan: an immutable DAG of Stages (optimizer/stage.py), each a group of
fused operators, for one flow.

    plan = Plan.from_flow(flow)          # one stage per operator: the unoptimized baseline
    plan.stages["preprocess"].inputs      # ("__input__",)
    print(plan.explain())

A plan only describes: running a stage belongs to the runtime (``executors.worker.stage_runner``:
``BoundStage(stage)([request_table], store)``), which reads these stages. The stage
vocabulary (Stage, PlanNode, BatchConfig, ChooseOp, INPUT) is defined in
optimizer/stage.py and importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from flow.errors import FlowTypeError, FlowValueError
from flow.types import ColumnType
from optimizer.explain import explain
from optimizer.stage import (  # noqa: F401  (the stage vocabulary, importable from the plan too)
    DEVICES,
    INPUT,
    WAIT_MODES,
    BatchConfig,
    ChooseOp,
    PlanNode,
    Stage,
    _is_int,
    stage_name,
)


@dataclass(frozen=True)
class Plan:
    """An immutable DAG of stages for one flow; ``stages`` are in topological order.

    ``rules`` names the optimizer rules applied to get it, in order (empty: the baseline).
    ``timeout_s``: this flow's deadline when deployed (None: the cluster's default).
    ``slo``: set when the plan is served under a latency SLO (``optimizer.slo.sizing``
    ``ServingSLO``: the objective, each stage's budget and why it got its size).
    ``autoscaling``: this flow's own ``AutoscalingConfig`` when deployed (None: the
    cluster's, if it has one; ``flowserve deploy -f`` sets it per flow).
    """

    flow_name: str
    stages: Mapping[str, Stage]
    sink: str
    input_schema: Mapping[str, ColumnType] | None = None
    rules: tuple[str, ...] = ()
    timeout_s: float | None = None
    slo: object | None = None
    autoscaling: object | None = None

    def __post_init__(self):
        object.__setattr__(self, "stages", MappingProxyType(dict(self.stages)))
        object.__setattr__(self, "rules", tuple(self.rules))
        t = self.timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf")):
            raise FlowTypeError(f"plan {self.flow_name!r}: timeout_s must be a number of seconds > 0, got {t!r}")
        if self.input_schema is not None:
            object.__setattr__(self, "input_schema", MappingProxyType(dict(self.input_schema)))
        if self.sink not in self.stages:
            raise FlowValueError(f"plan {self.flow_name!r}: sink {self.sink!r} is not a stage")
        seen = {INPUT}
        node_names: set[str] = set()
        for key, s in self.stages.items():
            if not isinstance(s, Stage):
                raise FlowValueError(f"plan {self.flow_name!r}: {key!r} is not a Stage: {s!r}")
            if key != s.name:
                raise FlowValueError(f"plan {self.flow_name!r}: stage {s.name!r} is listed under {key!r}")
            for i in s.inputs:
                if i not in seen:
                    raise FlowValueError(
                        f"plan {self.flow_name!r}: stage {s.name!r} reads {i!r}, which is not an earlier stage"
                    )
            for n in s.nodes:
                if n.name in node_names:
                    raise FlowValueError(f"plan {self.flow_name!r}: operator {n.name!r} appears in two places")
                node_names.add(n.name)
            seen.add(s.name)
        consumers = self.consumers()
        for name in self.stages:
            if name != self.sink and not consumers[name]:
                raise FlowValueError(f"plan {self.flow_name!r}: stage {name!r} is not the sink and nothing reads it")

    def __reduce__(self):  # read-only mappings do not pickle; ship plain dicts
        schema = dict(self.input_schema) if self.input_schema is not None else None
        return (
            Plan,
            (
                self.flow_name,
                dict(self.stages),
                self.sink,
                schema,
                self.rules,
                self.timeout_s,
                self.slo,
                self.autoscaling,
            ),
        )

    @classmethod
    def from_flow(cls, flow) -> Plan:
        """One stage per operator: the unoptimized plan that benchmarks compare against.

        Plan.from_flow(flow).stages.keys()   # the flow's node names, in creation order
        """
        from flow.flow import Flow
        from flow.reference import needed_nodes

        if not isinstance(flow, Flow):
            raise FlowTypeError(f"Plan.from_flow expects a Flow, got {type(flow).__name__}")
        sink = flow.validate()
        stages: dict[str, Stage] = {}
        stage_of: dict[int, str] = {}
        for node in needed_nodes(flow, sink):
            if node.op.kind == "source":
                stage_of[node.id] = INPUT
                continue
            inputs = tuple(stage_of[i.id] for i in node.inputs)
            pn = PlanNode(node.name, node.op, tuple(f"@{k}" for k in range(len(inputs))))
            stages[node.name] = Stage(name=node.name, nodes=(pn,), inputs=inputs)
            stage_of[node.id] = node.name
        return cls(flow.name, stages, stage_of[sink.id], flow.schema)

    def replace_stages(self, stages: Mapping[str, Stage], sink: str | None = None) -> Plan:
        return replace(self, stages=stages, sink=sink or self.sink)

    def with_rules(self, rules: Sequence[str]) -> Plan:
        """The same plan, recording that ``rules`` were applied to it."""
        return replace(self, rules=tuple(rules))

    def with_timeout(self, seconds: float | None) -> Plan:
        """The same plan with its own deadline when deployed (None: the cluster's default)."""
        return replace(self, timeout_s=None if seconds is None else float(seconds))

    def with_autoscaling(self, config) -> Plan:
        """The same plan scaled by its own ``AutoscalingConfig`` when deployed (None: the cluster's)."""
        return replace(self, autoscaling=config)

    def consumers(self) -> dict[str, list[str]]:
        """For each stage (and INPUT), the stages that read it, once per edge."""
        out: dict[str, list[str]] = {name: [] for name in self.stages}
        out[INPUT] = []
        for s in self.stages.values():
            for i in s.inputs:
                out[i].append(s.name)
        return out

    def substitute(self, old: str, new: Sequence[Stage], drop: Sequence[str] = ()) -> Plan:
        """Replace stage ``old`` by the stages ``new`` (in order; the last one produces what
        ``old`` produced, so readers of ``old`` now read it) and remove the stages ``drop``.

        The building block of every rule: splitting a stage, expanding an anyof, fusing two.
        """
        if old not in self.stages:
            raise FlowValueError(f"plan {self.flow_name!r}: no stage {old!r}")
        new = list(new)
        out = new[-1].name
        stages: list[Stage] = []
        for s in self.stages.values():
            if s.name in drop:
                continue
            if s.name == old:
                stages.extend(new)
                continue
            if old in s.inputs:
                s = replace(s, inputs=tuple(out if i == old else i for i in s.inputs))
            stages.append(s)
        names = [s.name for s in stages]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise FlowValueError(f"plan {self.flow_name!r}: two stages named {dup!r}")
        return self.replace_stages({s.name: s for s in stages}, sink=out if self.sink == old else self.sink)

    def explain(self, replicas: Mapping[str, int] | None = None) -> str:
        """The plan as readable, deterministic text (see optimizer.explain); ``replicas``:
        per stage, the replicas a deployment placed."""
        return explain(self, replicas)
