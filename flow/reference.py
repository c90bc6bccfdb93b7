"""The reference runner: every node in creation order, in-process, no optimizer.

This is what a flow *means*; every optimizer rule and runtime is tested against it.
"""

from __future__ import annotations

from flow.table import Table


def ancestors(sink) -> set[int]:
    """Ids of the nodes the sink depends on (itself included)."""
    seen: set[int] = set()
    stack = [sink]
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen.add(n.id)
        stack.extend(n.inputs)
    return seen


def needed_nodes(flow, sink) -> list:
    """The nodes the sink depends on (itself included), in creation order (topological)."""
    needed = ancestors(sink)
    return [n for n in flow.nodes if n.id in needed]


def run_nodes(flow, table: Table, sink, store=None) -> Table:
    """Evaluate the nodes the sink needs, in creation order (a topological order)."""
    results: dict[int, Table] = {}
    for node in needed_nodes(flow, sink):
        if node.op.kind == "source":
            results[node.id] = table
            continue
        bound = node.op.instantiate()
        bound.name = node.name
        results[node.id] = bound([results[i.id] for i in node.inputs], store)
    return results[sink.id]
