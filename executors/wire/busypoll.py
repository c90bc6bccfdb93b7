"""Busy polling: after a message, a gateway or executor keeps polling its sockets for a
short while instead of sleeping in the kernel.

Why: on a multi-process data path every hop wakes a sleeping process, and a process (on a
VM, a halted vCPU) that has just been woken runs slowly for a while. Measured on this
project's 2-core VM, the Ensemble's in-process compute took 260 us run back to back, 420
us after 0.5 ms idle and 1,070 us after 5 ms idle. A process that polls for
``busy_poll_ms`` after each message catches the next one hot (benchmarks/README.md, the
Ensemble side by side with the previous runtime: p50 at concurrency 1 went from 2.80x to
2.17x the one-process floor, throughput at concurrency 8 from 0.86x to 1.08x).

It costs CPU only right after traffic: each poll yields the CPU to any runnable process
(``sched_yield``), so a polling process uses idle time rather than taking it from the
work, and an idle cluster sleeps. ``busy_poll_ms=0`` turns it off (e.g. on machines billed
per CPU-second, or where power matters more than latency).
"""

from __future__ import annotations

import os
import time

from flow.configuration import Number, check_value

DEFAULT_MS = 10.0
MAX_MS = 1000.0  # a longer window is a busy loop, not a latency setting
#: the check of every busy polling setting (ClusterConfig.busy_poll_ms, KubeConfig.busy_poll_ms)
WINDOW_MS = Number(ge=0, le=MAX_MS, note="ms; 0: off")


#: a yield that took longer than this gave the CPU to another process's time slice;
#: LOST_YIELDS of them within LOST_WINDOW_S mean the machine is busy with other work, and
#: polling stops for BUSY_BACKOFF_S (BusyPoll.pause)
LOST_YIELD_S = 1e-3
LOST_YIELDS = 3
LOST_WINDOW_S = 0.1
BUSY_BACKOFF_S = 0.5


class BusyPoll:
    """The window after the last message during which polling is worth it."""

    def __init__(self, ms: float = DEFAULT_MS):
        check_value(ms, "busy polling window", WINDOW_MS)  # a ConfigError (a ValueError) if out of range
        self.window_s = float(ms) / 1000.0
        self._until = 0.0
        self._cold_until = 0.0  # no polling before this: yields kept losing the CPU
        self._lost = 0  # yields lost since _first_lost
        self._first_lost = 0.0

    def touch(self) -> None:
        """A message came or went: stay hot for the window from now (unless backing off)."""
        if self.window_s:
            now = time.perf_counter()
            if now >= self._cold_until:
                self._until = now + self.window_s

    def hot(self) -> bool:
        return self.window_s > 0 and time.perf_counter() < self._until

    def pause(self) -> None:
        """Between two polls: let any runnable process have this CPU first.

        If others keep taking it for a time slice (LOST_YIELDS yields within LOST_WINDOW_S
        came back over LOST_YIELD_S late), the machine is busy with other work: this process
        stops polling for BUSY_BACKOFF_S. A poller that yields to a busy process gets the
        CPU back only when that one's slice ends, while a sleeper is run as soon as its
        message wakes it: on this project's 2-core VM, a two-process round trip beside two
        CPU-bound processes had a p90 of 2-7.6 ms polling and 36-51 us sleeping or backing
        off (``python -m benchmarks polling``). There every yield loses its slice. One lost
        yield alone is no such sign: on the quiet VM a polling gateway lost one (1.0-1.8 ms:
        the hypervisor, an interrupt) about 3 times a second, and backing off on each kept
        it asleep 60-85% of the time, so an executor's answer had to wake it (+40 us a
        request at concurrency 1; benchmarks/README.md, "Busy polling"). Polling pays where it
        keeps an otherwise idle CPU awake; after the back-off it is tried again."""
        t0 = time.perf_counter()
        os.sched_yield()
        t1 = time.perf_counter()
        if t1 - t0 > LOST_YIELD_S:
            if t1 - self._first_lost > LOST_WINDOW_S:
                self._first_lost, self._lost = t1, 0
            self._lost += 1
            if self._lost >= LOST_YIELDS:
                self._lost = 0
                self._until = 0.0
                self._cold_until = t1 + BUSY_BACKOFF_S
