"""Batching: throughput of one CNN operator at batch sizes 1-40, on the CPU.

The seed's experiment (report section 5) ran one AlexNet operator at batch 1-40 (CPU
throughput 2x from batch 1 to 20). Here the operator is a small conv net defined below,
with one torch thread (one executor per core) and random weights, in two shapes:

- ``mini_alexnet`` (the default): AlexNet's proportions scaled to a 28x28 image: two
  3x3 conv + pool layers, then three dense layers (3136 -> 2048 -> 2048 -> 10; 10.6 M
  weights, most of them, as in AlexNet, in the dense layers);
- ``small_conv``: the same two conv layers (16 and 32 channels) and a small dense head
  (1568 -> 128 -> 10; 0.2 M weights): compute-bound, so batching helps it less.

Each is measured:

1. ``torch``: the net alone on a batch tensor (the ceiling);
2. ``operator``: the operator through FlowServe's batching path in-process: b one-row
   request Tables merged with ``Table.concat``, the deployed stage (``executors.worker.stage_runner.BoundStage`` of the
   optimized plan) run on the merged Table, the output split back by qid (what an
   executor's batcher does, minus the sockets);
3. ``http`` (``mini_alexnet`` only): the flow deployed on a local cluster with
   ``BatchConfig(max_batch_size=b)``, loaded by wrk with ``--concurrency`` clients sending
   one image per request (JSON).

Batch sizes are interleaved in rounds; figures are medians over rounds.

    python -m benchmarks batching [--rounds 3] [--seconds 1] [--http-seconds 5] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time

import numpy as np

from benchmarks.common import plt, progress, save, save_plot, wait_http, wrk
from executors.worker.stage_runner import BoundStage

BATCHES = (1, 2, 5, 10, 20, 30, 40)
HTTP_BATCHES = (1, 5, 10, 20, 40)


MODELS = ("mini_alexnet", "small_conv")


def cnn(model: str = "mini_alexnet"):
    import torch

    nn = torch.nn
    torch.manual_seed(0)
    if model == "mini_alexnet":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 2048),
            nn.ReLU(),
            nn.Linear(2048, 2048),
            nn.ReLU(),
            nn.Linear(2048, 10),
        ).eval()
    if model == "small_conv":
        return nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 7 * 7, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        ).eval()
    raise ValueError(f"unknown model {model!r}; expected one of {MODELS}")


class CNN:
    """The operator: a batch of uint8 28x28 images -> (class, confidence) per image."""

    model = "mini_alexnet"

    def __init__(self):
        import torch

        torch.set_num_threads(1)
        self.net = cnn(self.model)

    def __call__(self, table):
        import torch

        with torch.inference_mode():
            x = torch.from_numpy(np.asarray(table["img"], dtype=np.float32)).unsqueeze(1) / 255.0
            conf, cls = torch.softmax(self.net(x), dim=1).max(dim=1)
        return cls.numpy().astype(np.int64), conf.numpy().astype(np.float64)


class SmallConv(CNN):
    model = "small_conv"


OPERATORS = {"mini_alexnet": CNN, "small_conv": SmallConv}


def cnn_flow(name: str = "cnn", model: str = "mini_alexnet"):
    from flow import ColumnType, Flow

    flow = Flow(name, schema={"img": ColumnType.tensor(np.uint8, (28, 28))})
    flow.map(OPERATORS[model], names=["cls", "conf"], batching=True)
    return flow


def split_by_owner(items, out):
    """The output rows of each request of a merged batch (as the executor's batcher splits)."""
    owner = {}
    for k, t in enumerate(items):
        for q in t.qid.tolist():
            owner[q] = k
    rows = [[] for _ in items]
    for i, q in enumerate(out.qid.tolist()):
        rows[owner[q]].append(i)
    return [out.take(np.asarray(r, dtype=np.int64)) for r in rows]


def throughput(fn, batch: int, seconds: float, n_inputs: int) -> float:
    """Images per second of ``fn(start, batch)`` called back to back for ``seconds``."""
    fn(0, batch)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for j in range(0, n_inputs - batch + 1, batch):
            fn(j, batch)
            done += batch
    return done / (time.perf_counter() - t0)


def in_process(rounds: int, seconds: float, models=MODELS) -> dict:
    import torch

    from flow.table import Table
    from optimizer import BatchConfig, OptimizerOptions, optimize

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    n = 400
    imgs = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    tensor = torch.from_numpy(imgs.astype(np.float32)).unsqueeze(1) / 255.0
    requests = [Table.from_dict({"img": imgs[i : i + 1]}, qid=[i]) for i in range(n)]
    fns = {}
    for model in models:
        net = cnn(model)
        plan = optimize(cnn_flow(model=model), options=OptimizerOptions(batch=BatchConfig(max_batch_size=max(BATCHES))))
        (stage,) = plan.stages.values()
        bound = BoundStage(stage)

        def torch_only(j, b, net=net):
            with torch.inference_mode():
                net(tensor[j : j + b])

        def operator(j, b, bound=bound):
            items = requests[j : j + b]
            merged = Table.concat(items) if b > 1 else items[0]
            split_by_owner(items, bound([merged]))

        fns[(model, "torch")], fns[(model, "operator")] = torch_only, operator
    samples = {(key, b): [] for key in fns for b in BATCHES}
    for r in range(rounds):
        for b in BATCHES:
            for key, fn in fns.items():
                samples[(key, b)].append(throughput(fn, b, seconds, n))
        for model in models:
            progress(
                f"in-process round {r + 1} {model}: "
                + "  ".join(f"b={b}: {samples[((model, 'operator'), b)][-1]:5.0f}/s" for b in BATCHES)
                + " (operator)"
            )
    out = {}
    for model, what in fns:
        med = {b: statistics.median(samples[((model, what), b)]) for b in BATCHES}
        out.setdefault(model, {})[what] = {
            "images_per_s": med,
            "gain_vs_batch_1": {b: med[b] / med[1] for b in BATCHES},
            "rounds": {b: samples[((model, what), b)] for b in BATCHES},
        }
        progress(
            f"{model} {what:8s}: " + "  ".join(f"b={b}: {med[b]:5.0f}/s ({med[b] / med[1]:.2f}x)" for b in BATCHES)
        )
    return out


def _batch_metrics(http, name: str) -> tuple[float, float]:
    """(sum, count) of the batch-size histogram of flow ``name``'s stage, from /metrics."""
    text = http.get("/metrics").text
    s = re.search(rf'flowserve_stage_batch_size_sum{{flow="{name}",[^}}]*}} ([\d.e+]+)', text)
    c = re.search(rf'flowserve_stage_batch_size_count{{flow="{name}",[^}}]*}} ([\d.e+]+)', text)
    return (float(s.group(1)) if s else 0.0), (float(c.group(1)) if c else 0.0)


def over_http(rounds: int, seconds: float, concurrency: int, executors: int, wait_ms: float) -> dict:
    from executors import ClusterConfig, LocalCluster
    from optimizer import BatchConfig, OptimizerOptions

    img = np.random.default_rng(1).integers(0, 256, (28, 28), dtype=np.uint8)
    body = json.dumps({"img": img.tolist()}).encode()
    samples = {b: [] for b in HTTP_BATCHES}
    with LocalCluster(ClusterConfig(executors=executors)) as cluster:
        urls = {}
        for b in HTTP_BATCHES:
            d = cluster.deploy(
                cnn_flow(f"cnn_b{b}", "mini_alexnet"),
                options=OptimizerOptions(batch=BatchConfig(max_batch_size=b, max_wait_ms=wait_ms)),
            )
            urls[b] = d.url
            wait_http(d.url, body)
            wrk(d.url, body, concurrency, 1)  # warm up
        for r in range(rounds):
            for b in HTTP_BATCHES:
                before = _batch_metrics(cluster.http, f"cnn_b{b}")
                res = wrk(urls[b], body, concurrency, seconds, threads=2)
                after = _batch_metrics(cluster.http, f"cnn_b{b}")
                res["mean_batch"] = (after[0] - before[0]) / max(1.0, after[1] - before[1])
                samples[b].append(res)
            progress(
                f"http round {r + 1}: "
                + "  ".join(
                    f"b={b}: {samples[b][-1]['rps']:6.0f} req/s (batch {samples[b][-1]['mean_batch']:.1f})"
                    for b in HTTP_BATCHES
                )
            )
    out = {}
    for key in ("rps", "p50_ms", "p99_ms", "mean_batch"):
        out[key] = {b: statistics.median(s[key] for s in samples[b]) for b in HTTP_BATCHES}
    out["gain_vs_batch_1"] = {b: out["rps"][b] / out["rps"][1] for b in HTTP_BATCHES}
    out["non_2xx"] = {b: sum(s["non_2xx"] for s in samples[b]) for b in HTTP_BATCHES}
    out["rounds"] = samples
    progress(
        "http    : "
        + "  ".join(
            f"b={b}: {out['rps'][b]:6.0f} req/s ({out['gain_vs_batch_1'][b]:.2f}x, p99 {out['p99_ms'][b]:.1f} ms)"
            for b in HTTP_BATCHES
        )
    )
    return out


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks batching", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds over every batch size (default 3)")
    p.add_argument("--seconds", type=float, default=1.0, help="in-process seconds per batch size and round")
    p.add_argument("--http-seconds", type=float, default=5.0, help="wrk seconds per batch size and round")
    p.add_argument("--concurrency", type=int, default=48, help="wrk connections (default 48)")
    p.add_argument("--executors", type=int, default=1, help="executors of the HTTP run (default 1)")
    p.add_argument("--wait-ms", type=float, default=2.0, help="BatchConfig.max_wait_ms of the HTTP run")
    p.add_argument("--no-http", action="store_true", help="only the in-process measurements")
    p.add_argument("--quick", action="store_true", help="1 round, shorter runs")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    if args.quick:
        args.rounds, args.seconds, args.http_seconds = 1, 0.5, 2.0
    out = {
        "batches": list(BATCHES),
        "http_batches": list(HTTP_BATCHES),
        "rounds": args.rounds,
        "models": {
            "mini_alexnet": "conv(1->32,3x3)+pool, conv(32->64,3x3)+pool, dense 3136->2048->2048->10",
            "small_conv": "conv(1->16,3x3)+pool, conv(16->32,3x3)+pool, dense 1568->128->10",
        },
        "input": "28x28 uint8 image",
        "torch_threads": 1,
    }
    out["in_process"] = in_process(args.rounds, args.seconds)
    if not args.no_http:
        out["http"] = over_http(args.rounds, args.http_seconds, args.concurrency, args.executors, args.wait_ms)
        out["http"].update(concurrency=args.concurrency, executors=args.executors, max_wait_ms=args.wait_ms)
    save("batching", out)
    _plot(out)
    return out


