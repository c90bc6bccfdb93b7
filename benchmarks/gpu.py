"""GPU executors: batching throughput on the GPU and on the CPU, the Ensemble with its large
model on a GPU, and what NVML sees over a load step.

The model is an MLP defined below (a flattened 28x28 uint8 image, three hidden layers of
``--width`` units, default 4096: 37 M weights, 147 MB in float32), big enough that the GPU
matters. Random weights: throughput does not depend on them.

1. ``in_process``: the model alone (``torch``: one batch tensor in, the classes back on the
   host) and through FlowServe's batching path (``operator``: b one-row request Tables merged
   with ``Table.concat``, the stage run by ``BoundStage``, the output split back by qid), at
   batch sizes 1-40, on the GPU and on the CPU with one torch thread (an executor per core,
   the runtime's shape) and with all cores.
2. ``cluster``: the same operator deployed on one local cluster (CPU executors and one gpu
   executor) as a gpu=True flow and as a CPU flow, ``BatchConfig(max_batch_size=b)``,
   loaded over HTTP by ``--clients`` closed-loop clients (processes of threads, one image
   per JSON request); the mean batch size comes from ``/metrics``.
3. ``ensemble``: the README's Ensemble (preprocess, a small and the large model in
   parallel, join, pick the more confident) with the large model on the gpu executor vs on
   the CPU executors (the same cluster), under the same load.
4. ``nvml``: GPU utilisation and memory (NVML, sampled at 10 Hz) while the GPU flow goes
   idle -> loaded -> idle.

The research this compares with: batching gave 3.5x the throughput from batch 1 to 20 on a
GPU, and the GPU 6x the CPU at batch 1. Parts that need a GPU are reported as skipped
where torch sees none; everything else still runs.

    python -m benchmarks gpu [--short] [--width 4096] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, machine, plt, progress

BATCHES = (1, 2, 5, 10, 20, 30, 40)
CLUSTER_BATCHES = (1, 5, 10, 20, 40)
IMAGE = (28, 28)
REQUEST_TIMEOUT_S = 20.0  # the cluster's deadline: a lost request costs a measurement this much at most
CLIENT_TIMEOUT_S = REQUEST_TIMEOUT_S + 5


# -- the model and its operators (module level: executors import them) ---------------------------


def mlp(width: int, layers: int = 3):
    import torch

    torch.manual_seed(0)
    nn = torch.nn
    mods = [nn.Flatten(), nn.Linear(IMAGE[0] * IMAGE[1], width), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(width, width), nn.ReLU()]
    mods.append(nn.Linear(width, 10))
    return nn.Sequential(*mods).eval()


class Model:
    """The MLP on ``flow.current_device()`` (the GPU on a gpu executor): images -> class, confidence."""

    def __init__(self, width: int):
        from flow import current_device

        self.device = current_device()
        self.net = mlp(width).to(self.device)

    def __call__(self, table):
        import torch

        with torch.inference_mode():
            x = table.tensor("img").to(self.device).float().div_(255.0)
            conf, cls = torch.softmax(self.net(x), dim=1).max(dim=1)
        return cls, conf  # 1-d tensors: copied to the host as the stage's output


def build_model(width: int) -> Model:
    return Model(width)


def run_model(model: Model, table):
    return model(table)


def model_flow(name: str, width: int, gpu: bool):
    from flow import ColumnType, Flow

    f = Flow(name, schema={"img": ColumnType.tensor(np.uint8, IMAGE)})
    f.map(run_model, init=partial(build_model, width), names=["cls", "conf"], batching=True, gpu=gpu)
    return f


def preprocess(table):
    return (np.asarray(table["img"], dtype=np.float32) / 255.0 - 0.1) / 0.3


def build_small(width: int) -> Model:
    m = Model.__new__(Model)
    m.device, m.net = "cpu", mlp(64, layers=1)  # the small model stays on the CPU
    return m


def run_float_model(model: Model, table):
    import torch

    with torch.inference_mode():
        conf, cls = torch.softmax(model.net(table.tensor("img").to(model.device)), dim=1).max(dim=1)
    return cls, conf


def pick(row):
    return (row.cls, row.conf) if row.conf >= row.conf_right else (row.cls_right, row.conf_right)


def ensemble_flow(name: str, width: int, gpu: bool):
    """The README's Ensemble, its large model ``width`` wide (on a gpu executor if ``gpu``)."""
    from flow import ColumnType, Flow

    f = Flow(name, schema={"img": ColumnType.tensor(np.uint8, IMAGE)})
    img = f.map(preprocess, names=["img"], batching=True)
    small = img.map(run_float_model, init=partial(build_small, 64), names=["cls", "conf"], batching=True)
    big = img.map(run_float_model, init=partial(build_model, width), names=["cls", "conf"], batching=True, gpu=gpu)
    small.join(big).map(pick, names=["cls", "conf"])
    return f


