"""Canary and shadow versions on the local cluster (executors/gateway/rollouts.py).

1. Canary share: a flow at v1 with a canary (another version) at ``--share``; closed-loop
   clients send ``--requests`` requests and read which version answered each. The share
   is held exactly over every 1000 requests and within a request or two over any run of
   them by design (rollouts.Split), at random positions: the figures are the overall
   share, the worst window of 100 and of 1000 consecutive answers (in the order they came
   back), and both versions' p50 / p99 as the gateway reports them.
2. Shadow cost: two flows of the same model side by side on one cluster, one with a shadow
   (a version that rounds one output column, every request mirrored and its answer compared), the
   other without; wrk alternates between them in rounds (p50 at concurrency 1, p99 and
   throughput at 8) and the figures are medians of per-round ratios. The shadow runs on
   the same executors, so it costs what its run costs them; the answers it changed are
   counted per column.

    python -m benchmarks rollout [--requests 20000] [--share 0.1] [--rounds 10] [--seconds 3]

Writes results/rollout.json and results/rollout.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx
import numpy as np

from benchmarks.common import plt, progress, save, save_plot, wrk

HIDDEN = 256


class Model:
    """A 784-256-10 MLP over a 28x28 image, in numpy; ``seed`` picks its weights."""

    seed = 0

    def __init__(self):
        rng = np.random.default_rng(self.seed)
        self.w1 = rng.normal(0, 0.05, (784, HIDDEN)).astype(np.float32)
        self.w2 = rng.normal(0, 0.05, (HIDDEN, 10)).astype(np.float32)

    def __call__(self, table):
        x = np.asarray(table["img"], dtype=np.float32).reshape(len(table), -1) / 255.0
        logits = np.maximum(x @ self.w1, 0) @ self.w2
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        return p.argmax(1), p.max(1).astype(np.float64)


class Other(Model):
    """The shadow: the same classes, confidences rounded to 2 digits (a change the
    comparison finds in one column and not the other)."""

    def __call__(self, table):
        cls, conf = super().__call__(table)
        return cls, np.round(conf, 2)


class Tagged(Model):
    """The canary: the same answers, and ``v`` says which version gave them."""

    version_tag = 2

    def __call__(self, table):
        cls, conf = super().__call__(table)
        return cls, conf, np.full(len(table), self.version_tag)


class First(Tagged):
    version_tag = 1


def flow_of(name: str, model):
    import numpy as np

    from flow import ColumnType, Flow

    f = Flow(name, schema={"img": ColumnType.tensor(np.uint8, (28, 28))})
    names = ["cls", "conf", "v"] if issubclass(model, Tagged) else ["cls", "conf"]
    f.map(model, names=names, batching=True)
    return f


def windows(answers: list[int], size: int) -> list[float]:
    """The canary's share in each window of ``size`` consecutive answers."""
    a = np.asarray(answers) == 2
    return [float(a[i : i + size].mean()) for i in range(0, len(a) - size + 1, size)]


def canary_share(c, body: bytes, n: int, share: float, clients: int) -> dict:
    c.deploy(flow_of("canaried", First))
    c.deploy(flow_of("canaried", Tagged), canary=share)
    url = f"{c.url}/flows/canaried"
    order: list[int] = []  # the version of each answer, in the order they came
    lock = threading.Lock()
    left = [n]

    def client() -> None:
        with httpx.Client(timeout=30, headers={"Content-Type": "application/json"}) as http:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                v = http.post(url, content=body).json()["rows"][0]["v"]
                with lock:
                    order.append(v)

    progress(f"canary: {n} requests at share {share}, {clients} clients")
    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - t0
    doc = httpx.get(url).json()["rollout"]
    w100, w1000 = windows(order, 100), windows(order, 1000)
    out = {
        "requests": len(order),
        "share": share,
        "seconds": round(seconds, 1),
        "answered_by_canary": int(sum(v == 2 for v in order)),
        "measured_share": float(np.mean(np.asarray(order) == 2)),
        "windows_100": {"min": min(w100), "max": max(w100), "worst_points": 100 * max(abs(w - share) for w in w100)},
        "windows_1000": {
            "min": min(w1000),
            "max": max(w1000),
            "worst_points": 100 * max(abs(w - share) for w in w1000),
        },
        # what an independent coin per request would give over a window of 100 (1 sd, points)
        "coin_sd_points_100": 100 * (share * (1 - share) / 100) ** 0.5,
        "primary": doc["primary"],
        "canary": doc["candidate"],
        "series_100": w100,
    }
    progress(
        f"canary: {out['answered_by_canary']} of {out['requests']} ({out['measured_share']:.2%}); "
        f"windows of 100 {out['windows_100']['min']:.0%}..{out['windows_100']['max']:.0%}, "
        f"of 1000 {out['windows_1000']['min']:.1%}..{out['windows_1000']['max']:.1%}"
    )
    return out


