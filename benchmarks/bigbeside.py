"""Small requests beside big ones: ``python -m benchmarks bigbeside [--baseline TREE]``.

One default local cluster serves two flows: the fusion benchmark's 10-stage fused no-op
chain, sent a 10 MiB float32 tensor row as Arrow IPC at a fixed rate (``--rate`` per
second; a late answer delays the next send, it does not bring a burst) by one client
process, and a one-map flow sent one JSON row at a time in a closed loop by another. Figures: the small client's
p50 / p99 alone (before the big client starts) and beside the big requests, the big
requests' p50 over HTTP and in the gateway.

What it shows is whether a big request's work (reading the body into shared memory,
freeing it: executors/wire/shm.py) stalls everybody else. ``--baseline TREE`` runs the same
from another checkout, alternating with this tree rep by rep (each cluster up alone), so
an A/B of a change shares the machine's moods. ``--kind json-image`` sends instead a
224x224x3 uint8 image as JSON nested lists (640 KB) to a one-map flow: the body the gateway
must parse itself; ``--kind json-answer`` a small JSON request answered with ``--mb`` of
float32 tensor as JSON: the answer the gateway must write. Writes benchmarks/results/bigbeside.json (``--out`` another name).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.common import ROOT, progress, save

# run inside the tree under test (cwd and PYTHONPATH), so every part is that tree's own
_CHILD = r"""
import json, os, subprocess, sys, time
os.environ.setdefault("FLOWSERVE_QUIET", "1")
import numpy as np
from benchmarks.client import BareClient
from benchmarks.fusion import chain_flow
from executors import ClusterConfig, LocalCluster
from flow import Flow

seconds, mb, rate, kind = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
small = Flow("small")
small.map(lambda v: v + 1, names=["y"], col="v")
ROW, JSON = b'{"v": 1.0}', {"Content-Type": "application/json"}

def timed(http, url, n_seconds):
    out, end = [], time.perf_counter() + n_seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        r = http.post(url, content=ROW, headers=JSON)
        out.append((time.perf_counter() - t0) * 1e3)
        if r.status_code != 200:
            raise SystemExit(f"small flow answered {r.status_code}: {r.text[:200]}")
    return out

