"""A soak under faults: N requests at concurrency C on the local cluster while, every few
seconds, one fault is injected in turn: an executor killed with SIGKILL, a request that
hangs its operator, a redeploy of the flow (changed code, same answers), a poison request
that crashes its executor, the store (the cluster's redis-server, persistence on) killed
with SIGKILL. Every good request must be answered correctly, none lost or duplicated, and
the cluster's memory must stay flat.

    python -m benchmarks soak [--requests 20000] [--concurrency 32] [--rate 400] [--every 3]

The clients are paced to ``--rate`` requests a second in all (each waits for its answer,
then for its turn), so the run lasts long enough for many faults of each kind.

Writes results/soak.json and results/soak.png (throughput, RSS and faults over time).
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import threading
import time

from benchmarks.client import BareClient, ClientError
from benchmarks.common import machine, plt, progress, save, save_plot

#: how long a hang or poison request may take to be answered (504 after timeout_s=2 plus the
#: stuck grace, 500 once its executor died): the run waits for each at its end
FAULT_ANSWER_S = 60.0
MODEL_MB = 20  # each replica holds a model this big: a redeploy that leaked it would show
#: the faults, injected in this order: a hang is recycled (timeout_s 2 s + stuck_grace_s 2 s)
#: before the poison request that follows two faults later takes both executors down
FAULTS = ("kill", "hang", "redeploy", "poison", "store")


class Model:
    """A stand-in model: a few MB of weights, a little arithmetic per row; ``x == -1``
    hangs (a stuck model call), ``x == -2`` crashes the process (a poison input)."""

    def __init__(self):
        import numpy as np

        self.weights = np.ones(MODEL_MB << 17)  # MODEL_MB MiB of float64

    def __call__(self, row):
        import os
        import threading

        if row.x == -1:
            threading.Event().wait()
        if row.x == -2:
            os._exit(3)
        return row.x * 2 + int(self.weights[row.x % 1000])


class ModelV2(Model):
    """The same answers by another code path: what a rollout of new code looks like."""

    def __call__(self, row):
        if row.x >= 0:
            return 2 * row.x + 1
        return super().__call__(row)


def finish(row):
    return row.y + 1


def soak_flow(version: int):
    from flow import Flow

    f = Flow("soak", schema={"x": int})
    f.map(Model if version % 2 == 0 else ModelV2, names=["y"], timeout_s=2.0).map(finish, names=["z"])
    return f


def expected(x: int) -> int:
    return 2 * x + 2


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _counter(exposition: str, name: str) -> int:
    """The sum of a counter's samples in a Prometheus text exposition (the live executors')."""
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines() if line.startswith(name)))


def _cluster_pids(cluster) -> dict[str, int]:
    out = subprocess.run(
        ["pgrep", "-f", f"executors.worker.executor .*{cluster.dir}"], capture_output=True, text=True
    ).stdout
    pids = {f"executor {p}": int(p) for p in out.split()}
    pids["gateway"] = cluster.proc.pid
    return pids


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--every", type=float, default=3.0, help="seconds between faults (default 3)")
    p.add_argument("--rate", type=float, default=400.0, help="requests a second, all clients together (default 400)")
    p.add_argument("--executors", type=int, default=2)
    p.add_argument(
        "--unfused",
        action="store_true",
        help="one stage per operator (optimize=False): the model's output goes on to its consumer "
        "(a chained run where both are on one executor)",
    )
    p.add_argument("--name", default="soak", help="results file name (default soak: results/soak.json)")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    from executors import ClusterConfig, LocalCluster

    cluster = LocalCluster(
        ClusterConfig(executors=args.executors, threads=4, request_timeout_s=30, stuck_grace_s=2.0, max_retries=3)
    ).start()
    try:
        return _soak(cluster, args)
    finally:
        cluster.stop()


def _soak(cluster, args) -> dict:
    version = itertools.count()
    d = cluster.deploy(soak_flow(next(version)), optimize=not args.unfused)
    url = d.url
    ids = iter(range(args.requests))
    ids_lock = threading.Lock()
    answers: dict[int, tuple] = {}  # x -> (status, rows or error)
    timeline: list[tuple] = []  # (t, answered so far)
    done = threading.Event()
    t_start = time.monotonic()

    interval = args.concurrency / args.rate  # each client's turn comes this often

    def client():
        next_at = time.monotonic()
        with BareClient(timeout=120) as http:
            while True:
                next_at += interval
                pause = next_at - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # pacing, not synchronisation
                with ids_lock:
                    x = next(ids, None)
                if x is None:
                    return
                try:
                    r = http.post(url, json={"x": x})
                    got = (r.status_code, r.json()["rows"] if r.status_code == 200 else r.json())
                except (ClientError, OSError, ValueError) as e:
                    got = (0, f"{type(e).__name__}: {e}")
                    http.close()
                answers[x] = got

    faults: list[dict] = []
    callers: list[threading.Thread] = []  # the hang and poison requests: awaited before the count

    def inject():
        kinds = itertools.cycle(FAULTS)
        while not done.wait(args.every):
            kind = next(kinds)
            t = time.monotonic() - t_start
            f = {"t": round(t, 2), "kind": kind}
            try:
                if kind == "kill":
                    pids = [v for k, v in _cluster_pids(cluster).items() if k.startswith("executor")]
                    if pids:
                        os.kill(pids[0], signal.SIGKILL)
                        f["pid"] = pids[0]
                elif kind == "store":
                    f["pid"] = int(cluster.kvs.redis.info("server")["process_id"])
                    os.kill(f["pid"], signal.SIGKILL)  # the supervisor starts it again; its AOF holds the plans
                elif kind in ("hang", "poison"):

                    def call(x=-1 if kind == "hang" else -2, f=f):
                        try:
                            with BareClient(timeout=FAULT_ANSWER_S) as http:
                                r = http.post(url, json={"x": x})
                                f["status"], f["answer"] = r.status_code, r.json()
                        except (ClientError, OSError, ValueError) as e:  # reported as the fault's error
                            f["error"] = f"{type(e).__name__}: {e}"

                    caller = threading.Thread(target=call, daemon=True)
                    callers.append(caller)
                    caller.start()
                else:
                    t0 = time.monotonic()
                    cluster.deploy(soak_flow(next(version)), optimize=not args.unfused)
                    f["seconds"] = round(time.monotonic() - t0, 2)
            except Exception as e:  # a fault that could not be injected is reported, not fatal
                f["error"] = f"{type(e).__name__}: {e}"
            faults.append(f)
            progress(f"t={t:5.1f}s fault {kind}: answered {len(answers)} of {args.requests}")

    memory: list[dict] = []

    def sample():
        while not done.wait(1.0):
            pids = _cluster_pids(cluster)
            memory.append(
                {
                    "t": round(time.monotonic() - t_start, 2),
                    "rss_mb": {k: round(_rss_mb(v), 1) for k, v in pids.items()},
                }
            )
            timeline.append((time.monotonic() - t_start, len(answers)))

    progress(f"soak: {args.requests} requests at concurrency {args.concurrency}, a fault every {args.every:g} s")
    threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
    helpers = [threading.Thread(target=inject, daemon=True), threading.Thread(target=sample, daemon=True)]
    for t in threads + helpers:
        t.start()
    for t in threads:
        t.join()
    done.set()
    elapsed = time.monotonic() - t_start
    helpers[0].join()  # a fault being injected (a redeploy) ends first
    for caller in callers:  # every hang and poison request is answered (504 and 500 within seconds)
        caller.join(FAULT_ANSWER_S)
    for f in faults:
        if f["kind"] in ("hang", "poison") and "status" not in f and "error" not in f:
            f["error"] = f"no answer within {FAULT_ANSWER_S:g} s of the run's end"

    wrong, lost, duplicated, qids = [], [], 0, []
    for x in range(args.requests):
        status, body = answers.get(x, (None, None))
        if status != 200:
            lost.append((x, status, body))
            continue
        if len(body) != 1:
            duplicated += 1
        if any(r.get("z") != expected(x) for r in body):
            wrong.append((x, body))
        qids.extend(r["qid"] for r in body)
    summary = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "unfused": args.unfused,
        "seconds": round(elapsed, 1),
        "throughput_rps": round(args.requests / elapsed, 1),
        "answered_ok": args.requests - len(lost),
        "lost": len(lost),
        "wrong": len(wrong),
        "duplicated_rows": duplicated,
        "repeated_qids": len(qids) - len(set(qids)),
        "faults": {k: sum(1 for f in faults if f["kind"] == k) for k in FAULTS},
        "hang_answers": sorted({f.get("status") for f in faults if f["kind"] == "hang"}, key=str),
        "poison_answers": sorted({f.get("status") for f in faults if f["kind"] == "poison"}, key=str),
    }
    summary.update(_memory_summary(memory))
    health = cluster.http.get("/healthz").json()
    summary["executors_recycled"] = sum(health.get("recycled", {}).values())
    summary["executors_crashed"] = sum(health.get("crashed", {}).values())
    summary["chained_runs"] = _counter(cluster.http.get("/metrics").text, "flowserve_executor_chained_runs_total")
    progress(f"soak: {summary}")
    save(
        args.name,
        {
            "machine": machine(),
            "summary": summary,
            "faults": faults,
            "lost_sample": lost[:20],
            "wrong_sample": wrong[:20],
            "memory": memory,
            "timeline": timeline,
            "health": health,
        },
    )
    _plot(memory, timeline, faults, args.name)
    return summary


def _memory_summary(memory: list[dict]) -> dict:
    """Cluster RSS (gateway + executors) after warm-up (the first quarter) against the end."""
    if len(memory) < 4:
        return {}
    totals = [sum(m["rss_mb"].values()) for m in memory]
    gateway = [m["rss_mb"].get("gateway", 0) for m in memory]
    q = max(1, len(memory) // 4)
    return {
        "cluster_rss_mb_after_warmup": round(sum(totals[q : 2 * q]) / q, 1),
        "cluster_rss_mb_last_quarter": round(sum(totals[-q:]) / q, 1),
        "cluster_rss_mb_max": round(max(totals), 1),
        "gateway_rss_mb_after_warmup": round(sum(gateway[q : 2 * q]) / q, 1),
        "gateway_rss_mb_last_quarter": round(sum(gateway[-q:]) / q, 1),
    }


def _plot(memory, timeline, faults, name: str) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(2, 1, figsize=(10, 6), sharex=True)
    ts = [m["t"] for m in memory]
    axes[0].plot(ts, [sum(m["rss_mb"].values()) for m in memory], label="cluster RSS (MB)")
    axes[0].plot(ts, [m["rss_mb"].get("gateway", 0) for m in memory], label="gateway RSS (MB)")
    axes[0].legend(fontsize=8)
    axes[0].set_title("soak under faults: memory")
    rate = [(b[0], (b[1] - a[1]) / max(1e-9, b[0] - a[0])) for a, b in zip(timeline, timeline[1:])]
    axes[1].plot([r[0] for r in rate], [r[1] for r in rate], label="answers/s")
    for f in faults:
        for ax in axes:
            ax.axvline(
                f["t"],
                color={"kill": "red", "hang": "orange", "poison": "purple", "redeploy": "green", "store": "blue"}[
                    f["kind"]
                ],
                alpha=0.3,
            )
    axes[1].set_xlabel("seconds (red: kill -9, orange: hang, purple: poison, green: redeploy, blue: store kill -9)")
    axes[1].legend(fontsize=8)
    save_plot(fig, name)


if __name__ == "__main__":
    run()
