"""Helpers for the kvs tests: run code in a forked child, wait with a deadline."""

from __future__ import annotations

import os
import pickle
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any


def run_in_fork(fn: Callable[[], Any], timeout: float = 30.0) -> Any:
    """Run ``fn`` in a ``fork``ed child; return its (picklable) result or re-raise its
    error as an AssertionError with the child's traceback."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        os.close(read_fd)
        try:
            payload = pickle.dumps(("ok", fn()))
        except BaseException:
            payload = pickle.dumps(("error", traceback.format_exc()))
        with os.fdopen(write_fd, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as inp:
        data = inp.read()  # EOF when the child exits
    deadline = time.monotonic() + timeout
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("forked child did not exit")
        time.sleep(0.01)
    if not data:
        raise AssertionError("forked child died without a result")
    status, value = pickle.loads(data)
    if status == "error":
        raise AssertionError(f"forked child failed:\n{value}")
    return value


# Data that loads slowly: a server given these settings sleeps 40 ms after each key it
# reads back, and answers clients (LOADING) after each KB it reads, as a big store does every
# few MB; SLOW_KEYS incompressible keys of 2 KB in its AOF's base file take about 3 s
SLOW_LOAD = ("key-load-delay 40000", "loading-process-events-interval-bytes 1024")
SLOW_KEYS = 75


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` passes (bounded; returns the
    last result so the caller can assert on it)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


class InvalidationRecorder:
    """A ``CachedKVS`` invalidation listener that tests can wait on."""

    def __init__(self):
        self._cond = threading.Condition()
        self.events: list[list[str] | None] = []

    def __call__(self, keys):
        with self._cond:
            self.events.append(keys)
            self._cond.notify_all()

    def wait_for_key(self, key: str, timeout: float = 5.0) -> bool:
        """Wait until ``key`` was invalidated (or everything was flushed)."""
        with self._cond:
            return self._cond.wait_for(lambda: any(e is None or key in e for e in self.events), timeout)

    def wait_for_flush(self, timeout: float = 5.0, count: int = 1) -> bool:
        """Wait until the cache was flushed ``count`` times (a Cluster's cache flushes once
        for each node whose invalidation connection was lost)."""
        with self._cond:
            return self._cond.wait_for(lambda: sum(e is None for e in self.events) >= count, timeout)

    def clear(self) -> None:
        with self._cond:
            self.events.clear()
