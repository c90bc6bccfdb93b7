"""The embedded cluster's own store killed under load while it holds more data than it reads
back in a few seconds: what clients meet until it is back, and whether its data is.

A local cluster (2 executors, persistence on: the default) holds ``--mb`` MiB of
incompressible data (1 MiB float32 vectors, each under its own key; the AOF rewritten, so
it is read back from its compact base file, the fastest case). Closed-loop clients call two
flows: ``lookups``, whose row looks up a vector no executor has cached (each client walks
its own stretch of the keys, more than the executors' caches hold), and ``plain``, which
does not touch the store. Then the redis-server is killed with SIGKILL; the supervisor
starts it again and it reads its AOF back, answering LOADING meanwhile. Reported, per
flow: requests answered with the right value / failed, by status and error / lost (no
HTTP answer) / wrong; when the new server first answered and when it had loaded; how long
the longest lookup waited; then whether every key is still there with its bytes.

    python -m benchmarks store_restart [--mb 5120] [--clients 4] [--after 5]

Writes results/store_restart.json and results/store_restart.png.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import threading
import time

import numpy as np

from benchmarks.common import plt, progress, save, save_plot

VECTOR = 2**18  # float32s a key: 1 MiB
CHUNK = 32  # keys a write
BIN_S = 0.25  # the timeline's bins


def vector(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(VECTOR, dtype=np.float32)


def key_of(row):
    return f"vec/{row.i}"


def first(row):
    return float(row.v[0])


def one(row):
    return row.x + 1


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks store_restart", description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=5120, help="MiB of data in the store (default 5120)")
    p.add_argument("--clients", type=int, default=4, help="closed-loop clients of each flow (default 4)")
    p.add_argument("--before", type=float, default=2.0, help="seconds of load before the kill (default 2)")
    p.add_argument("--after", type=float, default=5.0, help="seconds of load after the store loaded (default 5)")
    p.add_argument("--give-up", type=float, default=120.0, help="seconds to wait for the store (default 120)")
    p.add_argument("--name", default="store_restart", help="results file name (default store_restart)")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    figures = restart_run(args)
    save(args.name, {"args": vars(args), **figures})
    plot(figures, args.name)
    return figures


def _wait_rewritten(r) -> None:
    while True:
        info = r.info("persistence")
        if not int(info["aof_rewrite_in_progress"]) and not int(info["aof_rewrite_scheduled"]):
            return
        time.sleep(0.1)  # polling the server's own state, not standing in for it


def restart_run(args) -> dict:
    import httpx

    from executors import ClusterConfig, LocalCluster
    from flow import Flow

    n = args.mb
    with LocalCluster(ClusterConfig(executors=2)) as cluster:
        r = cluster.kvs.redis
        t0 = time.monotonic()
        for i in range(0, n, CHUNK):
            cluster.kvs.mput({f"vec/{j}": vector(j) for j in range(i, min(n, i + CHUNK))})
            if i % 1024 == 0:
                progress(f"wrote {i} of {n} MiB")
        _wait_rewritten(r)
        r.bgrewriteaof()
        _wait_rewritten(r)
        aof_mb = int(r.info("persistence").get("aof_base_size", 0)) / 2**20
        progress(f"{n} MiB written and the AOF rewritten ({aof_mb:.0f} MiB) in {time.monotonic() - t0:.0f} s")

        lookups = Flow("lookups", schema={"i": int})
        lookups.map(key_of, names=["key"]).lookup(column="key", name="v").map(first, names=["s"])
        plain = Flow("plain", schema={"x": int})
        plain.map(one, names=["y"])
        urls = {"lookups": cluster.deploy(lookups).url, "plain": cluster.deploy(plain).url}
        expected = {i: float(vector(i)[0]) for i in range(n)}

        lock = threading.Lock()
        stop = threading.Event()
        t_start = time.monotonic()
        calls: dict[str, list] = {"lookups": [], "plain": []}  # (sent, answered, outcome)
        messages: dict[str, dict] = {}  # each failed outcome's messages: {message: count}

        def client(flow: str, k: int) -> None:
            stretch = range(k * n // args.clients, (k + 1) * n // args.clients)
            j = 0
            with httpx.Client(timeout=120) as http:
                while not stop.is_set():
                    i = stretch[j % len(stretch)]
                    j += 1
                    body = {"i": i} if flow == "lookups" else {"x": i}
                    sent = time.monotonic()
                    try:
                        resp = http.post(urls[flow], json=body)
                    except httpx.TransportError as e:
                        outcome = f"lost ({type(e).__name__})"
                    else:
                        if resp.status_code != 200:
                            outcome = f"{resp.status_code} {resp.json().get('error', '?')}"
                            seen = messages.setdefault(outcome, {})
                            text = resp.json().get("message", "?")
                            if text in seen or len(seen) < 5:  # the distinct messages, a few
                                seen[text] = seen.get(text, 0) + 1
                        else:
                            got = resp.json()["rows"][0]
                            right = got["s"] == expected[i] if flow == "lookups" else got["y"] == i + 1
                            outcome = "answered" if right else "wrong"
                    with lock:
                        calls[flow].append((sent - t_start, time.monotonic() - t_start, outcome))

        threads = [threading.Thread(target=client, args=(f, k)) for f in calls for k in range(args.clients)]
        for t in threads:
            t.start()
        stop.wait(args.before)  # the load runs before the kill: the schedule, not a wait for state
        old = int(r.info("server")["process_id"])
        progress(f"kill -9 of the store (pid {old})")
        t_kill = time.monotonic()
        os.kill(old, signal.SIGKILL)
        t_answering = t_loaded = None
        give_up = t_kill + args.give_up
        while time.monotonic() < give_up and t_loaded is None:
            try:
                info = r.info("server") | r.info("persistence")
            except Exception:  # down, or between two starts
                info = None
            if info is not None and int(info["process_id"]) != old:
                t_answering = t_answering or time.monotonic()
                if not int(info.get("loading", 0)):
                    t_loaded = time.monotonic()
            time.sleep(0.05)  # polling the server's own state, not standing in for it
        progress("the store " + (f"loaded {t_loaded - t_kill:.1f} s after the kill" if t_loaded else "is not back"))
        stop.wait(args.after)
        stop.set()
        for t in threads:
            t.join(180)

        kept = missing = 0
        damaged = []
        if t_loaded is not None:
            present = [bool(x) for x in _exists(r, n)]
            kept, missing = sum(present), n - sum(present)
            for i in range(0, n, max(1, n // 64)):  # a sample of values, byte for byte
                if not np.array_equal(cluster.kvs.get(f"vec/{i}"), vector(i)):
                    damaged.append(i)

    def rel(t):
        return None if t is None else round(t - t_start, 3)

    per_flow = {}
    for flow, rows in calls.items():
        outcomes = collections.Counter(o for _, _, o in rows)
        waits = [b - a for a, b, _ in rows if a >= t_kill - t_start]
        per_flow[flow] = {
            "requests": len(rows),
            "outcomes": dict(outcomes),
            "longest_wait_s": round(max(waits), 3) if waits else None,
            "answered_after_kill": sum(1 for a, _, o in rows if a >= t_kill - t_start and o == "answered"),
            # once the store has loaded, lookups are answered again: how many, and the first
            "answered_after_load": sum(
                1 for a, _, o in rows if t_loaded and a >= t_loaded - t_start and o == "answered"
            ),
            "first_answer_after_load_s": min(
                (
                    round(b - (t_loaded - t_start), 3)
                    for a, b, o in rows
                    if t_loaded and a >= t_loaded - t_start and o == "answered"
                ),
                default=None,
            ),
        }
    figures = {
        "mb": n,
        "aof_base_mb": round(aof_mb),
        "kill_s": rel(t_kill),
        "answering_s": rel(t_answering),
        "loaded_s": rel(t_loaded),
        "back_after_kill_s": None if t_loaded is None else round(t_loaded - t_kill, 2),
        "keys_kept": kept,
        "keys_missing": missing,
        "values_checked": len(range(0, n, max(1, n // 64))) if t_loaded is not None else 0,
        "values_damaged": damaged,
        "flows": per_flow,
        "messages": messages,
        # answers a bin of BIN_S, by outcome, for the plot
        "timeline": {f: _binned(rows) for f, rows in calls.items()},
    }
    for flow, f in per_flow.items():
        progress(
            f"{flow}: {f['outcomes']}, longest wait after the kill {f['longest_wait_s']} s, "
            f"answered after the load {f['answered_after_load']} (the first {f['first_answer_after_load_s']} s after it)"
        )
    return figures


def _binned(rows: list) -> dict:
    """{outcome: [answers ending in each BIN_S from the start]}"""
    bins = int(max((b for _, b, _ in rows), default=0.0) / BIN_S) + 1
    out: dict[str, list[int]] = {}
    for _, b, o in rows:
        out.setdefault(o, [0] * bins)[int(b / BIN_S)] += 1
    return out


def _exists(r, n: int) -> list:
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        pipe.exists(f"vec/{i}")
    return pipe.execute()


def plot(figures: dict, name: str) -> None:
    fig, axes = plt().subplots(2, 1, figsize=(9, 6), sharex=True)
    for ax, (flow, by_outcome) in zip(axes, figures["timeline"].items()):
        for kind in sorted(by_outcome, key=lambda o: (o != "answered", o)):
            counts = np.array(by_outcome[kind]) / BIN_S
            ax.step(np.arange(len(counts)) * BIN_S, counts, where="post", label=kind[:60])
        for at, label, style in (
            (figures["kill_s"], "kill -9", "r--"),
            (figures["answering_s"], "answering (LOADING)", "y--"),
            (figures["loaded_s"], "loaded", "g--"),
        ):
            if at is not None:
                ax.axvline(at, color=style[0], linestyle="--", label=label)
        ax.set_ylabel(f"{flow}: req/s")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("seconds")
    back = figures["back_after_kill_s"]
    fig.suptitle(
        f"The store killed holding {figures['mb']} MiB: "
        + (f"loaded {back} s after the kill" if back is not None else "not back")
    )
    save_plot(fig, name)


if __name__ == "__main__":
    run()
