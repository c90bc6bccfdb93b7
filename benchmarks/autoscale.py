"""Autoscaling under a 2x load step on the local cluster: how long until a new replica
of the hot stage serves, and p99 latency and replicas over time.

Open-loop load (requests are sent at a fixed rate whatever the answers do): R req/s for
``--before`` seconds, then 2R for ``--after`` seconds, then nothing. The hot stage spins
the CPU for 10 ms a request; the cold stage costs next to nothing. The replica counts are
read from ``GET /flows/{name}`` every 100 ms.

    python -m benchmarks autoscale [--rate 40] [--before 10] [--after 20]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from benchmarks.common import plt, progress, save, save_plot


def spin(row):
    end = time.perf_counter() + 0.010
    while time.perf_counter() < end:
        pass
    return row.x


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks autoscale", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=40.0, help="requests/s before the step (doubled after)")
    p.add_argument("--before", type=float, default=10.0)
    p.add_argument("--after", type=float, default=20.0)
    p.add_argument("--cool", type=float, default=25.0, help="seconds watched after the load stops")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    from executors import ClusterConfig, LocalCluster
    from executors.hosts.autoscale import AutoscalingConfig
    from flow import Flow

    policy = AutoscalingConfig(min_replicas=1, max_replicas=4)
    flow = Flow("step")
    flow.map(lambda r: r.x, names=["x"]).map(spin, names=["y"])
    samples: list[tuple[float, float, int]] = []  # (sent at, latency ms, status)
    replicas: list[tuple[float, dict]] = []
    with LocalCluster(ClusterConfig(executors=2, threads=4, autoscaling=policy, max_executors=4)) as cluster:
        d = cluster.deploy(flow, optimize=False)
        hot = list(d.plan.stages)[1]
        stop = threading.Event()
        t0 = time.monotonic()

        def watch():
            with httpx.Client(base_url=cluster.url) as http:
                while not stop.is_set():
                    st = {s["name"]: s["replicas"] for s in http.get(f"/flows/{flow.name}").json()["stages"]}
                    replicas.append((time.monotonic() - t0, st))
                    time.sleep(0.1)

        http = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=64))
        body = json.dumps({"x": 1}).encode()

        def one(sent):
            r = http.post(d.url, content=body, headers={"Content-Type": "application/json"})
            samples.append((sent - t0, (time.monotonic() - sent) * 1000, r.status_code))

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        with ThreadPoolExecutor(64) as pool:
            for rate, seconds in ((args.rate, args.before), (2 * args.rate, args.after)):
                progress(f"load {rate:.0f} req/s for {seconds:.0f} s")
                start, n = time.monotonic(), int(rate * seconds)
                for i in range(n):
                    due = start + i / rate
                    time.sleep(max(0.0, due - time.monotonic()))
                    pool.submit(one, time.monotonic())
        progress(f"load off; watching {args.cool:.0f} s")
        time.sleep(args.cool)
        stop.set()
        watcher.join()
        http.close()
    step_at = args.before
    up = next((t for t, st in replicas if t >= step_at and st[hot] > 1), None)
    reaction = None if up is None else up - step_at
    windows = {}
    for sent, ms, _status in samples:
        windows.setdefault(int(sent), []).append(ms)
    p99 = {w: float(np.percentile(v, 99)) for w, v in sorted(windows.items())}
    errors = sum(1 for *_, s in samples if s != 200)
    progress(
        f"new replica of {hot!r} serving {reaction:.2f} s after the step"
        if reaction is not None
        else "the hot stage never scaled up"
    )
    out = {
        "rate": args.rate,
        "step_at_s": step_at,
        "reaction_s": reaction,
        "errors": errors,
        "requests": len(samples),
        "p99_ms_per_second": p99,
        "replicas": replicas,
        "hot_stage": hot,
    }
    save("autoscale", out)
    _plot(out, hot)
    return out


def _plot(out: dict, hot: str) -> None:
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(8, 3.8))
    ts = [t for t, _ in out["replicas"]]
    for stage in out["replicas"][0][1]:
        ax.step(ts, [st[stage] for _, st in out["replicas"]], where="post", label=f"replicas: {stage}")
    ax.axvline(out["step_at_s"], color="grey", ls=":", label="2x load step")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("replicas")
    ax2 = ax.twinx()
    w = sorted(out["p99_ms_per_second"])
    ax2.plot(w, [out["p99_ms_per_second"][k] for k in w], "r.-", label="p99 latency (ms)")
    ax2.set_ylabel("p99 latency per second (ms)")
    ax.legend(loc="upper left", fontsize=7)
    ax2.legend(loc="upper right", fontsize=7)
    react = out["reaction_s"]
    ax.set_title(f"2x load step: new replica serving after {react:.1f} s" if react is not None else "no scale-up")
    save_plot(fig, "autoscale")


if __name__ == "__main__":
    run()