# -- the machine -------------------------------------------------------------------------------


def cuda_facts() -> dict:
    """torch and CUDA as this process sees them (it may initialise CUDA: a benchmark may)."""
    try:
        import torch
    except ImportError:
        return {"torch": None, "cuda": False, "why": "torch is not installed"}
    facts = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda": False}
    if not torch.cuda.is_available():
        facts["why"] = "torch.cuda.is_available() is False"
        return facts
    p = torch.cuda.get_device_properties(0)
    facts.update(
        cuda=True, device=p.name, devices=torch.cuda.device_count(), memory_gib=round(p.total_memory / 2**30, 1)
    )
    return facts


def nvml_sampler():
    """A callable giving (utilisation %, memory used bytes) of GPU 0, or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:
        return None

    def sample():
        return pynvml.nvmlDeviceGetUtilizationRates(h).gpu, pynvml.nvmlDeviceGetMemoryInfo(h).used

    return sample


# -- in-process ------------------------------------------------------------------------------


def rate(fn, batch: int, seconds: float) -> float:
    """Images per second of ``fn(batch)`` called back to back for ``seconds`` (after one warm-up)."""
    fn(batch)
    done, t0 = 0, time.perf_counter()
    while True:
        fn(batch)
        done += batch
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return done / elapsed


def split_by_owner(items, out):
    owner = {q: k for k, t in enumerate(items) for q in t.qid.tolist()}
    rows = [[] for _ in items]
    for i, q in enumerate(out.qid.tolist()):
        rows[owner[q]].append(i)
    return [out.take(np.asarray(r, dtype=np.int64)) for r in rows]


def in_process(width: int, seconds: float, cuda: bool) -> dict:
    import torch

    from executors.worker.stage_runner import BoundStage
    from flow.context import set_device
    from flow.table import Table
    from optimizer import BatchConfig, OptimizerOptions, optimize

    rng = np.random.default_rng(0)
    n = max(BATCHES)
    imgs = rng.integers(0, 256, (n,) + IMAGE, dtype=np.uint8)
    requests = [Table.from_dict({"img": imgs[i : i + 1]}, qid=[i]) for i in range(n)]
    cores = os.cpu_count() or 1
    setups = [("cpu_1_thread", "cpu", 1), (f"cpu_{cores}_threads", "cpu", cores)]
    if cuda:
        setups.append(("gpu", "cuda", cores))
    else:
        progress("in-process: no CUDA device: GPU skipped")
    out = {}
    for label, device, threads in setups:
        torch.set_num_threads(threads)
        set_device(device)
        try:
            net = mlp(width).to(device)
            plan = optimize(
                model_flow("mlp", width, gpu=False), options=OptimizerOptions(batch=BatchConfig(max_batch_size=n))
            )
            (stage,) = plan.stages.values()
            bound = BoundStage(stage)

            def torch_only(b, net=net, device=device):
                with torch.inference_mode():
                    x = torch.from_numpy(imgs[:b]).to(device).float().div_(255.0)
                    net(x).argmax(dim=1).cpu()

            def operator(b, bound=bound):
                items = requests[:b]
                split_by_owner(items, bound([Table.concat(items) if b > 1 else items[0]]))

            res = {}
            for what, fn in (("torch", torch_only), ("operator", operator)):
                per_s = {b: rate(fn, b, seconds) for b in BATCHES}
                res[what] = {"images_per_s": per_s, "gain_vs_batch_1": {b: per_s[b] / per_s[1] for b in BATCHES}}
                progress(
                    f"in-process {label:14s} {what:8s}: "
                    + "  ".join(f"b={b}: {v:7.0f}/s" for b, v in per_s.items())
                    + f"  ({per_s[20] / per_s[1]:.2f}x at 20)"
                )
            out[label] = res
        finally:
            set_device("cpu")
            del net
            if device == "cuda":
                torch.cuda.empty_cache()
    torch.set_num_threads(cores)
    if cuda:
        g, c = out["gpu"]["operator"]["images_per_s"], out["cpu_1_thread"]["operator"]["images_per_s"]
        out["gpu_vs_cpu_1_thread"] = {b: g[b] / c[b] for b in BATCHES}
        c_all = out[f"cpu_{cores}_threads"]["operator"]["images_per_s"]
        out["gpu_vs_cpu_all_threads"] = {b: g[b] / c_all[b] for b in BATCHES}
    return out


# -- load over HTTP --------------------------------------------------------------------------


def _client(url: str, body: bytes, until: float, lat: list, errors: list) -> None:
    import httpx

    headers = {"Content-Type": "application/json"}
    with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
        while time.time() < until:
            t0 = time.perf_counter()
            try:
                ok = http.post(url, content=body, headers=headers).status_code == 200
            except httpx.HTTPError:
                ok = False
            (lat if ok else errors).append((time.perf_counter() - t0) * 1000)


def _load_worker(url: str, body: bytes, threads: int, start: float, seconds: float) -> tuple[list, int]:
    """One load process: ``threads`` closed-loop clients from wall time ``start`` for ``seconds``."""
    time.sleep(max(0.0, start - time.time()))
    lat: list = []
    errors: list = []
    ts = [threading.Thread(target=_client, args=(url, body, start + seconds, lat, errors)) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return lat, len(errors)


class Load:
    """Closed-loop HTTP clients in ``procs`` processes (spawned: the caller may hold CUDA)."""

    def __init__(self, procs: int):
        self.procs = procs
        self.pool = multiprocessing.get_context("spawn").Pool(procs)

    def run(self, url: str, body: bytes, clients: int, seconds: float) -> dict:
        start = time.time() + 0.5  # every process starts together
        per = [clients // self.procs + (1 if i < clients % self.procs else 0) for i in range(self.procs)]
        parts = self.pool.starmap(_load_worker, [(url, body, k, start, seconds) for k in per if k])
        lat = sorted(x for part, _ in parts for x in part)
        errors = sum(e for _, e in parts)
        if not lat:
            return {"rps": 0.0, "p50_ms": None, "p99_ms": None, "errors": errors}
        return {
            "rps": len(lat) / seconds,
            "p50_ms": lat[len(lat) // 2],
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
            "errors": errors,
        }

    def close(self) -> None:
        self.pool.close()
        self.pool.join()


def image_body(seed: int = 1) -> bytes:
    """One image as a JSON list of one row. (Not one object: the gateway would relay that
    body unparsed to the executor of a one-stage flow, and at 17+ concurrent requests
    executors then drop some: RawInput.body arrives as a memoryview that httpcodec._loads
    cannot read, and the request hangs until its deadline.)"""
    img = np.random.default_rng(seed).integers(0, 256, IMAGE, dtype=np.uint8)
    return json.dumps([{"img": img.tolist()}]).encode()


def batch_metrics(http, flow: str) -> tuple[float, float]:
    """(sum, count) of the batch-size histogram of ``flow``'s stages, from /metrics."""
    text = http.get("/metrics").text
    s = c = 0.0
    for m in re.finditer(
        rf'flowserve_stage_batch_size_(sum|count){{flow="{re.escape(flow)}",[^}}]*}} ([\d.e+]+)', text
    ):
        if m.group(1) == "sum":
            s += float(m.group(2))
        else:
            c += float(m.group(2))
    return s, c


