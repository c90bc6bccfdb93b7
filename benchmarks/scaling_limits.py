"""What grows with the number of executors: the gateway's and the store's work at 10, 100
and 1,000 executors.

A ~60 MB executor process each does not fit 1,000 times on this machine, so every part is
the runtime's own code driven at that size, with real processes and a real store where the
work happens:

* **routing**: a real ``Dispatcher`` with N registered executors; a flow whose one stage
  runs on all N (the worst case: every replica ranked per request), and one on 2 of them
  (N registered, few used). CPU per request of ``Dispatcher._routes``, the part of a
  request's gateway work that depends on N (the rest is the same at any size:
  benchmarks/README.md, "overhead").
* **liveness**: the same dispatcher started, its N ids served by 2 real executor
  processes (several ids to an address; a ping is answered by address), one round of
  ``watch_liveness``'s pings: its wall time and the gateway's CPU per ping.
* **membership**: N ``Heartbeat``s (the executors' own code) beating every
  ``HEARTBEAT_S`` into a real Redis from 4 threads: the store's commands and CPU per
  second, and what one gateway's read of the members (``live_members``, every
  ``poll_s``) costs there.
* **dead executor**: one of the N stops beating; the standalone gateway's check
  (``live_members`` every 0.5 s, ``Absence`` grace 1.5 s) notices it: time from its last
  beat.
* **autoscaler**: ``ScalingLoop.step`` (holding the lease, posting its load to and reading
  every gateway's from the store's board) over N/10 flows of one stage on 10 executors each.

    python -m benchmarks scaling_limits [--sizes 10,100,1000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import free_port, plt, progress, save, save_plot

HERE = Path(__file__).resolve().parent


def double(row):
    return row.x * 2


def _plan(name: str):
    from flow import Flow
    from optimizer import Plan

    f = Flow(name, schema={"x": int})
    f.map(double, names=["y"])
    return Plan.from_flow(f)


def _dispatcher(n: int, addresses: list[str]):
    from executors.gateway.dispatcher import Dispatcher

    d = Dispatcher(f"tcp://127.0.0.1:{free_port()}")
    for i in range(n):
        d.add_executor(f"cpu{i}", addresses[i % len(addresses)])
    return d


def _install(d, name: str, ids: list[str]):
    from executors.gateway.records import DeployedFlow

    plan = _plan(name)
    (stage,) = plan.stages
    for i in ids:
        d.executors[i].loaded.add((name, 1))
    flow = DeployedFlow(plan, 1, {stage: list(ids)})
    d.flows[name] = flow
    return flow


def routing(n: int) -> dict:
    d = _dispatcher(n, ["tcp://127.0.0.1:1"])
    ids = list(d.executors)
    out = {}
    for label, placed in (("all", ids), ("two", ids[:2])):
        flow = _install(d, f"f-{label}", placed)
        calls = max(200, 20_000 // n)
        t0 = time.process_time()
        for _ in range(calls):
            d._routes(flow)
        out[f"route_us_{label}"] = (time.process_time() - t0) / calls * 1e6
    return out


async def _liveness_round(n: int, addresses: list[str]) -> dict:
    from executors.gateway.liveness import LIVENESS_S

    d = _dispatcher(n, addresses)
    d.start()
    try:
        for a in addresses:  # both processes answer before the clock starts
            assert await d.ping(a, 60) is not None, f"executor at {a} does not answer"
        rounds = []
        for _ in range(3):
            w0, c0 = time.monotonic(), time.process_time()
            pongs = await asyncio.gather(*(d.ping(info.address, 10) for info in d.executors.values()))
            rounds.append((time.monotonic() - w0, time.process_time() - c0, sum(p is not None for p in pongs)))
        wall, cpu, answered = min(rounds)
        return {
            "liveness_round_ms": wall * 1e3,
            "liveness_cpu_us_per_ping": cpu / n * 1e6,
            "liveness_cpu_share": cpu / LIVENESS_S,  # of one core, pinging every LIVENESS_S
            "liveness_answered": answered,
        }
    finally:
        await d.close()


def membership(redis, n: int, window_s: float) -> dict:
    from executors.wire.membership import HEARTBEAT_S, Absence, Heartbeat, Member, live_members

    beats = [Heartbeat(redis, Member(f"cpu{i}", f"tcp://10.0.{i // 250}.{i % 250}:5556")) for i in range(n)]
    stop, dead = threading.Event(), threading.Event()
    last_beat = {}

    def beater(mine: list) -> None:
        # each member beats every HEARTBEAT_S, spread over the period as independent executors would be
        step = HEARTBEAT_S / max(1, len(mine))
        while not stop.is_set():
            t0 = time.monotonic()
            for k, hb in enumerate(mine):
                if stop.is_set():
                    return
                if hb is beats[0] and dead.is_set():
                    continue  # the one that died beats no more
                hb.beat()
                if hb is beats[0]:
                    last_beat["t"] = time.monotonic()
                wait = t0 + (k + 1) * step - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # pacing the load generator, not synchronisation

    threads = [threading.Thread(target=beater, args=(beats[k::4],), daemon=True) for k in range(4)]
    for t in threads:
        t.start()
    try:
        for hb in beats:  # every member registered before the window
            hb.beat()
        time.sleep(HEARTBEAT_S)  # one full period of beats before measuring (load generation)
        info0, t0 = redis.info(), time.monotonic()
        time.sleep(window_s)
        info1, t1 = redis.info(), time.monotonic()
        dt = t1 - t0
        ops = (info1["total_commands_processed"] - info0["total_commands_processed"]) / dt
        cpu = (info1["used_cpu_user"] + info1["used_cpu_sys"] - info0["used_cpu_user"] - info0["used_cpu_sys"]) / dt
        reads = []
        for _ in range(10):
            r0 = time.perf_counter()
            members = live_members(redis)
            reads.append(time.perf_counter() - r0)
        assert len(members) >= n - 1, len(members)
        # one executor dies: the standalone gateway's check notices it (poll 0.5 s, grace 1.5 s)
        absence, poll_s = Absence(1.5), 0.5
        known = set(members)
        dead.set()
        died = last_beat.get("t", time.monotonic())
        noticed = None
        deadline = time.monotonic() + 30
        while noticed is None and time.monotonic() < deadline:
            time.sleep(poll_s)  # the gateway's poll period
            present = set(live_members(redis))
            if "cpu0" in absence.gone(known, present, time.monotonic()):
                noticed = time.monotonic() - died
        return {
            "store_ops_per_s": ops,
            "store_cpu_share": cpu,
            "beats_per_s_wanted": n / HEARTBEAT_S,
            "members_read_ms": statistics.median(reads) * 1e3,
            "dead_noticed_s": noticed,
        }
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        redis.flushdb()


async def _autoscaler(redis, n: int) -> dict:
    from executors.hosts.autoscale import AutoscalingConfig
    from executors.hosts.leadership import StoreLease
    from executors.hosts.scaling import FixedExecutors, ScalingLoop
    from executors.hosts.scaling_board import ScalingBoard

    d = _dispatcher(n, ["tcp://127.0.0.1:1"])
    ids = list(d.executors)
    for k in range(max(1, n // 10)):
        _install(d, f"f{k}", ids[k * 10 : k * 10 + 10] or ids[:1])
    lease = StoreLease(redis, "bench-gateway", lease_s=60)
    lease.step()
    loop = ScalingLoop(
        lambda: d,
        FixedExecutors(),
        AutoscalingConfig(min_replicas=1, max_replicas=10),
        lease=lease,
        board=ScalingBoard(redis),
        gateway_id=lease.identity,
    )
    times = []
    for _ in range(8):
        w0, c0 = time.perf_counter(), time.process_time()
        await loop.step()
        times.append((time.perf_counter() - w0, time.process_time() - c0))
    wall = statistics.median(t[0] for t in times[2:])  # the first steps post every placement once
    cpu = statistics.median(t[1] for t in times[2:])
    redis.flushdb()
    return {"autoscaler_step_ms": wall * 1e3, "autoscaler_step_cpu_ms": cpu * 1e3, "flows": len(d.flows)}


def _executors(procs, kvs_url: str, count: int) -> list[str]:
    import os
    import subprocess

    from kvs.server import popen

    addresses = []
    for i in range(count):
        address = f"tcp://127.0.0.1:{free_port()}"
        env = dict(os.environ, FLOWSERVE_KVS_URL=kvs_url, PYTHONPATH=str(HERE.parent))
        cmd = [sys.executable, "-m", "executors.worker.executor", "--id", f"pinged{i}", "--address", address]
        procs.append(popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        addresses.append(address)
    return addresses


def run(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks scaling_limits", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="10,100,1000", help="executor counts (comma-separated)")
    p.add_argument("--window-s", type=float, default=3.0, help="how long the store's load is measured per size")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    import redis as redis_py

    from kvs import RedisServer
    from kvs.server import terminate

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(dir=Path(tmp) / "redis", appendonly=False)
        server.start()
        procs: list = []
        try:
            r = redis_py.Redis.from_url(server.url)
            addresses = _executors(procs, server.url, 2)
            for n in sizes:
                progress(f"{n} executors")
                row = {"executors": n, **routing(n)}
                row.update(asyncio.run(_liveness_round(n, addresses)))
                row.update(membership(r, n, args.window_s))
                row.update(asyncio.run(_autoscaler(r, n)))
                progress("  " + ", ".join(f"{k} {v:.3g}" for k, v in row.items() if isinstance(v, float)))
                rows.append(row)
        finally:
            for proc in procs:
                terminate(proc, 10)
            server.stop()
    save("scaling_limits", {"rows": rows, "command": "python -m benchmarks scaling_limits"})
    _plot(rows)


def _plot(rows: list[dict]) -> None:
    pyplot = plt()
    ns = [row["executors"] for row in rows]
    fig, axes = pyplot.subplots(1, 4, figsize=(16, 3.8))
    panels = [
        ("gateway CPU per request: routing (µs)", [("route_us_all", "stage on all N"), ("route_us_two", "stage on 2")]),
        (
            "liveness round (ms) / CPU per ping (µs)",
            [("liveness_round_ms", "round"), ("liveness_cpu_us_per_ping", "µs/ping")],
        ),
        ("store: commands/s; members read (ms)", [("store_ops_per_s", "commands/s"), ("members_read_ms", "read ms")]),
        (
            "autoscaler step (ms); dead noticed (s)",
            [("autoscaler_step_ms", "step ms"), ("dead_noticed_s", "noticed s")],
        ),
    ]
    for ax, (title, series) in zip(axes, panels):
        for key, label in series:
            ax.plot(ns, [row[key] for row in rows], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("executors")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    save_plot(fig, "scaling_limits")


if __name__ == "__main__":
    run(sys.argv[1:])
