"""The stage vocabulary of a physical plan: what one Stage is, and the marks the
optimizer's rules set on it (optimizer/plan.py assembles stages into the Plan DAG).

A Stage is the unit of placement and scaling: a chain of flow nodes run as one function
on one executor. Its first node may have several inputs (join, union, choose), every later
node has exactly one input, the node before it. The stage's output is its last node's.
A stage's name is its nodes' names joined with ``+`` (``preprocess+SmallNet``), so logs,
metrics and ``explain()`` say where it came from. A stage only describes: running one
belongs to the runtime (``executors.worker.stage_runner``).

Edges carry whole Tables. Wait semantics live on the consumer:
- ``wait="all"``: run once every input has arrived (a producer with ``competitive=k``
  counts as arrived at its first copy: k replicas race, the first answer wins);
- ``wait="first_valid"``: the inputs are competing alternatives (``anyof``); per row, the
  first result that the stage's ``ChooseOp`` accepts is used. In-process (``executors.worker.interpreter``)
  that is the first valid in argument order; in a deployment, the first to arrive.

Other stage marks, set by the optimizer's rules (``optimizer.rules``):
- ``continuation=<column>``: the stage starts with a per-row ``lookup(column=...)``; the
  runtime routes each row (or group of rows with one key) to an executor that caches the
  key. Such a stage is a chain whose later operators are row-wise, so running it per key
  group and merging the groups' outputs by row position (``optimizer.positions``) gives
  the same rows in the same order.
- ``batch=BatchConfig(...)``: the runtime may merge the Tables of several requests (disjoint
  qids) into one call and split the result back by qid. Only set on row-wise stages.
- ``device``: ``"cpu"`` or ``"gpu"`` (a stage with a ``gpu=True`` operator).
- ``competitive=k``: k replicas all run each input; the consumer takes the first result.
- ``hedge`` (from a ``map(..., hedge=...)``, isolated by the competition rule): one replica
  runs each input; a backup copy goes to a second one if no answer came by the stage's
  observed percentile (or a delay); the consumer takes the first result.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from flow.configuration import Config, Int, Number, setting
from flow.errors import FlowTypeError, FlowValueError, NoValidResultError
from flow.operators import AnyOfOp, BoundOperator, Operator, choose_first_valid, is_valid
from flow.table import Table

INPUT = "__input__"  # the name stages use for the request's rows
WAIT_MODES = ("all", "first_valid")
DEVICES = ("cpu", "gpu")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class BatchConfig(Config):
    """How a batching stage merges requests: up to ``max_batch_size`` requests per call,
    waiting at most ``max_wait_ms`` for more after the first arrives (Clipper's delayed
    batching).

    The default waits not at all: a batch is whatever is queued when the stage is free
    (the seed's policy, and Triton's default). Batches still grow with load, since
    requests queue while a batch runs, and a busy executor never idles waiting for
    requests that its own answers would release (closed-loop clients): measured on the
    Ensemble at concurrency 8, a 2 ms window cost 20% of throughput. A window pays when a
    call costs nearly the same for 1 and N rows (a GPU model) and load is moderate.

        BatchConfig(max_batch_size=32, max_wait_ms=5)
    """

    max_batch_size: int = setting(20, Int(1))
    max_wait_ms: float = setting(0.0, Number(ge=0, what="a finite number >= 0"))


@dataclass(frozen=True)
class PlanNode:
    """One flow operator inside a stage. ``inputs`` name other nodes of the same stage or,
    for the stage's first node, positions in the stage's inputs (``"@0"``, ``"@1"``...)."""

    name: str
    op: Operator
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class ChooseOp(Operator):
    """Head of a ``first_valid`` stage: per row, the first alternative result that is valid.

    Its inputs are the alternatives' outputs in argument order (see plan module docs)."""

    kind = "choose"
    # Required in effect: the default only lets __post_init__ raise FlowTypeError for a missing one
    anyof: AnyOfOp = None  # type: ignore[assignment]  # never None after __post_init__

    def __post_init__(self):
        if not isinstance(self.anyof, AnyOfOp):
            raise FlowTypeError(f"ChooseOp needs the AnyOfOp it chooses for, got {self.anyof!r}")

    @property
    def arity(self):  # type: ignore[override]  # a class attribute on Operator, computed here
        return len(self.anyof.alternatives)

    @property
    def label(self) -> str:
        return "choose"

    def describe(self) -> str:
        return f"choose first valid of {len(self.anyof.alternatives)} -> {', '.join(self.anyof.names)}"

    def instantiate(self):
        return _BoundChoose(self, "choose")