with LocalCluster(ClusterConfig(max_body_bytes=64 << 20)) as c:
    if kind == "arrow":
        big_url = c.deploy(chain_flow(10, "fused", False), optimize=True).url
    elif kind == "json-image":  # an image as nested lists: 224x224x3 uint8, its mean brightness back
        from flow import ColumnType
        images = Flow("images", schema={"img": ColumnType.tensor(np.uint8, (224, 224, 3))})
        images.map(lambda t: t["img"].reshape(len(t["img"]), -1).mean(axis=1), names=["y"], batching=True)
        big_url = c.deploy(images).url
    else:  # json-answer: a small request, --mb of float32 tensor back as JSON
        size = int(mb * (1 << 20)) // 4
        answers = Flow("answers", schema={"n": int})
        answers.map(lambda t: np.tile(np.linspace(0, 1, size, dtype=np.float32), (len(t["n"]), 1)), names=["y"], batching=True)
        big_url = c.deploy(answers).url
    small_url = c.deploy(small).url
    with BareClient(timeout=30) as http:
        timed(http, small_url, 0.5)  # warm up
        alone = timed(http, small_url, seconds / 3)
        # the big client is a process of its own: in this one its reads of 10 MB answers
        # would hold the GIL and delay the small client's, not the server's, work
        big = subprocess.Popen([sys.executable, "-c", BIG, big_url, str(mb), str(rate), kind],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert big.stdout.readline().strip() == "sending"
        beside = timed(http, small_url, seconds)
        out, _ = big.communicate("", timeout=120)  # stdin closed: stop
b = np.asarray(json.loads(out))
print(json.dumps({
    "small_alone_p50_ms": float(np.median(alone)), "small_alone_p99_ms": float(np.percentile(alone, 99)),
    "small_p50_ms": float(np.median(beside)), "small_p99_ms": float(np.percentile(beside, 99)),
    "small_n": len(beside), "big_n": len(b), "big_p50_ms": float(np.median(b[:, 0])),
    "big_gateway_p50_ms": float(np.median(b[:, 1])),
}))
"""

# the big client: 10 MiB Arrow bodies (or JSON images) at a fixed rate until its stdin closes
_BIG = r"""
import json, sys, threading, time
import numpy as np
from benchmarks.client import BareClient
import orjson
from benchmarks.fusion import arrow_body, post_arrow

url, mb, rate, kind = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
if kind == "arrow":
    body = arrow_body({"x": np.random.default_rng(0).standard_normal((1, int(mb * (1 << 20)) // 4)).astype(np.float32)})
else:
    img = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
    body = orjson.dumps({"img": img}, option=orjson.OPT_SERIALIZE_NUMPY) if kind == "json-image" else b'{"n": 1}'

    def post_arrow(http, url, body):  # the same figures for a JSON request
        t0 = time.perf_counter()
        r = http.post(url, content=body, headers={"Content-Type": "application/json"})
        if r.status_code != 200:
            raise SystemExit(f"images answered {r.status_code}: {r.text[:200]}")
        return (time.perf_counter() - t0) * 1e3, float(r.headers["server-timing"].split("dur=")[1].split(",")[0])
stop, got = threading.Event(), []
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
with BareClient(timeout=120) as http:
    for _ in range(3):
        post_arrow(http, url, body)
    print("sending", flush=True)
    due = time.perf_counter()
    while not stop.is_set():
        got.append(post_arrow(http, url, body))
        due += 1.0 / rate
        if due > time.perf_counter():
            stop.wait(due - time.perf_counter())
        else:
            due = time.perf_counter()  # behind: send at once, do not burst to catch up
print(json.dumps(got))
"""


def _one(tree: str, seconds: float, mb: float, rate: float, kind: str = "arrow") -> dict:
    env = dict(os.environ, PYTHONPATH=tree, FLOWSERVE_QUIET="1")
    out = subprocess.run(
        [sys.executable, "-c", f"BIG = {_BIG!r}\n" + _CHILD, str(seconds), str(mb), str(rate), kind],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks bigbeside", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", help="also run this checkout, alternating rep by rep: an A/B")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0, help="the small client's time beside the big one")
    p.add_argument("--mb", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=25.0, help="big requests per second (open loop)")
    p.add_argument(
        "--kind",
        choices=("arrow", "json-image", "json-answer"),
        default="arrow",
        help="the big requests: --mb of float32 as Arrow to a fused 10-stage chain (default), a 224x224x3 "
        "uint8 image as JSON nested lists (640 KB) to a one-map flow, or a small JSON request answered "
        "with --mb of float32 as JSON",
    )
    p.add_argument("--out", default="bigbeside")
    args = p.parse_args(argv)
    trees = {"this tree": str(ROOT)}
    if args.baseline:
        trees[f"@ {os.path.basename(os.path.abspath(args.baseline))}"] = os.path.abspath(args.baseline)
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for rep in range(args.reps):
        order = list(trees) if rep % 2 == 0 else list(reversed(trees))
        for name in order:
            r = _one(trees[name], args.seconds, args.mb, args.rate, args.kind)
            runs[name].append(r)
            progress(
                f"rep {rep + 1} {name}: small p50 {r['small_p50_ms']:.3f} / p99 {r['small_p99_ms']:.2f} ms "
                f"(alone {r['small_alone_p50_ms']:.3f} / {r['small_alone_p99_ms']:.2f}); big p50 "
                f"{r['big_p50_ms']:.1f} ms ({r['big_n']} sent), in the gateway {r['big_gateway_p50_ms']:.2f} ms"
            )
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    for name, m in medians.items():
        progress(
            f"{name} (median of {args.reps}): small p50 {m['small_p50_ms']:.3f} / p99 {m['small_p99_ms']:.2f} ms, "
            f"big p50 {m['big_p50_ms']:.1f} ms"
        )
    out = {"settings": vars(args), "runs": runs, "medians": medians}
    save(args.out, out)
    return out


if __name__ == "__main__":
    run()
