"""The layers the folders promise are the imports (docs/architecture.md).

Every import in the project's packages counts, including those inside functions (a lazy
import is still a dependency). Two checks, from the source text alone:
- packages import only the layers below them: flow (the ground: data model, errors,
  operator specs, the logical plan) <- optimizer, kvs <- executors (the runtime) <- k8s (a
  deploy target) <- flowserve (the public import and the CLI);
- inside the runtime (executors/), each role imports only the roles below it: the shared
  ground (errors, plans, tracing) <- codec (bodies), wire (between processes) <- gateway, worker
  (which never import each other: they meet only in wire) <- hosts (processes, client,
  CLI); the package's face (executors/__init__.py) hands the hosts' names on;
- no file imports itself back through others (no import circle, within a package or across).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {  # package -> the packages it may import (besides itself)
    "flow": set(),
    "optimizer": {"flow"},
    "kvs": {"flow"},
    "executors": {"flow", "optimizer", "kvs"},
    "k8s": {"flow", "optimizer", "kvs", "executors"},
    "flowserve": {"flow", "optimizer", "kvs", "executors", "k8s"},
}


ROLES = {  # role inside executors/ -> the roles it may import (besides itself)
    "errors": set(),
    "plans": {"errors"},
    "tracing": set(),  # shared ground: OpenTelemetry spans, which the gateway and the worker both make
    "codec": {"errors"},
    "wire": {"errors", "codec"},
    "gateway": {"errors", "plans", "tracing", "codec", "wire"},
    "worker": {"errors", "plans", "tracing", "codec", "wire"},
    "hosts": {"errors", "plans", "tracing", "codec", "wire", "gateway", "worker"},
    "": {"errors", "hosts"},  # the package's face: public names
}


def role(module: str) -> str | None:
    """A runtime module's role (its folder under executors/, or its own name for the shared
    ground); None outside the runtime."""
    parts = module.split(".")
    return (parts[1] if len(parts) > 1 else "") if parts[0] == "executors" else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in LAYERS for p in (ROOT / pkg).rglob("*.py")}


def imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` imports (a ``from pkg import name`` of a submodule counts
    as that submodule; otherwise as the package's __init__)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # `import flow.table.x` -> the longest known prefix
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported(path, name, modules) for name, path in modules.items()}


def test_packages_import_only_the_layers_below():
    wrong = sorted(
        f"{a} -> {b}"
        for a, deps in import_graph().items()
        for b in deps
        if b.split(".")[0] != a.split(".")[0] and b.split(".")[0] not in LAYERS[a.split(".")[0]]
    )
    assert wrong == [], "imports against the layers (docs/architecture.md):\n" + "\n".join(wrong)


def role_breaks(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} -> {b}"
        for a, deps in graph.items()
        if role(a) is not None
        for b in deps
        if role(b) is not None and role(b) != role(a) and role(b) not in ROLES[role(a)]
    )


def test_runtime_roles_import_only_the_roles_below_and_gateway_and_worker_never_each_other():
    graph = import_graph()
    assert {role(m) for m in graph if role(m) is not None} == set(ROLES), "a runtime module outside the roles"
    assert role_breaks(graph) == [], "imports against the runtime's roles (docs/architecture.md):\n" + "\n".join(
        role_breaks(graph)
    )


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_the_checks_see_a_circle_and_a_layer_break():
    # the checker itself must be able to fail: a made-up graph with both faults
    graph = {"flow.a": {"optimizer.b"}, "optimizer.b": {"flow.a"}, "kvs.c": set()}
    assert circles(graph) == [["flow.a", "optimizer.b"]]
    assert "optimizer" not in LAYERS["flow"]
    broken = {"executors.worker.a": {"executors.gateway.b"}, "executors.gateway.b": {"executors.wire.c"}}
    assert role_breaks(broken) == ["executors.worker.a -> executors.gateway.b"]