def warm(http, url: str, body: bytes, n: int = 5) -> None:
    for _ in range(n):
        r = http.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=120)
        if r.status_code != 200:
            raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:500]}")


def cluster_runs(width: int, seconds: float, clients: int, executors: int, cuda: bool, load: Load, nvml, steps) -> dict:
    from executors import ClusterConfig, LocalCluster
    from optimizer import BatchConfig, OptimizerOptions

    body = image_body()
    out: dict = {"clients": clients, "executors": executors, "gpu_executors": int(cuda), "seconds": seconds}
    devices = ["gpu", "cpu"] if cuda else ["cpu"]
    if not cuda:
        progress("cluster: no CUDA device: the GPU flows are skipped")
    t0 = time.monotonic()
    with LocalCluster(
        ClusterConfig(executors=executors, gpu_executors=int(cuda), request_timeout_s=REQUEST_TIMEOUT_S)
    ) as cluster:
        progress(f"cluster: {executors} CPU executors + {int(cuda)} gpu executor up in {time.monotonic() - t0:.1f} s")
        urls = {}
        for dev in devices:
            for b in CLUSTER_BATCHES:
                name = f"mlp_{dev}_b{b}"
                d = cluster.deploy(
                    model_flow(name, width, gpu=dev == "gpu"),
                    options=OptimizerOptions(batch=BatchConfig(max_batch_size=b)),
                )
                urls[(dev, b)] = d.url
                warm(cluster.http, d.url, body)
        progress(f"cluster: {len(urls)} flows deployed and warm at {time.monotonic() - t0:.1f} s")
        batching: dict = {}
        for dev in devices:
            res = {}
            for b in CLUSTER_BATCHES:
                before = batch_metrics(cluster.http, f"mlp_{dev}_b{b}")
                r = load.run(urls[(dev, b)], body, clients, seconds)
                after = batch_metrics(cluster.http, f"mlp_{dev}_b{b}")
                r["mean_batch"] = (after[0] - before[0]) / max(1.0, after[1] - before[1])
                res[b] = r
            batching[dev] = {
                "runs": res,
                "rps": {b: r["rps"] for b, r in res.items()},
                "gain_vs_batch_1": {b: res[b]["rps"] / max(res[1]["rps"], 1e-9) for b in CLUSTER_BATCHES},
            }
            progress(
                f"cluster {dev}: "
                + "  ".join(f"b={b}: {r['rps']:6.0f}/s (batch {r['mean_batch']:.1f})" for b, r in res.items())
                + f"  [{time.monotonic() - t0:.0f} s]"
            )
        out["batching"] = batching
        if cuda:
            out["gpu_vs_cpu"] = {
                b: batching["gpu"]["rps"][b] / max(batching["cpu"]["rps"][b], 1e-9) for b in CLUSTER_BATCHES
            }

        ens = {}
        for dev in devices:
            d = cluster.deploy(ensemble_flow(f"ensemble_{dev}", width, gpu=dev == "gpu"))
            warm(cluster.http, d.url, body)
            ens[dev] = load.run(d.url, body, clients, seconds)
            ens[dev]["stages"] = {n: s.device for n, s in d.plan.stages.items()}
            progress(
                f"ensemble, large model on the {dev}: {ens[dev]['rps']:.0f} req/s, "
                f"p50 {ens[dev]['p50_ms']:.1f} ms, p99 {ens[dev]['p99_ms']:.1f} ms  [{time.monotonic() - t0:.0f} s]"
            )
        out["ensemble"] = ens
        if cuda:
            out["ensemble_gpu_vs_cpu_rps"] = ens["gpu"]["rps"] / max(ens["cpu"]["rps"], 1e-9)

        if cuda and nvml is not None:
            out["nvml"] = load_step(nvml, load, urls[("gpu", 20)], body, clients, steps)
        else:
            progress("nvml: " + ("no CUDA device" if not cuda else "NVML is not available") + ": skipped")
    return out


