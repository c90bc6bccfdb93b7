"""The store that operator code can read outside lookups (e.g. model weights in ``init``).

In a deployment it is the executor's cached KVS; in ``flow.run`` the ``kvs=`` passed in.

    class Net:
        def __init__(self):
            self.weights = current_store().get("models/net")
"""

from __future__ import annotations

import contextlib

from flow.exceptions import FlowError

_store = None


class NoStoreError(FlowError, LookupError):
    """Operator code asked for the store where none is set."""


def current_store():
    """The KVS of the executor (or of ``flow.run``) running this code."""
    if _store is None:
        raise NoStoreError("no store here: pass kvs= to flow.run, or run inside a deployment")
    return _store


def set_store(store) -> None:
    """Set the process-wide store (executors call this once at start)."""
    global _store
    _store = store


@contextlib.contextmanager
def using_store(store):
    """Make ``store`` current for the duration of a ``flow.run``."""
    global _store
    before, _store = _store, store
    try:
        yield store
    finally:
        _store = before
