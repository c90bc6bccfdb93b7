"""Running a stage: the runtime's side of the optimizer's ``Stage``.

A Plan only describes stages (which operators, fused how, batched, placed where); every
runtime (the executors, and the in-process ``executors.worker.interpreter``) runs them through
``BoundStage``: each operator built once per replica (``op.instantiate()``: constructors,
init functions), then called on input Tables.

    bound = BoundStage(plan.stages["preprocess"])
    out = bound([request_table], store)
"""

from __future__ import annotations

from collections.abc import Sequence

from executors.worker import fused, prediction_cache
from flow.errors import FlowValueError
from flow.operators import BoundOperator
from flow.table import Table
from optimizer.plan import Stage
from optimizer.positions import POS, positions, strip, with_positions


class BoundStage:
    """A stage with its operators built; ``bound(inputs, store)`` runs it on input Tables."""

    def __init__(self, stage: Stage):
        self.stage = stage
        self.bound: list[BoundOperator] = []
        for node in stage.nodes:
            b = node.op.instantiate()
            b.name = node.name
            self.bound.append(prediction_cache.wrap(b))  # map(..., cache=...): prediction_cache.py
        self.caches = [b for b in self.bound if isinstance(b, prediction_cache.CachedOperator)]
        self.chain = fused.FusedChain(stage.nodes, self.bound)  # the operators as one compiled chain

    @property
    def head(self) -> BoundOperator:
        return self.bound[0]

    def __call__(self, inputs: Sequence[Table], store=None, on_node=None) -> Table:
        """``on_node(node)`` is told before each operator runs (the runtime's watchdog
        uses it to know which operator a stuck run is in)."""
        if self.stage.continuation is not None and POS in inputs[0].columns:
            # a key-split part: keep its rows' positions
            return self._run_part(inputs[0], store, on_node)
        if fused.ENABLED:
            return self.chain(inputs, store, on_node)
        results: dict[str, Table] = {}
        last = None
        for node, b in zip(self.stage.nodes, self.bound):
            if on_node is not None:
                on_node(node)
            args = [inputs[int(i[1:])] if i.startswith("@") else results[i] for i in node.inputs]
            last = results[node.name] = b(args, store)
        return last

    def _run_part(self, table: Table, store, on_node) -> Table:
        """A continuation stage on one key-split part (optimizer.positions): the output
        keeps the surviving rows' positions; the operators never see ``POS``."""
        pos = positions(table)
        out = strip(table)
        for node, op in zip(self.stage.nodes, self.bound):
            if on_node is not None:
                on_node(node)
            before = len(out)
            if node.op.kind == "filter":  # its mask says which rows, and so which positions, survive
                mask = op.keep(out)
                out, pos = out.filter(mask), pos[mask]
            else:
                out = op([out], store)
                if len(out) != before:  # a plan bug: Stage lets only maps, filters and lookups follow
                    raise FlowValueError(
                        f"stage {self.stage.name!r}: operator {node.name!r} gave {len(out)} rows "
                        f"for {before}; a continuation stage must keep rows 1:1 or filter them"
                    )
        return with_positions(out, pos)
