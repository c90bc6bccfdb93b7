"""Which gateway runs the control loop when several serve one cluster: a lease.

Every gateway serves requests; the one holding the lease also runs the autoscaler and the
SLO tuner (``executors/hosts/scaling.py``), and the others follow its decisions
(``executors/hosts/scaling_board.py``). When the holder dies, its lease runs out and another
gateway takes it, ``lease_s`` (3 s) after the holder's last renewal at most, plus one
``retry_s``; a holder that stops on purpose hands it over at once (``resign``).

One interface (``Lease``), two leases: ``StoreLease`` here, a lock in the cluster's store
(the local cluster; standalone gateways by default), and ``k8s.leadership.KubeLease``, a
coordination.k8s.io Lease (Kubernetes).

Two gateways never act at once:

* **Time.** A holder counts its lease from the moment it *sent* the request that took or
  renewed it, and stops acting ``lease_s x (1 - DRIFT)`` later unless a renewal succeeded
  meanwhile (``fence()`` is None from then on). The store counts the same lease from when it
  *received* that request, and only then may another gateway take it: the old holder has
  stopped before the new one can start. ``DRIFT`` covers clocks that run at different rates.
* **Fencing.** Every taking of the lease gets the next number of a counter in the store
  (``Fence``, an INCR): its fencing token. Every decision carries the token of the lease it
  was made under, and whoever acts on it checks that the token is still the current one
  atomically with the act: the store's placement records and decision log (one Lua script,
  ``scaling_board.py``), the local supervisor before it starts or stops an executor
  process, the Kubernetes backend before it scales a Deployment. A holder that was paused
  past its lease (a long GC pause, SIGSTOP, a migrated VM) and wakes up in the middle of a
  decision is refused there, whatever its clock says.

    lease = StoreLease(store.redis, "gateway-1@host:4242")
    task = asyncio.create_task(lease.run())
    token = lease.fence()          # an int while this process holds the lease, else None
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

log = logging.getLogger("flowserve.leadership")

LEASE_S = 3.0  # a dead leader's lease runs out this long after its last renewal
DRIFT = 0.1  # the share of a lease a holder gives up, for clocks that run at different rates
LEASE_KEY = "flowserve:{scaling}:lease"  # "<identity> <token>", PX lease_s
FENCE_KEY = "flowserve:{scaling}:fence"  # the counter fencing tokens come from (INCR)

# Take the lease if nobody holds it; the token is the counter's next number. One script, so
# that a token is only ever issued to whoever got the lease. -> {token, holder}; token 0
# when someone else holds it (holder: their value).
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if held then return {0, held} end
local token = redis.call('INCR', KEYS[2])
local value = ARGV[1] .. ' ' .. token
redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
return {token, value}
"""

# Extend the lease only if it is still this holder's (same identity, same token).
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def identity(role: str = "gateway") -> str:
    """A name for this process in a lease, unique per process (a container restarted in
    place keeps its pod's name; the new process must not take the old one's lease for its
    own): ``gateway-<pod or host>-<pid>-<random>``, no spaces."""
    host = os.environ.get("POD_NAME") or socket.gethostname() or "host"
    return f"{role}-{host}-{os.getpid()}-{uuid.uuid4().hex[:6]}".replace(" ", "_")


class Fence:
    """The fencing counter in the store: each taking of a lease ``issue``s the next token;
    ``admits(token)`` is true while no lease has been taken since that token's."""

    def __init__(self, redis, key: str = FENCE_KEY):
        self.redis = redis
        self.key = key

    def issue(self) -> int:
        return int(self.redis.incr(self.key))

    def current(self) -> int | None:
        value = self.redis.get(self.key)
        return None if value is None else int(value)

    def admits(self, token: int | None) -> bool:
        # equal, not merely >=: a store that restarted empty counts again from 1, and a
        # holder of an old, higher token must not act on it
        return token is not None and self.current() == token


