"""What operator code may ask of the process running it: the store it can read outside
lookups (e.g. model weights in ``init``) and the device to put its models on.

The store is the executor's cached KVS in a deployment, the ``kvs=`` passed in for
``flow.run``. The device is "cuda" on a gpu executor with a GPU, else "cpu"; the runtime
sets both at start (``set_store``, ``set_device``), so this ground-floor module never
imports it. Nothing here touches CUDA: asking for the device never initialises it.

    class Net:
        def __init__(self):
            self.weights = current_store().get("models/net")
            self.model = build().to(current_device())
"""

from __future__ import annotations

import contextlib
import re
import threading

from flow.errors import FlowValueError

_store = None
_run = threading.local()  # .cancel: the running copy's threading.Event (set_cancel), set when it lost its race
_device = "cpu"
_executor_class = "cpu"
DEVICES = ("cpu", "cuda")
EXECUTOR_CLASSES = ("cpu", "gpu")


def current_store():
    """The KVS of the executor (or of ``flow.run``) running this code."""
    if _store is None:
        raise FlowValueError("no store here: pass kvs= to flow.run, or run inside a deployment")
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


def current_device() -> str:
    """Where operator code should put its models: "cuda" on a gpu executor with a GPU, else
    "cpu". A torch device string: ``model.to(current_device())``."""
    return _device


def set_device(device: str) -> None:
    """Set the process-wide device (a gpu executor with a usable GPU sets "cuda" at start;
    "cuda:N" names one GPU of several)."""
    global _device
    if not isinstance(device, str) or not (device in DEVICES or re.fullmatch(r"cuda:(0|[1-9][0-9]*)", device)):
        raise FlowValueError(f"device must be one of {DEVICES} or 'cuda:N', got {device!r}")
    _device = device


def current_executor_class() -> str:
    """The class of the executor running this code ("cpu" or "gpu"), even where a gpu
    executor has no GPU and ``current_device()`` is "cpu" (benchmarks emulate a kernel's
    speed per class with it; ``flow.run`` and profiling say which class they stand for)."""
    return _executor_class


def set_executor_class(cls: str) -> None:
    """Set the process-wide executor class (executors call this once at start)."""
    global _executor_class
    if cls not in EXECUTOR_CLASSES:
        raise FlowValueError(f"executor class must be one of {EXECUTOR_CLASSES}, got {cls!r}")
    _executor_class = cls


@contextlib.contextmanager
def using_executor_class(cls: str):
    """Run as if on an executor of class ``cls`` (the profiler times a stage per class)."""
    before = _executor_class
    set_executor_class(cls)
    try:
        yield cls
    finally:
        set_executor_class(before)


def wait(seconds: float) -> bool:
    """Sleep ``seconds``, or less: True if the runtime gave up on this run meanwhile (a
    racing or hedged copy whose race another copy won: its output is dropped anyway), so
    an operator that waits on something (a remote model, a device, I/O) frees its worker
    thread at once. Outside a racing copy (and in ``flow.run``) it sleeps the whole time."""
    ev = getattr(_run, "cancel", None)
    if ev is None:
        ev = _run.idle = getattr(_run, "idle", None) or threading.Event()  # never set: the same kind of wait
    return ev.wait(seconds)


def cancelled() -> bool:
    """True if the runtime gave up on the run this thread is in (see ``wait``)."""
    ev = getattr(_run, "cancel", None)
    return ev is not None and ev.is_set()


def set_cancel(event) -> None:
    """The runtime: the event that tells this thread's run it lost its race (None: none)."""
    _run.cancel = event
