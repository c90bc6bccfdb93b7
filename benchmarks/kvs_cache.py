"""Benchmark: reading a float64 array from the executor-local cache vs from Redis.

Run by hand (not a test):

    python benchmarks/kvs_cache.py            # ~15 s on 2 cores
    python benchmarks/kvs_cache.py --quick    # fewer repetitions

It starts its own embedded Redis server and, for arrays of 8 KB, 1 MB and 8 MB,
times three ways to read the same value:

* ``cache hit``      ``CachedKVS.get`` of a value already in the local cache
* ``redis GET``      a raw ``redis.Redis.get`` (bytes only, no decoding)
* ``GET + decode``   ``KVS.get`` (network read, then the zero-copy decode)

plus the invalidation latency: the time from another client's write until the cached
reader's invalidation listener has dropped the key. It writes medians, p99s and ratios
to ``benchmarks/results/kvs_cache.json`` and a plot to ``kvs_cache.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from kvs import KVS, CachedKVS, RedisServer  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = {"8 KB": 1 << 10, "1 MB": 1 << 17, "8 MB": 1 << 20}  # float64 element counts
METHODS = ("cache hit", "redis GET", "GET + decode")


def timings(fn, reps: int, warmup: int = 5) -> np.ndarray:
    """Per-call wall times in microseconds."""
    for _ in range(warmup):
        fn()
    out = np.empty(reps)
    clock = time.perf_counter_ns
    for i in range(reps):
        start = clock()
        fn()
        out[i] = clock() - start
    return out / 1e3


def summary(us: np.ndarray) -> dict:
    return {
        "median_us": float(np.median(us)),
        "p99_us": float(np.percentile(us, 99)),
        "mean_us": float(us.mean()),
        "reps": int(len(us)),
    }


def invalidation_latency(cached: CachedKVS, other: KVS, reps: int) -> np.ndarray:
    """Microseconds from another client's SET returning to our listener running."""
    fired = threading.Event()
    cached.add_invalidation_listener(lambda keys: fired.set())
    out = np.empty(reps)
    for i in range(reps):
        other.put("inv", i)
        cached.get("inv")  # cached and tracked
        fired.clear()
        start = time.perf_counter_ns()
        other.put("inv", -i)
        if not fired.wait(5.0):
            raise RuntimeError("invalidation did not arrive within 5 s")
        out[i] = (time.perf_counter_ns() - start) / 1e3
    return out


def run(quick: bool) -> dict:
    scale = 0.2 if quick else 1.0
    results: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "numpy": np.__version__,
        },
        "sizes": {},
    }
    with RedisServer() as server:
        results["machine"]["redis"] = server.version
        cached = CachedKVS.from_url(server.url)
        plain = KVS.from_url(server.url)
        raw = plain.redis
        for label, n in SIZES.items():
            key = f"arr/{label}"
            arr = np.random.default_rng(0).random(n)
            plain.put(key, arr)
            cached.get(key)
            assert cached.holds(key)
            big = n >= 1 << 20
            net_reps = max(20, int((150 if big else 1000) * scale))
            hit_reps = max(1000, int(20000 * scale))
            print(f"{label}: cache hit x{hit_reps}, redis x{net_reps} ...", flush=True)
            row = {
                "bytes": int(arr.nbytes),
                "cache hit": summary(timings(lambda key=key: cached.get(key), hit_reps)),
                "redis GET": summary(timings(lambda key=key: raw.get(key), net_reps)),
                "GET + decode": summary(timings(lambda key=key: plain.get(key), net_reps)),
            }
            hit = row["cache hit"]["median_us"]
            row["speedup_vs_redis_get"] = row["redis GET"]["median_us"] / hit
            row["speedup_vs_get_decode"] = row["GET + decode"]["median_us"] / hit
            results["sizes"][label] = row
        print("invalidation latency ...", flush=True)
        results["invalidation"] = summary(invalidation_latency(cached, plain, max(50, int(300 * scale))))
        cached.close()
        plain.close()
    return results


def report(results: dict) -> str:
    lines = [f"{'size':>6} | {'method':<13} | {'median':>11} | {'p99':>11}"]
    for label, row in results["sizes"].items():
        for method in METHODS:
            s = row[method]
            lines.append(f"{label:>6} | {method:<13} | {s['median_us']:>8.1f} us | {s['p99_us']:>8.1f} us")
        lines.append(
            f"{'':>6}   cache hit is {row['speedup_vs_redis_get']:,.0f}x faster than redis GET, "
            f"{row['speedup_vs_get_decode']:,.0f}x than GET + decode"
        )
    inv = results["invalidation"]
    lines.append(f"invalidation latency: median {inv['median_us']:.0f} us, p99 {inv['p99_us']:.0f} us")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(results["sizes"])
    x = np.arange(len(labels))
    width = 0.26
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, method in enumerate(METHODS):
        med = np.array([results["sizes"][s][method]["median_us"] for s in labels])
        p99 = np.array([results["sizes"][s][method]["p99_us"] for s in labels])
        bars = ax.bar(x + (i - 1) * width, med, width, label=method, yerr=[np.zeros_like(med), p99 - med], capsize=3)
        for bar, value, top in zip(bars, med, p99):  # label above the p99 whisker
            ax.annotate(
                f"{value:,.1f}" if value < 100 else f"{value:,.0f}",
                (bar.get_x() + bar.get_width() / 2, top),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 3),
                textcoords="offset points",
            )
    ax.set_yscale("log")
    ax.set_xticks(x, [f"{s} float64" for s in labels])
    ax.set_ylabel("read latency, µs (median; whisker = p99)")
    m = results["machine"]
    ax.set_title(f"KVS read: local cache hit vs Redis ({m['cpus']} cores, Redis {m['redis']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    results = run(args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kvs_cache.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "kvs_cache.png")
    print(report(results))
    print(f"wrote {args.out / 'kvs_cache.json'} and {args.out / 'kvs_cache.png'}")
    ratio = results["sizes"]["8 MB"]["speedup_vs_redis_get"]
    if ratio < 20:
        print(f"FAIL: 8 MB cache hit only {ratio:.1f}x faster than redis GET (need >= 20x)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