class Lease:
    """One process's side of a lease, held or sought; subclasses talk to where it is kept.

    ``run()`` takes the lease when it is free and renews it every ``renew_s`` while held;
    ``fence()`` is the token to act under (None when not holding it, or when the last
    renewal is too old to be sure). ``on_change(leading)`` is called when that changes.
    The blocking calls (``try_acquire``, ``try_renew``, ``release``) run in a thread."""

    def __init__(
        self,
        identity: str,
        *,
        lease_s: float = LEASE_S,
        renew_s: float | None = None,
        retry_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not lease_s > 0:
            raise ValueError(f"lease_s must be > 0 seconds, got {lease_s!r}")
        self.identity = identity
        self.lease_s = float(lease_s)
        self.renew_s = renew_s if renew_s is not None else lease_s / 3  # two renewals may fail in a row
        self.retry_s = retry_s if retry_s is not None else lease_s / 6
        self.clock = clock
        self.holder: str | None = None  # who held it when last seen (an identity)
        self.on_change: Callable[[bool], None] | None = None
        self.taken = 0  # times this process took the lease
        self._token: int | None = None
        self._valid_until = 0.0
        self._leading = False
        self._failing = False

    # -- what a subclass provides (blocking) --------------------------------------------------

    def try_acquire(self) -> int | None:
        """Take the lease if it is free; its fencing token, else None (``holder`` updated)."""
        raise NotImplementedError

    def try_renew(self, token: int) -> int | None:
        """Extend the lease held under ``token``; the token to act under from now on, or
        None when the lease is not this process's any more."""
        raise NotImplementedError

    def release(self, token: int) -> None:
        """Give the lease up now, if it is still held under ``token``."""
        raise NotImplementedError

    # -- the loop ------------------------------------------------------------------------------

    def fence(self) -> int | None:
        """The fencing token while this process holds the lease and may act on it."""
        if self._token is not None and self.clock() < self._valid_until:
            return self._token
        return None

    @property
    def leading(self) -> bool:
        return self.fence() is not None

    def step(self) -> None:
        """One round: take the lease, or renew it (blocking)."""
        sent = self.clock()  # before the request: the store counts the lease from later
        if self._token is None:
            token = self.try_acquire()
            if token is not None:
                self.taken += 1
                log.warning("%s took the lease (fencing token %d)", self.identity, token)
        else:
            token = self.try_renew(self._token)
            if token is None:
                log.warning("%s lost the lease (token %d); %s holds it", self.identity, self._token, self.holder)
        self._token = token
        self._valid_until = sent + self.lease_s * (1 - DRIFT) if token is not None else 0.0
        if token is not None:
            self.holder = self.identity

    def _note(self) -> None:
        leading = self.leading
        if leading != self._leading:
            self._leading = leading
            if self.on_change is not None:
                self.on_change(leading)

    def next_in(self) -> float:
        """Seconds to the next round: a holder renews, a candidate retries, and a holder
        whose renewals fail retries sooner, while its lease still runs."""
        if self._token is None:
            return self.retry_s
        return self.renew_s if not self._failing else min(self.renew_s, self.retry_s)

    async def run(self) -> None:
        """Seek and keep the lease until cancelled (then give it up: ``resign``)."""
        try:
            while True:
                try:
                    await asyncio.to_thread(self.step)
                    self._note()
                    if self._failing:
                        log.warning("%s reaches the lease again", self.identity)
                    self._failing = False
                except Exception as e:  # the store or API server may be restarting: the lease runs out by itself
                    if not self._failing:
                        log.warning("%s cannot reach the lease (%s: %s); retrying", self.identity, type(e).__name__, e)
                    self._failing = True
                    self._note()  # a holder whose renewals fail stops acting when its time is up
                await asyncio.sleep(self.next_in())
                self._note()
        finally:
            await self.resign()

    async def resign(self) -> None:
        """Stop acting and give the lease up, so another gateway takes it at once."""
        token, self._token = self._token, None
        self._valid_until = 0.0
        self._note()
        if token is None:
            return
        try:
            await asyncio.shield(asyncio.to_thread(self.release, token))
            log.warning("%s gave the lease up (token %d)", self.identity, token)
        except Exception as e:  # unreachable: the lease runs out by itself
            log.warning("%s could not give the lease up (%s); it runs out in %.0f s", self.identity, e, self.lease_s)

    def status(self) -> dict:
        """What /healthz shows: whether this gateway leads, under which token, who does."""
        token = self.fence()
        return {"leader": token is not None, "fence": token, "holder": self.holder, "identity": self.identity}


class StoreLease(Lease):
    """A lease kept in the cluster's store: one key, ``SET`` only if absent with an expiry
    (``PX``), its value this process's identity and fencing token; renewed by a script that
    extends it only if it still holds that value.

        lease = StoreLease(redis, identity())
    """

    def __init__(self, redis, identity: str, *, key: str = LEASE_KEY, fence_key: str = FENCE_KEY, **timing):
        super().__init__(identity, **timing)
        if " " in identity:
            raise ValueError(f"a lease identity must not contain spaces, got {identity!r}")
        self.redis = redis
        self.key = key
        self.fence_key = fence_key
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    def _ms(self) -> int:
        return max(1, int(self.lease_s * 1000))

    def try_acquire(self) -> int | None:
        token, value = self._acquire(keys=[self.key, self.fence_key], args=[self.identity, self._ms()])
        self.holder = _holder(value)
        return int(token) or None

    def try_renew(self, token: int) -> int | None:
        if self._renew(keys=[self.key], args=[f"{self.identity} {token}", self._ms()]):
            return token
        self.holder = _holder(self.redis.get(self.key))
        return None

    def release(self, token: int) -> None:
        self._release(keys=[self.key], args=[f"{self.identity} {token}"])


def _holder(value) -> str | None:
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text.rsplit(" ", 1)[0]


def store_holder(redis, key: str = LEASE_KEY) -> tuple[str, int] | None:
    """Who holds the store's lease and under which token, or None (for status and tests)."""
    value = redis.get(key)
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    who, token = text.rsplit(" ", 1)
    return who, int(token)
