"""Operator code shipped by value (cloudpickle, as plans ship it) names the user's file and
line in its tracebacks once built; the user's part of an operator error's traceback."""

from __future__ import annotations

import importlib
import pickle
import sys
import textwrap
import traceback

import cloudpickle
import pytest

from flow.errors import OperatorFailedError
from flow.operators import _invoke, build_callable
from flow.tracebacks import REPL, operator_traceback

SOURCE = textwrap.dedent("""
    def helper(x):
        raise ValueError(f"bad {x}")


    def boom(row):
        return helper(row)


    class Model:
        def __init__(self):
            self.scale = 1 / 0

        def __call__(self, t):
            return t
    """)


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """``boom`` and ``Model`` of a user module, pickled by value and loaded where the module
    cannot be imported (as on an executor)."""
    path = tmp_path / "usermod.py"
    path.write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("usermod")
    cloudpickle.register_pickle_by_value(mod)
    try:
        data = cloudpickle.dumps((mod.boom, mod.Model))
    finally:
        cloudpickle.unregister_pickle_by_value(mod)
        del sys.modules["usermod"]
    boom, model = pickle.loads(data)
    assert boom.__code__.co_filename == "<dynamic-code>"  # what cloudpickle gives: no file
    return path, boom, model


def line_of(text: str) -> int:
    return next(i for i, line in enumerate(SOURCE.splitlines(), 1) if text in line)


def test_a_row_function_names_its_file_and_line_and_its_helpers_too(shipped):
    path, boom, _ = shipped
    call = build_callable(boom, None, "boom")
    with pytest.raises(OperatorFailedError) as err:
        _invoke("boom", call, 3, 7)
    shown = operator_traceback(err.value)
    assert [line for line in shown.splitlines() if line.strip(" ^~")] == [  # carets aside (Python versions differ)
        "Traceback (most recent call last):",
        f'  File "{path}", line {line_of("return helper(row)")}, in boom',
        "    return helper(row)",
        f'  File "{path}", line {line_of("raise ValueError")}, in helper',
        '    raise ValueError(f"bad {x}")',
        "ValueError: bad 3",
    ]


def test_a_constructor_that_fails_at_build_names_its_file_and_line(shipped):
    path, _, model = shipped
    with pytest.raises(OperatorFailedError, match="building it failed: ZeroDivisionError") as err:
        build_callable(model, None, "Model")
    frames = traceback.extract_tb(err.value.__cause__.__traceback__)
    assert (frames[-1].filename, frames[-1].lineno, frames[-1].name) == (str(path), line_of("1 / 0"), "__init__")
    assert f'File "{path}", line {line_of("1 / 0")}, in __init__' in operator_traceback(err.value)


def test_code_from_a_repl_says_it_has_no_file():
    namespace = {"__name__": "__main__"}  # what a REPL's functions see: no __file__
    exec(compile("def f(row):\n    raise KeyError(row)\n", "<stdin>", "exec"), namespace)
    f = pickle.loads(cloudpickle.dumps(namespace["f"]))
    with pytest.raises(OperatorFailedError) as err:
        _invoke("f", build_callable(f, None, "f"), 1, 0)
    assert f'File "{REPL}", line 2, in f' in operator_traceback(err.value)


def test_code_that_was_not_pickled_keeps_its_file_and_an_output_error_has_no_traceback():
    def local(row):
        raise RuntimeError("here")

    with pytest.raises(OperatorFailedError) as err:
        _invoke("local", build_callable(local, None, "local"), 1, 0)
    assert f'File "{__file__}"' in operator_traceback(err.value)
    assert "flow/operators.py" not in operator_traceback(err.value)  # the runtime's frame left out
    assert operator_traceback(OperatorFailedError("returned 2 values; expected 1")) is None
