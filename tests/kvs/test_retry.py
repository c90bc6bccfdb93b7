"""The one backoff (kvs.retry), on an injected clock and sleep: no test waits."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.exceptions import AuthenticationError

from flow.errors import AccessDeniedError, FlowValueError, UnreachableError
from kvs.client import Retrier
from kvs.options import KVSOptions
from kvs.retry import Backoff, retry, retry_async


class FakeTime:
    """A clock that only moves when something sleeps."""

    def __init__(self):
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


def failing(times: int, error=ConnectionError, result="ok"):
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= times:
            raise error(f"failure {len(calls)}")
        return result

    call.calls = calls
    return call


def test_delays_double_up_to_the_cap_and_start_over_after_a_reset():
    b = Backoff(0.01, 0.05, jitter=0)
    assert [b.next() for _ in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]
    assert b.failures == 5
    b.reset()
    assert b.next() == 0.01


def test_jitter_shortens_each_delay_by_at_most_its_fraction():
    assert Backoff(1.0, 8.0, jitter=0.5, random=lambda: 1.0).next() == 0.5
    assert Backoff(1.0, 8.0, jitter=0.5, random=lambda: 0.0).next() == 1.0
    b = Backoff(1.0, 8.0)  # real randomness: always within [d/2, d]
    for expected in (1, 2, 4, 8, 8):
        assert expected / 2 <= b.next() <= expected


def test_a_long_outage_does_not_overflow():
    b = Backoff(0.01, 5.0, jitter=0)
    for _ in range(5000):
        delay = b.next()
    assert delay == 5.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"base": -1, "cap": 1}, "Backoff base must be a finite number >= 0, got -1"),
        ({"base": 1, "cap": float("inf")}, "Backoff cap must be a finite number >= 0, got inf"),
        ({"base": 2, "cap": 1}, "Backoff base must be <= cap, got base=2 > cap=1"),
        ({"base": 1, "cap": 2, "jitter": 1.5}, "Backoff jitter must be <= 1, got 1.5"),
        ({"base": "1", "cap": 2}, "Backoff base must be a finite number >= 0, got '1'"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(FlowValueError, match=message.replace("(", r"\(")):
        Backoff(**kwargs)


def test_retry_sleeps_the_schedule_until_the_call_succeeds():
    t, told = FakeTime(), []
    call = failing(3)
    result = retry(
        call,
        backoff=Backoff(0.1, 1.0, jitter=0),
        retry_if=lambda e: True,
        on_retry=lambda e, d: told.append((str(e), d)),
        clock=t.clock,
        sleep=t.sleep,
    )
    assert result == "ok" and len(call.calls) == 4
    assert t.slept == [0.1, 0.2, 0.4]
    assert told == [("failure 1", 0.1), ("failure 2", 0.2), ("failure 3", 0.4)]


def test_errors_that_will_not_heal_are_raised_at_once():
    t = FakeTime()
    call = failing(1, error=ValueError)
    with pytest.raises(ValueError, match="failure 1"):
        retry(
            call,
            backoff=Backoff(0.1, 1.0),
            retry_if=lambda e: isinstance(e, ConnectionError),
            clock=t.clock,
            sleep=t.sleep,
        )
    assert t.slept == [] and len(call.calls) == 1


def test_retry_gives_up_at_the_deadline_with_a_last_attempt_made_at_it():
    t = FakeTime()
    call = failing(100)
    with pytest.raises(ConnectionError, match="failure 5"):
        retry(
            call,
            backoff=Backoff(0.1, 1.0, jitter=0),
            retry_if=lambda e: True,
            give_up_after=1.0,
            clock=t.clock,
            sleep=t.sleep,
        )
    # 0.1 + 0.2 + 0.4, then the 0.8 delay is cut to the 0.3 s left: attempt 5 at the deadline
    assert t.slept == pytest.approx([0.1, 0.2, 0.4, 0.3])
    assert t.now == pytest.approx(101.0)


def test_retry_async_retries_what_the_awaitable_raises():
    t = FakeTime()
    attempts = []

    async def call():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("not yet")
        return 42

    result = asyncio.run(
        retry_async(
            call, backoff=Backoff(0.2, 5.0, jitter=0), retry_if=lambda e: True, clock=t.clock, sleep=t.async_sleep
        )
    )
    assert result == 42 and t.slept == [0.2, 0.4]
    assert asyncio.run(retry_async(lambda: "plain", backoff=Backoff(0.2, 5.0), retry_if=lambda e: True)) == "plain"


def test_the_kvs_client_gives_up_after_retry_timeout_and_says_how_often_it_tried():
    t = FakeTime()
    options = KVSOptions(retry_timeout=1.0, backoff_base=0.1, backoff_cap=0.5)
    retrier = Retrier("redis://:pw@kvs:6379/0", options, clock=t.clock, sleep=t.sleep)
    call = failing(100, error=redis.ConnectionError)
    with pytest.raises(UnreachableError) as info:
        retrier(call, "GET")
    assert f"GET failed {len(call.calls)} time(s) within retry_timeout=1 s" in str(info.value)
    assert "pw" not in str(info.value) and len(call.calls) >= 4
    assert sum(t.slept) == pytest.approx(1.0)


def test_the_kvs_client_never_retries_refused_credentials():
    t = FakeTime()
    retrier = Retrier("redis://:pw@kvs:6379/0", KVSOptions(), clock=t.clock, sleep=t.sleep)
    call = failing(1, error=AuthenticationError)  # a ConnectionError in redis-py
    with pytest.raises(AccessDeniedError, match="refused the credentials"):
        retrier(call, "GET")
    assert t.slept == [] and len(call.calls) == 1


def test_a_callers_own_failed_attempt_starts_the_schedule():
    t = FakeTime()
    call = failing(1)
    assert (
        retry(
            call,
            backoff=Backoff(0.1, 1.0, jitter=0),
            retry_if=lambda e: True,
            clock=t.clock,
            sleep=t.sleep,
            failed=ConnectionError("first"),
        )
        == "ok"
    )
    assert t.slept == [0.1, 0.2] and len(call.calls) == 2
    with pytest.raises(ValueError, match="not retryable"):
        retry(call, backoff=Backoff(0.1, 1.0), retry_if=lambda e: False, failed=ValueError("not retryable"))