def load_step(nvml, load: Load, url: str, body: bytes, clients: int, steps: tuple) -> dict:
    """NVML at 10 Hz while the GPU flow is idle, loaded, idle again (``steps`` seconds each)."""
    idle1, busy, idle2 = steps
    samples: list = []
    stop = threading.Event()
    t0 = time.monotonic()

    def sampler():
        while not stop.wait(0.1):
            util, used = nvml()
            samples.append((time.monotonic() - t0, int(util), int(used)))

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    time.sleep(idle1)  # the idle phase is the measurement itself
    load_at = time.monotonic() - t0
    r = load.run(url, body, clients, busy)
    done_at = time.monotonic() - t0
    time.sleep(idle2)
    stop.set()
    th.join()

    def phase(a, b):
        part = [s for s in samples if a <= s[0] < b]
        if not part:
            return None
        return {
            "utilisation_mean": statistics.fmean(s[1] for s in part),
            "utilisation_max": max(s[1] for s in part),
            "memory_used_max_mib": max(s[2] for s in part) / 2**20,
        }

    out = {
        "t_s": [round(s[0], 3) for s in samples],
        "utilisation": [s[1] for s in samples],
        "memory_used_mib": [round(s[2] / 2**20, 1) for s in samples],
        "load_from_s": load_at + 0.5,  # Load.run starts its clients 0.5 s after it is called
        "load_to_s": done_at,
        "load": r,
        "idle_before": phase(0, load_at),
        "loaded": phase(load_at + 1.0, done_at),
        "idle_after": phase(done_at + 1.0, float("inf")),
    }
    progress(
        "nvml: utilisation "
        + ", ".join(f"{k} {out[k]['utilisation_mean']:.0f}%" for k in ("idle_before", "loaded", "idle_after") if out[k])
    )
    return out


