"""What operator code may ask of the process running it: the store it can read outside
lookups (e.g. model weights in ``init``), the device to put its models on, and whether the
runtime still wants the run it is in (``wait``, ``cancelled``) and until when (``deadline``).

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
import time

from flow.errors import FlowValueError

_store = None
# .cancel: the run's threading.Event (set_cancel), set when the runtime gives up on it;
# .deadline: its request's deadline, wall clock (set_deadline)
_run = threading.local()
_device = "cpu"
_executor_class = "cpu"
DEVICES = ("cpu", "cuda")
EXECUTOR_CLASSES = ("cpu", "gpu")


def current_store():
    """The KVS of the executor (or of ``flow.run``) running this code."""
    if _store is None:
        raise FlowValueError("no store here: pass kvs= to flow.run, or run inside a deployment")
    reads = getattr(_run, "reads", None)
    return _store if reads is None else _RecordedReads(_store, reads)


@contextlib.contextmanager
def recording_reads(reads: list):
    """Record in ``reads`` what code on this thread reads through ``current_store()``
    meanwhile, as ``(key, what it held)`` pairs: a model constructor that fails on what a
    key held (a torch ``UnpicklingError`` on an array) is reported naming the key
    (``operators.build_callable``)."""
    before = getattr(_run, "reads", None)
    _run.reads = reads
    try:
        yield reads
    finally:
        _run.reads = before


class _RecordedReads:
    """The store as ``current_store()`` gives it while reads are recorded: its reads
    note each key and what it held, everything else is the store's own."""

    def __init__(self, store, reads: list):
        self._store, self._reads = store, reads

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def get(self, key, *args, **kwargs):
        return self._noted(key, self._store.get, key, *args, **kwargs)

    def get_bytes(self, key, *args, **kwargs):
        return self._noted(key, self._store.get_bytes, key, *args, **kwargs)

    def mget(self, keys, *args, **kwargs):
        keys = list(keys)
        values = self._store.mget(keys, *args, **kwargs)
        for k, v in zip(keys, values):
            self._note(k, v)
        return values

    def _noted(self, key, read, *args, **kwargs):
        try:
            value = read(*args, **kwargs)
        except KeyError:  # KeyNotFoundError: it names the key itself
            self._note(key, None, "nothing: no such key")
            raise
        self._note(key, value)
        return value

    def _note(self, key, value, what: str | None = None) -> None:
        # only while the recording lasts: a constructor may keep the store it was given
        # and read it on every request later
        if getattr(_run, "reads", None) is self._reads:
            self._reads.append((key, describe_value(value) if what is None else what))


def describe_value(value) -> str:
    """What a store value is, in a few words: ``an array float64 (3,)``, ``1024 bytes``."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"an array {value.dtype} {tuple(shape)}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{len(value)} bytes"
    if value is None:
        return "None"
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, (dict, list)):
        return f"JSON (a {type(value).__name__} of {len(value)})"
    num_rows = getattr(value, "num_rows", None)
    if isinstance(num_rows, int):
        return f"an Arrow table of {num_rows} rows"
    return f"a {type(value).__name__}"


def reads_note(reads: list, most: int = 4) -> str:
    """``reads`` (``recording_reads``) for an error message: the last few keys read and
    what each held, or "" when none was read."""
    if not reads:
        return ""
    shown = ", ".join(f"{_short(k)} ({what})" for k, what in reads[-most:])
    more = f" and {len(reads) - most} more before" if len(reads) > most else ""
    return f" (it read from the store: {shown}{more})"


def _short(key) -> str:
    text = repr(key)
    return text if len(text) <= 100 else text[:97] + "..."


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
    """Sleep ``seconds``, or less: True if the runtime gave up on this run meanwhile, so an
    operator that waits on something (a remote model, a device, I/O) frees its worker
    thread at once (its output would be dropped anyway). The runtime gives up on a run
    when its client disconnected or its deadline passed (``deadline()``: the time left), and
    on a racing or hedged copy whose race another copy won. A run that serves a batch of
    several requests is given up only when all of them are. In ``flow.run`` (and where the
    runtime never gives up on a run) it sleeps the whole time."""
    ev = getattr(_run, "cancel", None)
    if ev is None:
        ev = _run.idle = getattr(_run, "idle", None) or threading.Event()  # never set: the same kind of wait
    return ev.wait(seconds)


def cancelled() -> bool:
    """True if the runtime gave up on the run this thread is in (see ``wait``)."""
    ev = getattr(_run, "cancel", None)
    return ev is not None and ev.is_set()


def deadline() -> float | None:
    """Seconds left until the deadline of the request this run serves (of the earliest one,
    for a batch of several), 0.0 once it has passed; None where no deadline is set (in
    ``flow.run``). An operator may size its work to it (a shorter search, a smaller model).
    Once the deadline passes the request is answered 504 and the run given up (``wait``
    returns; a batch's run once every one of its requests is given up).

        def search(row):
            left = deadline()
            return beam_search(row.query, width=8 if left is None or left > 0.5 else 2)
    """
    at = getattr(_run, "deadline", None)
    return None if at is None else max(0.0, at - time.time())


def set_cancel(event) -> None:
    """The runtime: the event that tells this thread's run it was given up on (None: none)."""
    _run.cancel = event


def set_deadline(at: float | None) -> None:
    """The runtime: the wall-clock deadline (Unix seconds) of this thread's run (None: none)."""
    _run.deadline = at
