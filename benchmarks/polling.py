"""Busy polling beside other work: a round trip between two processes that wait the way the
runtime's IO loops do (executors/wire/busypoll.py), on an idle machine and beside CPU-bound
processes (one per core: other tenants' work).

    python -m benchmarks polling [--round-trips 3000] [--reps 2]

Ways of waiting, each process polling its socket with ``select`` and a ``BusyPoll``:
- poll: yield the CPU between polls for the whole window (without the runtime's back-off);
- sleep: no polling (``busy_poll_ms=0``): wait in the kernel, woken by the message;
- runtime: ``BusyPoll`` as it is (a yield that lost the CPU for a time slice stops polling
  for ``BUSY_BACKOFF_S``).
One side sends a byte every 0.3 ms plus the round trip (a client at concurrency 1); p50/p90
of the round trip.
"""

from __future__ import annotations

import argparse
import os
import selectors
import socket
import statistics
import time

from benchmarks.common import progress, save
from executors.wire.busypoll import BusyPoll


class _PlainPoll(BusyPoll):
    """Polling for the whole window, whatever the yields say (the runtime before the back-off)."""

    def pause(self) -> None:
        os.sched_yield()


def _wait(sock, poll: BusyPoll | None) -> None:
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    try:
        while True:
            hot = poll is not None and poll.hot()
            if sel.select(0 if hot else 1.0):
                sock.recv(64)
                if poll is not None:
                    poll.touch()
                return
            if hot:
                poll.pause()
    finally:
        sel.close()


def _round_trips(way: str, n: int) -> tuple[float, float]:
    def poller():
        return {"poll": _PlainPoll(10), "sleep": None, "runtime": BusyPoll(10)}[way]

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the echoing side
        try:
            poll = poller()
            for _ in range(n + 50):
                _wait(b, poll)
                b.send(b"y")
        finally:
            os._exit(0)
    poll = poller()
    times = []
    for _ in range(n + 50):
        t0 = time.perf_counter()
        a.send(b"x")
        if poll is not None:
            poll.touch()
        _wait(a, poll)
        times.append(time.perf_counter() - t0)
        time.sleep(0.0003)
    os.waitpid(pid, 0)
    a.close()
    b.close()
    times = sorted(times[50:])
    return times[len(times) // 2] * 1e6, times[int(len(times) * 0.9)] * 1e6


def _hogs(k: int) -> list[int]:
    pids = []
    for _ in range(k):
        pid = os.fork()
        if pid == 0:
            while True:
                pass
        pids.append(pid)
    return pids


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks polling", description=__doc__.split("\n\n")[0])
    p.add_argument("--round-trips", type=int, default=3000)
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    out: dict = {}
    for beside in ("idle", f"{cores} CPU-bound processes"):
        hogs = _hogs(cores) if beside != "idle" else []
        try:
            for _ in range(args.reps):
                for way in ("poll", "sleep", "runtime"):
                    p50, p90 = _round_trips(way, args.round_trips)
                    out.setdefault(beside, {}).setdefault(way, []).append({"p50_us": p50, "p90_us": p90})
                    progress(f"beside {beside}: {way}: round trip p50 {p50:.1f} us, p90 {p90:.1f} us")
        finally:
            for pid in hogs:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
    medians = {
        beside: {
            way: {k: statistics.median(r[k] for r in rs) for k in ("p50_us", "p90_us")} for way, rs in ways.items()
        }
        for beside, ways in out.items()
    }
    for beside, ways in medians.items():
        progress(
            f"beside {beside}: "
            + "; ".join(f"{w} p50 {f['p50_us']:.0f} us / p90 {f['p90_us']:.0f} us" for w, f in ways.items())
        )
    save("polling", {"round_trips": args.round_trips, "reps": args.reps, "medians": medians, "per_rep": out})
    return medians


if __name__ == "__main__":
    run()
