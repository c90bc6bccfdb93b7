"""One exception tree (flow/errors.py): every exception class the project's packages
define is a FlowError, under exactly one branch that says what the caller does, with one
parent of ours (builtin bases are mixins), a name of its own, and a line in the tree's
drawing. A class outside the tree must be in ALLOWED, saying why."""

from __future__ import annotations

import ast
import builtins
import importlib
import pickle
from pathlib import Path

import pytest

from flow import errors
from flow.errors import (
    DataError,
    DeadlineExceededError,
    FlowDefinitionError,
    FlowError,
    InternalError,
    OperatorError,
    RetryableError,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("flow", "optimizer", "kvs", "executors", "k8s", "flowserve")
BRANCHES = (FlowDefinitionError, DataError, OperatorError, RetryableError, DeadlineExceededError, InternalError)

# Exceptions that are not errors a caller sees: signals raised and caught inside one place.
ALLOWED = {
    "RejectRow": "users raise it inside an operator; the runtime turns it into RowRejectedError",
    "Invalid": "a config check's signal; Config turns it into the class's ConfigError",
    "_PortInUse": "kvs.server's signal to pick another port; caught where raised",
    "_Refused": "the HTTP parser's signal that a limit answered the request; caught where raised",
    "RequestFailed": "carries an answer already mapped (status and body) inside the gateway",
    "LoadFailed": "carries a deploy's answer already mapped (status and body) inside the gateway",
}


def exception_classes() -> list[type[BaseException]]:
    """Every exception class defined at the top of a module of the project's packages."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            names = [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)]
            if not names:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
            for name in names:
                cls = getattr(module, name)
                if isinstance(cls, type) and issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                    out.append(cls)
    return out


CLASSES = exception_classes()
TREE = [c for c in CLASSES if issubclass(c, FlowError)]


def ours(cls: type) -> bool:
    return cls.__module__.split(".")[0] in PACKAGES


def test_every_exception_class_is_in_the_tree_or_says_why_not():
    outside = sorted(c.__name__ for c in CLASSES if not issubclass(c, FlowError))
    assert outside == sorted(ALLOWED), "a class outside flow.errors.FlowError: derive it from a branch"
    assert len(TREE) >= 30  # the walk found the packages' classes, not only the branches


def test_one_parent_of_ours_and_builtin_mixins_only():
    for cls in TREE:
        if cls is FlowError:
            continue
        mine = [b for b in cls.__bases__ if ours(b)]
        others = [b for b in cls.__bases__ if not ours(b)]
        assert len(mine) == 1, f"{cls.__name__}: bases {cls.__bases__} (one parent in the tree, no diamonds)"
        assert all(getattr(builtins, b.__name__, None) is b for b in others), f"{cls.__name__}: {others}"


def test_each_class_is_under_exactly_one_branch():
    for cls in TREE:
        if cls is FlowError:
            continue
        under = [b for b in BRANCHES if issubclass(cls, b)]
        assert len(under) == 1, f"{cls.__name__} is under {under}"


def test_names_are_unique_so_an_answer_names_one_class():
    names = [c.__name__ for c in TREE]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_the_tree_is_drawn_in_one_place_with_every_class():
    drawing = errors.__doc__
    missing = [c.__name__ for c in TREE if f" {c.__name__} " not in drawing.replace("─", " ")]
    assert not missing, f"add them to flow/errors.py's drawing: {missing}"


def test_the_client_registry_knows_every_class_and_only_the_tree():
    from executors.errors import tree_classes

    assert set(tree_classes()) == {c.__name__ for c in TREE}
    assert "RequestFailed" not in tree_classes() and "ValueError" not in tree_classes()


@pytest.mark.parametrize("cls", TREE, ids=lambda c: c.__name__)
def test_what_names_the_failure_survives_a_trip_between_processes(cls):
    if cls.__name__ == "KeyNotFoundError":
        error = cls("emb/1")
        assert pickle.loads(pickle.dumps(error)).key == "emb/1"
        return
    error = cls("it failed", operator="net", qid=42)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls and str(back) == "it failed" and (back.operator, back.qid) == ("net", 42)