def _plot(out: dict) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for i, (model, res) in enumerate(out["in_process"].items()):
        for what, style in (("torch", "o--"), ("operator", "s-")):
            gain = {int(b): g for b, g in res[what]["gain_vs_batch_1"].items()}
            per_s = {int(b): v for b, v in res[what]["images_per_s"].items()}
            label = (
                f"{model}, "
                + ("torch alone" if what == "torch" else "via FlowServe's batching path")
                + f" ({per_s[1]:.0f} -> {per_s[20]:.0f} images/s at 20)"
            )
            ax.plot(
                list(gain), list(gain.values()), style, color=f"C{i}", alpha=0.5 if what == "torch" else 1, label=label
            )
    ax.axhline(2.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("batch size")
    ax.set_ylabel("throughput / throughput at batch 1")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.set_title("in-process, one CPU thread", fontsize=10)
    ax = axes[1]
    if "http" in out:
        h = out["http"]
        rps = {int(b): v for b, v in h["rps"].items()}
        mean_batch = {int(b): v for b, v in h["mean_batch"].items()}
        ax.plot(list(rps), list(rps.values()), "s-")
        for b, v in rps.items():
            ax.annotate(
                f"batch {mean_batch[b]:.1f}",
                (b, v),
                textcoords="offset points",
                xytext=(0, -14),
                ha="center",
                fontsize=7,
            )
        ax.set_xlabel("BatchConfig.max_batch_size")
        ax.set_ylabel("requests / s over HTTP (mini_alexnet)")
        ax.set_ylim(bottom=0)
        ax.set_title(
            f"HTTP, {h['concurrency']} clients, {h['executors']} executor: "
            f"{h['gain_vs_batch_1']['20' if '20' in h['gain_vs_batch_1'] else 20]:.2f}x at 20",
            fontsize=10,
        )
    save_plot(fig, "batching")


if __name__ == "__main__":
    run()
