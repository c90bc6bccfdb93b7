"""The gateway process killed under load (kill -9, and a segfault): what clients see.

Closed-loop clients call a one-stage flow on the local cluster; every ``--every`` seconds
the gateway process is killed (alternately SIGKILL and SIGSEGV). The supervisor starts a
new one on the same listening socket. Per kill: the gap (from the kill to the first
answer to a request sent after it, and the slowest answer to a request sent in the half period after the
kill: it waited in the socket's backlog), and over the run: requests answered, lost
(their connection was the dead gateway's), refused (none should be) and wrong.

    python -m benchmarks gateway_restart [--kills 10] [--every 2] [--clients 8]

Writes results/gateway_restart.json and results/gateway_restart.png (answers per 50 ms
around each kill).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import threading
import time

import httpx

from benchmarks.common import machine, plt, progress, save, save_plot


def double(row):
    return row.x * 2


def run(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks gateway_restart", description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--every", type=float, default=2.0, help="seconds between kills")
    p.add_argument("--clients", type=int, default=8)
    args = p.parse_args(argv)

    from executors.hosts.cluster import LocalCluster
    from executors.hosts.cluster_config import ClusterConfig
    from flow import Flow

    answers: list[float] = []  # when each answer came
    waits: list[tuple[float, float]] = []  # (sent, seconds) of each answered request
    lost: list[tuple[float, str]] = []
    wrong: list = []
    lock = threading.Lock()
    stop = threading.Event()

    with LocalCluster(ClusterConfig(executors=1)) as c:
        f = Flow("double", schema={"x": int})
        f.map(double, names=["y"])
        d = c.deploy(f)

        def client(k: int) -> None:
            i = 0
            with httpx.Client(timeout=30) as http:
                while not stop.is_set():
                    x = k * 10_000_000 + i
                    i += 1
                    t0 = time.monotonic()
                    try:
                        r = http.post(d.url, json={"x": x})
                    except httpx.TransportError as e:
                        with lock:
                            lost.append((t0, type(e).__name__))
                        continue
                    t1 = time.monotonic()
                    with lock:
                        if r.status_code == 200 and r.json()["rows"][0]["y"] == 2 * x:
                            answers.append(t1)
                            waits.append((t0, t1 - t0))
                        else:
                            wrong.append((x, r.status_code, r.text[:200]))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        for t in threads:
            t.start()
        start = time.monotonic()
        kills = []
        for n in range(args.kills):
            time.sleep(args.every)  # the load runs between kills: this is the schedule, not a wait for state
            sig = signal.SIGKILL if n % 2 == 0 else signal.SIGSEGV
            pid = httpx.get(f"{c.url}/healthz", timeout=30).json()["gateway"]["pid"]
            at = time.monotonic()
            os.kill(pid, sig)
            kills.append((at, sig.name))
            progress(f"kill {n + 1}/{args.kills}: {sig.name} to gateway pid {pid}")
        time.sleep(args.every)
        stop.set()
        for t in threads:
            t.join(60)
        health = httpx.get(f"{c.url}/healthz", timeout=30).json()

    gaps = []
    for at, sig in kills:
        after = [sent + w for sent, w in waits if sent >= at]  # answers to requests sent after the kill
        # a request sent while no gateway ran waits in the socket's backlog: its latency
        longest = max((w for sent, w in waits if at <= sent < at + args.every / 2), default=0.0)
        gaps.append(
            {
                "signal": sig,
                "first_answer_s": (min(after) - at) if after else None,
                "longest_wait_sent_after_s": longest,
            }
        )
    first = [g["first_answer_s"] for g in gaps if g["first_answer_s"] is not None]
    longest = [g["longest_wait_sent_after_s"] for g in gaps]
    result = {
        "kills": len(kills),
        "clients": args.clients,
        "answered": len(answers),
        "lost": len(lost),
        "lost_by_error": {e: sum(1 for _, x in lost if x == e) for e in sorted({x for _, x in lost})},
        "wrong": len(wrong),
        "refused": sum(1 for _, x in lost if x == "ConnectError"),
        "gateway_restarts": health["gateway"]["restarts"],
        "first_answer_after_kill_s": {"median": statistics.median(first), "max": max(first)},
        "slowest_answer_sent_after_a_kill_s": {"median": statistics.median(longest), "max": max(longest)},
        "gaps": gaps,
    }
    progress(
        f"answered {result['answered']}, lost {result['lost']}, wrong {result['wrong']}, refused {result['refused']}; "
        f"first answer after a kill: median {result['first_answer_after_kill_s']['median'] * 1000:.0f} ms, "
        f"max {result['first_answer_after_kill_s']['max'] * 1000:.0f} ms"
    )
    save("gateway_restart", {**result, "machine": machine()})

    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(9, 3.5))
    bins = [start + i * 0.05 for i in range(int((max(answers) - start) / 0.05) + 2)]
    ax.hist([t - start for t in answers], bins=[b - start for b in bins], color="tab:blue")
    for at, sig in kills:
        ax.axvline(at - start, color="tab:red" if sig == "SIGKILL" else "tab:orange", lw=1)
    ax.set_xlabel("seconds (red: kill -9, orange: SIGSEGV to the gateway)")
    ax.set_ylabel("answers per 50 ms")
    ax.set_title(
        f"gateway killed {len(kills)}x under {args.clients} clients: {len(answers)} answered, {len(lost)} lost"
    )
    save_plot(fig, "gateway_restart")