class _BoundChoose(BoundOperator):
    """Inputs: each alternative's output Table (row-aligned: they ran on the same rows), or
    the error it raised (all its rows invalid), in argument order."""

    op: ChooseOp  # the subclass binds only this operator kind (declared for the checker; no runtime cost)

    def __call__(self, inputs, store=None):
        template = next((t for t in inputs if isinstance(t, Table)), None)
        if template is None:
            # Every alternative failed outright, so no row has a valid result.
            reasons = "; ".join(str(e) for e in inputs)
            qid = next((getattr(e, "qid", None) for e in inputs if getattr(e, "qid", None) is not None), None)
            raise NoValidResultError(
                f"operator {self.name!r}: no alternative gave a valid result ({reasons})", operator=self.name, qid=qid
            )
        return choose_first_valid(self.op.anyof, self.name, template, list(inputs))

    def accepts(self, table: Table) -> np.ndarray:
        """Which rows of one alternative's output are valid (the runtime's first-valid test)."""
        return np.fromiter(
            (is_valid(self.op.anyof, self.name, table, i) for i in range(len(table))), dtype=bool, count=len(table)
        )


def stage_name(nodes: Sequence[PlanNode]) -> str:
    """The traceable name of a stage made of ``nodes``: their names joined with '+'."""
    return "+".join(n.name for n in nodes)


