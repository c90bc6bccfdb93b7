"""Cancellation: how soon a client's disconnect frees the worker thread its request holds.

A one-stage flow whose operator waits in ``fs.wait(30)`` (a model call that waits on a
device or a remote service) runs on the local cluster (one executor). Per trial a client
sends it a request over a raw connection, waits until the operator has started (it notes
so in the store), and closes the connection; the operator notes the wall-clock time its
``fs.wait`` returned (the thread is free right after). The figure is that time less the
time of the close: the gateway sees the connection lost, gives the request up and sends
the executor a ``Revoke``, whose IO thread sets the run's event. Trials run idle, then
under load: ``wrk`` keeps 8 connections busy on another flow of the same executor.
Without cancellation the thread would be held for the operator's whole wait (30 s here),
or until the request's deadline.

    python -m benchmarks cancellation [--trials 20] [--load 8]

Writes results/cancellation.json and results/cancellation.png (each trial's time).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from urllib.parse import urlsplit

from benchmarks.common import machine, plt, progress, save, save_plot, wrk


def held(row):
    """Waits up to 30 s; notes when it started and when its wait returned (wall clock)."""
    from flow import current_store, wait

    r = current_store().redis
    r.set(f"bench-cancel:started:{row.x}", 1)
    wait(30)
    r.set(f"bench-cancel:freed:{row.x}", repr(time.time()))
    return row.x


def double(row):
    return row.x * 2


def _poll(condition, seconds: float, what: str):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = condition()
        if got:
            return got
        time.sleep(0.0005)
    raise RuntimeError(f"{what} did not happen within {seconds:g} s")


def _trial(url: str, path: str, redis, x: int) -> float:
    """One request sent, its client gone once the operator runs: seconds to the thread free."""
    where = urlsplit(url)
    body = json.dumps({"x": x}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {where.hostname}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    s = socket.create_connection((where.hostname, where.port))
    s.sendall(head + body)
    _poll(lambda: redis.get(f"bench-cancel:started:{x}"), 30, "the operator's start")
    t0 = time.time()
    s.close()
    freed = _poll(lambda: redis.get(f"bench-cancel:freed:{x}"), 30, "the operator's return")
    return float(freed) - t0


def run(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks cancellation", description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=20, help="trials idle, and as many under load (default 20)")
    p.add_argument("--load", type=int, default=8, help="wrk connections on another flow meanwhile (default 8)")
    args = p.parse_args(argv)

    from executors.hosts.cluster import LocalCluster
    from executors.hosts.cluster_config import ClusterConfig
    from flow import Flow

    with LocalCluster(ClusterConfig(executors=1)) as c:
        f = Flow("held", schema={"x": int})
        f.map(held, names=["x"])
        c.deploy(f)
        g = Flow("double", schema={"x": int})
        g.map(double, names=["y"])
        load = c.deploy(g)
        redis = c.kvs.redis
        idle = [_trial(c.url, "/flows/held", redis, x) for x in range(args.trials)]
        progress(f"idle: median {statistics.median(idle) * 1000:.2f} ms, max {max(idle) * 1000:.2f} ms")

        figures: dict = {}
        seconds = max(10.0, 0.5 * args.trials + 5)  # outlasts the trials (checked below)
        loader = threading.Thread(
            target=lambda: figures.update(wrk(load.url, b'{"x": 1}', args.load, seconds)), daemon=True
        )
        loader.start()
        time.sleep(1.0)  # the load's ramp-up is part of the schedule, not a wait for state
        t_start = time.monotonic()
        loaded = [_trial(c.url, "/flows/held", redis, args.trials + x) for x in range(args.trials)]
        if time.monotonic() - t_start > seconds - 1.0:
            raise RuntimeError("the trials outlasted the load: raise its duration")
        loader.join(seconds + 30)
    progress(
        f"under load (c={args.load}, {figures.get('rps', 0):.0f} req/s on the other flow): "
        f"median {statistics.median(loaded) * 1000:.2f} ms, max {max(loaded) * 1000:.2f} ms"
    )
    result = {
        "trials": args.trials,
        "load_connections": args.load,
        "load": figures,
        "idle_ms": {"median": statistics.median(idle) * 1000, "max": max(idle) * 1000},
        "under_load_ms": {"median": statistics.median(loaded) * 1000, "max": max(loaded) * 1000},
        "idle_trials_ms": [t * 1000 for t in idle],
        "loaded_trials_ms": [t * 1000 for t in loaded],
        "machine": machine(),
    }
    save("cancellation", result)

    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7, 3.5))
    ax.plot(range(1, args.trials + 1), result["idle_trials_ms"], "o", label="idle")
    ax.plot(range(1, args.trials + 1), result["loaded_trials_ms"], "s", label=f"under load (c={args.load})")
    ax.set_xlabel("trial")
    ax.set_ylabel("disconnect to thread free (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("a disconnect frees the worker thread (fs.wait(30) cut short)")
    ax.legend()
    save_plot(fig, "cancellation")