# -- run, save, plot ---------------------------------------------------------------------------


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--short", action="store_true", help="short runs: the whole benchmark in about 4 minutes")
    p.add_argument("--width", type=int, default=4096, help="hidden units of the MLP's three layers (default 4096)")
    p.add_argument("--seconds", type=float, default=1.0, help="in-process seconds per batch size and device")
    p.add_argument("--http-seconds", type=float, default=5.0, help="seconds of load per cluster measurement")
    p.add_argument("--clients", type=int, default=48, help="closed-loop HTTP clients (default 48)")
    p.add_argument("--executors", type=int, default=None, help="CPU executors (default: half the cores, 1 to 8)")
    p.add_argument("--no-cluster", action="store_true", help="only the in-process measurements")
    p.add_argument("--out", default=str(RESULTS), help=f"folder for gpu.json and gpu.png (default {RESULTS})")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    cores = os.cpu_count() or 1
    steps = (3.0, 6.0, 3.0)
    if args.short:
        args.seconds, args.http_seconds, steps = 0.3, 2.0, (2.0, 4.0, 2.0)
    executors = args.executors or max(1, min(8, cores // 2))
    facts = cuda_facts()
    cuda = facts["cuda"]
    progress(f"torch/CUDA: {facts}")
    t0 = time.monotonic()
    out: dict = {
        "machine": {**machine(), "gpu": facts.get("device", False)},
        "cuda": facts,
        "width": args.width,
        "model": f"MLP 784 -> {args.width} -> {args.width} -> {args.width} -> 10, float32, random weights",
        "batches": list(BATCHES),
        "cluster_batches": list(CLUSTER_BATCHES),
        "short": args.short,
        "research": {"gpu_batching_gain_1_to_20": 3.5, "gpu_vs_cpu_at_batch_1": 6.0},
        "skipped": [] if cuda else ["in_process.gpu", "cluster.gpu", "ensemble.gpu", "nvml"],
    }
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after each part: a run stopped part way still leaves what it measured
        out["seconds"] = round(time.monotonic() - t0, 1)
        (folder / "gpu.json").write_text(json.dumps(out, indent=2, default=str))

    out["in_process"] = in_process(args.width, args.seconds, cuda)
    progress(f"in-process done in {time.monotonic() - t0:.0f} s")
    save()
    if not args.no_cluster:
        load = Load(max(1, min(4, cores // 4)))
        try:
            nvml = nvml_sampler() if cuda else None
            out["cluster"] = cluster_runs(
                args.width, args.http_seconds, args.clients, executors, cuda, load, nvml, steps
            )
        finally:
            load.close()
    save()
    progress(f"wrote {folder / 'gpu.json'}")
    _plot(out, folder / "gpu.png")
    progress(f"wrote {folder / 'gpu.png'} ({out['seconds']:.0f} s)")
    return out


def _plot(out: dict, path: Path) -> None:
    pyplot = plt()
    fig, axes = pyplot.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    for i, (label, res) in enumerate(
        (k, v) for k, v in out["in_process"].items() if isinstance(v, dict) and "torch" in v
    ):
        for what, style in (("torch", "o--"), ("operator", "s-")):
            per_s = res[what]["images_per_s"]
            ax.plot(
                list(per_s),
                list(per_s.values()),
                style,
                color=f"C{i}",
                alpha=0.5 if what == "torch" else 1,
                label=f"{label}, {what}",
            )
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("images / s (log)")
    ax.set_title(f"in-process: MLP width {out['width']}", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[0][1]
    cl = out.get("cluster")
    if cl:
        for i, (dev, res) in enumerate(cl["batching"].items()):
            rps = res["rps"]
            ax.plot(
                list(rps),
                list(rps.values()),
                "s-",
                color=f"C{i}",
                label=f"{dev} ({res['gain_vs_batch_1'][20]:.2f}x at 20)",
            )
            for b, r in res["runs"].items():
                ax.annotate(
                    f"{r['mean_batch']:.1f}", (b, r["rps"]), textcoords="offset points", xytext=(0, 5), fontsize=6
                )
        ax.set_xlabel("BatchConfig.max_batch_size (labels: mean batch)")
        ax.set_ylabel("requests / s over HTTP")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.set_title(
            f"deployed: {cl['clients']} clients, {cl['executors']} CPU executors + {cl['gpu_executors']} gpu",
            fontsize=10,
        )
        ax = axes[1][0]
        ens = cl["ensemble"]
        devs = list(ens)
        x = np.arange(len(devs))
        bars = ax.bar(x - 0.2, [ens[d]["rps"] for d in devs], 0.4, label="req/s")
        ax.bar_label(bars, fmt="%.0f req/s", fontsize=7)
        ax2 = ax.twinx()
        bars = ax2.bar(x + 0.2, [ens[d]["p99_ms"] or 0 for d in devs], 0.4, color="C1", label="p99 ms")
        ax2.bar_label(bars, fmt="p99 %.1f ms", fontsize=7)
        ax.set_xticks(x, [f"large model on {d}" for d in devs])
        ax.set_ylabel("requests / s")
        ax2.set_ylabel("p99 ms")
        ax.set_title("the README's Ensemble, end to end", fontsize=10)
        ax = axes[1][1]
        nv = cl.get("nvml")
        if nv:
            ax.plot(nv["t_s"], nv["utilisation"], label="utilisation %")
            ax.axvspan(nv["load_from_s"], nv["load_to_s"], color="grey", alpha=0.15, label="load")
            ax.set_xlabel("s")
            ax.set_ylabel("GPU utilisation %")
            ax2 = ax.twinx()
            ax2.plot(nv["t_s"], nv["memory_used_mib"], color="C1", label="memory used MiB")
            ax2.set_ylabel("memory used MiB")
            ax.legend(fontsize=7, loc="upper left")
            ax.set_title("NVML over a load step", fontsize=10)
    for ax in axes.flat:
        if not ax.has_data():
            ax.text(0.5, 0.5, "skipped (no GPU)" if not out["cuda"]["cuda"] else "skipped", ha="center", va="center")
            ax.set_axis_off()
    fig.suptitle(f"{out['machine']['gpu'] or 'no GPU'}, {out['machine']['cpus']} cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    run()
