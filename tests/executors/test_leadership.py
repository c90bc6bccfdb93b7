"""The lease that elects which gateway runs the control loop, and the fencing that keeps a
gateway that lost it from acting: against a real Redis server (executors/hosts/leadership.py,
executors/hosts/scaling_board.py).

Leases here are short (1 s) so expiry shows quickly; the waits poll the lease itself."""

from __future__ import annotations

import asyncio
import time

import pytest

from executors.hosts.leadership import DRIFT, FENCE_KEY, LEASE_KEY, Fence, StoreLease, store_holder
from executors.hosts.scaling_board import ScalingBoard

LEASE_S = 1.0


def lease(kvs, who: str, **timing) -> StoreLease:
    return StoreLease(kvs.redis, who, lease_s=LEASE_S, **timing)


def until(what: str, cond, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


def test_one_gateway_holds_the_lease_and_another_takes_it_only_once_it_ran_out(kvs):
    a, b = lease(kvs, "gw-a"), lease(kvs, "gw-b")
    sent = time.monotonic()
    a.step()
    assert a.fence() == 1 and store_holder(kvs.redis) == ("gw-a", 1)
    b.step()
    assert b.fence() is None and b.holder == "gw-a"  # held: no token issued to b

    # a stops renewing (it died, or froze): b keeps trying until the store lets it in
    a_stopped = []

    def b_took_it():
        if a.fence() is None and not a_stopped:
            a_stopped.append(time.monotonic())
        b.step()
        return b.fence()

    assert until("b to take the lease", b_took_it) == 2
    took = time.monotonic()
    assert took - sent >= LEASE_S  # not before a's lease ran out in the store
    # and a had stopped acting before that, by its own clock
    assert a_stopped and a_stopped[0] < took and a_stopped[0] - sent <= LEASE_S * (1 - DRIFT) + 0.05
    assert store_holder(kvs.redis) == ("gw-b", 2)
    fence = Fence(kvs.redis)
    assert fence.admits(2) and not fence.admits(1) and not fence.admits(None)


def test_renewal_extends_only_the_holders_own_lease(kvs):
    a, b = lease(kvs, "gw-a"), lease(kvs, "gw-b")
    a.step()
    assert b.try_renew(1) is None  # b cannot extend a's lease, even naming a's token
    assert a.try_renew(2) is None  # nor a, under a token it was not given
    kvs.redis.pexpire(LEASE_KEY, 200)
    assert a.try_renew(1) == 1
    assert kvs.redis.pttl(LEASE_KEY) > 500  # extended to a whole lease again
    a.release(1)
    assert kvs.redis.get(LEASE_KEY) is None
    b.step()
    assert b.fence() == 2


def test_a_holder_paused_past_its_lease_is_fenced_out_of_every_write(kvs):
    """A gateway that froze (a GC pause, SIGSTOP) while holding the lease wakes up after
    another took it: its clock stops it, and the store refuses what it would still write."""
    board = ScalingBoard(kvs.redis)
    a, b = lease(kvs, "gw-a"), lease(kvs, "gw-b")
    a.step()
    assert board.post_placement(1, "f", 3, {"s": ["e0"]}, [{"to": 1}])
    until("a's lease to run out", lambda: kvs.redis.get(LEASE_KEY) is None)
    b.step()
    assert b.fence() == 2
    # a wakes up: its own clock says its lease is over...
    assert a.fence() is None
    # ...and had it decided just before freezing, its writes are refused all the same
    assert not board.post_placement(1, "f", 3, {"s": ["e0", "e1"]}, [{"to": 2}])
    assert a.try_renew(1) is None  # it learns it lost the lease
    assert board.placements()["f"]["stages"] == {"s": ["e0"]}
    assert board.post_placement(2, "f", 3, {"s": ["e0", "e2"]}, [{"to": 2, "token": 2}])
    assert [d["to"] for d in board.decisions()] == [1, 2]  # one decision per leader, none of a's late one


def test_a_store_that_restarted_empty_fences_out_the_tokens_it_issued_before(kvs):
    a = lease(kvs, "gw-a")
    for _ in range(3):
        a.release(a.try_acquire())
    a.step()
    assert a.fence() == 4
    kvs.redis.flushall()  # the store came back empty: the counter starts again
    assert not Fence(kvs.redis).admits(4)
    assert a.try_renew(4) is None
    b = lease(kvs, "gw-b")
    b.step()
    assert b.fence() == 1 and not Fence(kvs.redis).admits(4)


def test_resigning_hands_the_lease_over_at_once(kvs):
    async def main():
        a = lease(kvs, "gw-a", retry_s=0.05)
        b = lease(kvs, "gw-b", retry_s=0.05)
        changes = []
        b.on_change = changes.append
        ta = asyncio.create_task(a.run())
        while not a.leading:
            await asyncio.sleep(0.01)
        tb = asyncio.create_task(b.run())
        while b.holder != "gw-a":  # b tried, and found a holding it
            await asyncio.sleep(0.01)
        assert not b.leading
        t0 = time.monotonic()
        ta.cancel()  # a stops on purpose: it gives the lease up
        with pytest.raises(asyncio.CancelledError):
            await ta
        while not b.leading:
            await asyncio.sleep(0.01)
        took = time.monotonic() - t0
        tb.cancel()
        with pytest.raises(asyncio.CancelledError):
            await tb
        return took, changes

    took, changes = asyncio.run(main())
    assert took < LEASE_S / 2  # well before a's lease would have run out
    assert changes == [True, False]  # b led, then resigned when cancelled
    assert kvs.redis.get(LEASE_KEY) is None and int(kvs.redis.get(FENCE_KEY)) == 2


def test_a_lease_identity_with_spaces_is_refused(kvs):
    with pytest.raises(ValueError, match="must not contain spaces, got 'gw a'"):
        StoreLease(kvs.redis, "gw a")
