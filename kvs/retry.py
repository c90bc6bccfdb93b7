"""One backoff for every retry loop: jittered exponential delays with a cap.

``Backoff`` is the schedule; ``retry`` and ``retry_async`` run a call until it succeeds,
sleeping the schedule's delays between failures that may heal by themselves. Used by the
KVS client (``Retrier``), the cache's invalidation listener (``kvs/tracking.py``) and the
standalone gateway waiting for its KVS. Clock, sleep and randomness are injectable, so
the schedule is tested without waiting.

    >>> b = Backoff(0.1, 1.0, jitter=0)
    >>> [b.next() for _ in range(6)]
    [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from flow.errors import FlowValueError

T = TypeVar("T")


class Backoff:
    """Delays ``base``, ``2 base``, ``4 base``, ... up to ``cap``, each shortened by a
    random fraction of at most ``jitter`` (0.5: a delay ``d`` becomes one in [d/2, d]),
    so that many clients that lost the same server do not come back in step."""

    __slots__ = ("base", "cap", "jitter", "failures", "_random")

    def __init__(self, base: float, cap: float, *, jitter: float = 0.5, random: Callable[[], float] = random.random):
        for name, value in (("base", base), ("cap", cap), ("jitter", jitter)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not value >= 0
                or value == float("inf")
            ):
                raise FlowValueError(f"Backoff {name} must be a finite number >= 0, got {value!r}")
        if base > cap:
            raise FlowValueError(f"Backoff base must be <= cap, got base={base!r} > cap={cap!r}")
        if jitter > 1:
            raise FlowValueError(f"Backoff jitter must be <= 1, got {jitter!r}")
        self.base, self.cap, self.jitter = base, cap, jitter
        self.failures = 0  # delays handed out since the last reset
        self._random = random

    def next(self) -> float:
        """The delay before the next attempt (one more failure counted)."""
        delay = self.base * 2 ** min(self.failures, 64)  # 2**64 x any base is past any cap
        self.failures += 1
        return min(self.cap, delay) * (1 - self.jitter * self._random())

    def reset(self) -> None:
        """Start over from ``base`` (after a success)."""
        self.failures = 0


class _Budget:
    """What ``retry`` and ``retry_async`` decide after a failure: the delay before the
    next attempt, or None (raise it: not retryable, or the time is up)."""

    __slots__ = ("backoff", "retry_if", "give_up_after", "clock", "deadline")

    def __init__(self, backoff: Backoff, retry_if, give_up_after: float | None, clock):
        self.backoff, self.retry_if, self.clock = backoff, retry_if, clock
        self.give_up_after = float("inf") if give_up_after is None else give_up_after
        self.deadline: float | None = None

    def delay_after(self, error: BaseException) -> float | None:
        if not self.retry_if(error):
            return None
        now = self.clock()
        if self.deadline is None:
            self.deadline = now + self.give_up_after  # counted from the first failure
        remaining = self.deadline - now
        if remaining <= 0:
            return None
        return min(remaining, self.backoff.next())


def retry(
    call: Callable[[], T],
    *,
    backoff: Backoff,
    retry_if: Callable[[BaseException], bool],
    give_up_after: float | None = None,
    on_retry: Callable[[BaseException, float], Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Any] = time.sleep,
    failed: BaseException | None = None,
) -> T:
    """``call()``'s result. An error for which ``retry_if(error)`` is true is retried after
    the next backoff delay, until ``give_up_after`` seconds have passed since the first
    failure (None: for ever); then the last error is raised. A delay never runs past that
    deadline: the last attempt is made at it. Other errors are raised at once.
    ``on_retry(error, delay)`` is told before each sleep (to log it). ``failed``: the
    error of an attempt the caller already made (a hot path tries once on its own and
    comes here only when that fails)."""
    budget = _Budget(backoff, retry_if, give_up_after, clock)
    error = failed
    while True:
        if error is not None:
            delay = budget.delay_after(error)
            if delay is None:
                raise error
            if on_retry is not None:
                on_retry(error, delay)
            sleep(delay)
        try:
            return call()
        except Exception as exc:  # the caller's retry_if decides: retried, or raised as it is
            error = exc


async def retry_async(
    call: Callable[[], Any],
    *,
    backoff: Backoff,
    retry_if: Callable[[BaseException], bool],
    give_up_after: float | None = None,
    on_retry: Callable[[BaseException, float], Any] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep=asyncio.sleep,
) -> Any:
    """``retry`` for the event loop: ``call()`` may return an awaitable (awaited inside the
    attempt, so its errors are retried too), and the delays are ``await sleep(delay)``."""
    budget = _Budget(backoff, retry_if, give_up_after, clock)
    error = None
    while True:
        if error is not None:
            delay = budget.delay_after(error)
            if delay is None:
                raise error
            if on_retry is not None:
                on_retry(error, delay)
            await sleep(delay)
        try:
            result = call()
            return (await result) if inspect.isawaitable(result) else result
        except Exception as exc:  # the caller's retry_if decides: retried, or raised as it is
            error = exc