@dataclass(frozen=True)
class Stage:
    """A group of fused operators run as one function on one executor."""

    name: str
    nodes: tuple[PlanNode, ...]
    inputs: tuple[str, ...]  # upstream stage names (or INPUT), positional
    replicas: int = 1
    competitive: int = 1  # k > 1: k replicas all run each input; the first result wins
    device: str = "cpu"
    batch: BatchConfig | None = None
    wait: str = "all"
    continuation: str | None = None  # route rows by this column's value (dynamic lookup key)

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if not self.nodes:
            raise FlowValueError(f"stage {self.name!r} has no operators")
        if self.wait not in WAIT_MODES:
            raise FlowValueError(f"stage {self.name!r}: wait={self.wait!r}; expected one of {WAIT_MODES}")
        if self.device not in DEVICES:
            raise FlowValueError(f"stage {self.name!r}: device={self.device!r}; expected one of {DEVICES}")
        for attr in ("replicas", "competitive"):
            v = getattr(self, attr)
            if not _is_int(v) or v < 1:
                raise FlowValueError(f"stage {self.name!r}: {attr} must be an int >= 1, got {v!r}")
        if self.competitive > self.replicas:
            raise FlowValueError(
                f"stage {self.name!r}: competitive={self.competitive} needs at least as many "
                f"replicas, got replicas={self.replicas}"
            )
        if self.batch is not None and not isinstance(self.batch, BatchConfig):
            raise FlowValueError(f"stage {self.name!r}: batch must be a BatchConfig or None, got {self.batch!r}")
        self._check_nodes()
        if self.batch is not None and not self.rowwise:
            bad = next(n.name for n in self.nodes if not n.op.rowwise)
            raise FlowValueError(
                f"stage {self.name!r}: cannot batch, operator {bad!r} mixes rows of different "
                f"queries (merging requests would change their answers)"
            )
        if self.wait == "first_valid" and not isinstance(self.nodes[0].op, ChooseOp):
            raise FlowValueError(f"stage {self.name!r}: wait='first_valid' needs a ChooseOp head")
        if self.continuation is not None:
            head = self.nodes[0].op
            if getattr(head, "kind", None) != "lookup" or getattr(head, "column", None) != self.continuation:
                raise FlowValueError(
                    f"stage {self.name!r}: continuation={self.continuation!r} needs a head "
                    f"lookup(column={self.continuation!r})"
                )
            # its key groups' outputs merge back by row position: every operator keeps rows 1:1
            mixers = [n.name for n in self.nodes[1:] if not n.op.rowwise or n.op.generates]
            if mixers:
                raise FlowValueError(
                    f"stage {self.name!r}: a continuation stage runs per key group; operator "
                    f"{mixers[0]!r} mixes rows and cannot be part of it"
                )
            if not self.chain:
                # its key groups' outputs merge back by row position (optimizer.positions)
                raise FlowValueError(
                    f"stage {self.name!r}: a continuation stage runs per key group and must be a "
                    f"chain of operators that each read the one before"
                )

    def _check_nodes(self) -> None:
        """Nodes are in topological order; ``@k`` names the stage's k-th input. A stage is a
        chain (each node reads the one before) or, after branch fusion, a small DAG whose
        every node but the last feeds a later node of the stage (the last is the output)."""
        want = {f"@{k}" for k in range(len(self.inputs))}
        seen: set[str] = set()
        used: set[str] = set()
        for node in self.nodes:
            if not isinstance(node, PlanNode):
                raise FlowValueError(f"stage {self.name!r}: nodes must be PlanNodes, got {node!r}")
            if node.op.kind == "source":
                raise FlowValueError(f"stage {self.name!r}: the source is not an operator; use INPUT")
            if len(node.inputs) != node.op.arity:
                raise FlowValueError(
                    f"stage {self.name!r}: node {node.name!r} ({node.op.kind}) takes "
                    f"{node.op.arity} input(s), got {node.inputs}"
                )
            for i in node.inputs:
                if i not in seen and i not in want:
                    raise FlowValueError(
                        f"stage {self.name!r}: node {node.name!r} reads {i!r}, which is neither an "
                        f"earlier node of the stage nor one of its inputs {sorted(want)}"
                    )
                used.add(i)
            seen.add(node.name)
        if want - used:
            raise FlowValueError(f"stage {self.name!r}: inputs {sorted(want - used)} are read by no node")
        dangling = [n.name for n in self.nodes[:-1] if n.name not in used]
        if dangling:
            raise FlowValueError(
                f"stage {self.name!r}: nodes {dangling} feed nothing; only the last node is the output"
            )

    @property
    def chain(self) -> bool:
        """True if every node after the first reads exactly the node before it."""
        return all(n.inputs == (p.name,) for p, n in zip(self.nodes, self.nodes[1:]))

    @property
    def ops(self) -> tuple[Operator, ...]:
        return tuple(n.op for n in self.nodes)

    @property
    def head(self) -> PlanNode:
        return self.nodes[0]

    @functools.cached_property
    def hedge(self):
        """``"pNN"`` or seconds if the stage is hedged (a ``map(..., hedge=...)`` in it): a
        backup copy goes to another replica when no answer came by then; else None."""
        return next((h for h in (getattr(op, "hedge", None) for op in self.ops) if h is not None), None)

    @property
    def deadline_answers(self) -> bool:
        """True if the stage's head is an ``ensemble``: it answers at the deadline with the
        members that have arrived (flow.prediction.EnsembleOp)."""
        return self.nodes[0].op.kind == "ensemble"

    @property
    def rowwise(self) -> bool:
        """True if requests may be merged into one batch without changing any answer."""
        return all(op.rowwise for op in self.ops)

    def with_(self, **changes) -> Stage:
        return replace(self, **changes)