def shadow_cost(c, body: bytes, rounds: int, seconds: float) -> dict:
    c.deploy(flow_of("plain", Model))
    c.deploy(flow_of("shadowed", Model))
    c.deploy(flow_of("shadowed", Other), shadow=True)
    urls = {"off": f"{c.url}/flows/plain", "on": f"{c.url}/flows/shadowed"}
    for url in urls.values():  # warm: built, batching sizes seen
        wrk(url, body, 8, 1)
    per_round = []
    for r in range(rounds):
        row = {}
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for key in order:
            c1 = wrk(urls[key], body, 1, seconds)
            c8 = wrk(urls[key], body, 8, seconds)
            row[key] = {"p50_c1": c1["p50_ms"], "p99_c1": c1["p99_ms"], "p99_c8": c8["p99_ms"], "rps_c8": c8["rps"]}
            assert c1["non_2xx"] == 0 and c8["non_2xx"] == 0, (c1, c8)
        per_round.append(row)
        progress(f"shadow round {r + 1}/{rounds}: {json.dumps(row)}")
    doc = httpx.get(urls["on"]).json()["rollout"]

    def ratio(metric: str) -> float:
        return statistics.median(rr["on"][metric] / rr["off"][metric] for rr in per_round)

    def median(key: str, metric: str) -> float:
        return statistics.median(rr[key][metric] for rr in per_round)

    return {
        "rounds": per_round,
        "median": {k: {m: median(k, m) for m in ("p50_c1", "p99_c1", "p99_c8", "rps_c8")} for k in ("off", "on")},
        "ratio_on_off": {m: ratio(m) for m in ("p50_c1", "p99_c1", "p99_c8", "rps_c8")},
        "differences": doc["differences"],
        "shadow": doc["candidate"],
        "primary": doc["primary"],
    }


def run(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--share", type=float, default=0.1)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seconds", type=float, default=3.0)
    args = p.parse_args(argv)

    from executors.hosts.cluster import LocalCluster

    img = np.random.default_rng(7).integers(0, 256, (28, 28), dtype=np.uint8)
    body = json.dumps({"img": img.tolist()}).encode()
    with LocalCluster() as c:  # the default shape: one executor per core but the gateway's
        canary = canary_share(c, body, args.requests, args.share, args.clients)
        shadow = shadow_cost(c, body, args.rounds, args.seconds)
    result = {"canary": canary, "shadow": shadow, "args": vars(args)}
    save("rollout", result)

    pyplot = plt()
    fig, (a1, a2) = pyplot.subplots(1, 2, figsize=(11, 4))
    a1.plot(np.arange(len(canary["series_100"])) * 100, [100 * s for s in canary["series_100"]], lw=0.8)
    a1.axhline(100 * args.share, color="k", ls="--", lw=0.8)
    a1.set_xlabel("requests")
    a1.set_ylabel("canary share per 100 answers (%)")
    a1.set_title(f"canary at {args.share:.0%}: {canary['measured_share']:.2%} of {canary['requests']}")
    labels = ["p50 c=1", "p99 c=1", "p99 c=8"]
    keys = ["p50_c1", "p99_c1", "p99_c8"]
    x = np.arange(len(keys))
    a2.bar(x - 0.2, [shadow["median"]["off"][k] for k in keys], 0.4, label="no shadow")
    a2.bar(x + 0.2, [shadow["median"]["on"][k] for k in keys], 0.4, label="shadow on every request")
    a2.set_xticks(x, labels)
    a2.set_ylabel("primary's latency (ms)")
    a2.set_title("the primary's latency with and without a shadow")
    a2.legend()
    save_plot(fig, "rollout")
