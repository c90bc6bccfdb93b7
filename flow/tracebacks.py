"""Tracebacks of operator errors that point at the user's own file and line.

A deployed plan carries the user's code by value (cloudpickle), and cloudpickle names every
code object it rebuilds ``"<dynamic-code>"``: it drops ``co_filename`` so that a pickle does
not depend on where the code was written. The line numbers survive, and so does the
module's ``__file__`` in the globals that the rebuilt functions share. ``restore_files``
puts that file back into the code objects when an operator is built, so every traceback
of that code (a constructor's at deploy, a row's at request time, the operator's own
``logging.exception``) names the user's file and line; code defined in a REPL, which has
no file, is named so. ``operator_traceback`` gives the part of an operator error's
traceback that is the user's: from the user's function down, without the runtime's frames.

    restore_files(fn)               # before the operator is first called
    text = operator_traceback(err)  # "Traceback ...\\n  File "/src/app.py", line 5, in f ..."
"""

from __future__ import annotations

import os
import traceback
import types

PICKLED = "<dynamic-code>"  # cloudpickle's co_filename for every code object it rebuilds
REPL = "<defined in a REPL: no source file>"
# the runtime's frames that call user code (flow/operators.py ``_invoke``, ``build_callable``)
_RUNTIME_FILES = tuple(os.path.join(os.path.dirname(__file__), f) for f in ("operators.py", "prediction.py"))


def restore_files(*callables) -> None:
    """Give the code of ``callables`` (functions, classes, their methods, and what else
    the same rebuilt module defines) its source file back where cloudpickle dropped it.
    Code that was not pickled, or that names its file already, is left as it is."""
    seen: set[int] = set()
    todo = list(callables)
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (staticmethod, classmethod)):
            todo.append(obj.__func__)
        elif isinstance(obj, property):
            todo += [f for f in (obj.fget, obj.fset, obj.fdel) if f is not None]
        elif isinstance(obj, types.MethodType):
            todo.append(obj.__func__)
        elif isinstance(obj, types.FunctionType):
            if obj.__code__.co_filename != PICKLED:
                continue  # not rebuilt by cloudpickle: its file is right, and so are its globals'
            obj.__code__ = _refiled(obj.__code__, _file_of(obj.__globals__))
            # what the same module defines (helpers the operator calls) shares these globals
            todo += [v for v in obj.__globals__.values() if isinstance(v, (types.FunctionType, type))]
            todo += [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        elif isinstance(obj, type):
            todo += list(vars(obj).values())
            todo += [b for b in obj.__bases__ if b is not object]
        elif callable(obj) and not isinstance(obj, types.BuiltinFunctionType):
            todo.append(type(obj))  # an instance with __call__


def _file_of(globals_: dict) -> str:
    """The source file of the module whose globals these are, or why there is none."""
    file = globals_.get("__file__")
    if isinstance(file, str) and file:
        return file
    name = globals_.get("__name__")
    return REPL if name in (None, "__main__") else f"<module {name}: no source file>"


def _refiled(code: types.CodeType, file: str) -> types.CodeType:
    consts = tuple(
        _refiled(c, file) if isinstance(c, types.CodeType) and c.co_filename == PICKLED else c for c in code.co_consts
    )
    return code.replace(co_filename=file, co_consts=consts)


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 -- an empty cell raises ValueError
    except ValueError:
        return False
    return True


def operator_traceback(error: BaseException) -> str | None:
    """The user's part of an operator error's traceback: what the user's code raised (the
    error's cause), from the user's function down; None when the error has no such cause
    (the operator returned something wrong: the message says what)."""
    cause = error.__cause__
    if cause is None or cause.__traceback__ is None:
        return None
    tb: types.TracebackType | None = cause.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _RUNTIME_FILES:
        tb = tb.tb_next  # the runtime's frame that called the user's code
    return "".join(traceback.format_exception(type(cause), cause, tb)).rstrip("\n")
