"""AIMD batching on a real torch model under a 20 ms p99 SLO: throughput at the
SLO with AIMD vs the best fixed batch size of a sweep, and Ray Serve's ``@serve.batch``
on the same model.

    python -m benchmarks slo_aimd --mode stage --seconds 2 --reps 3   # the goal's run (~15 min)
    python -m benchmarks slo_aimd --mode sim                          # the rules, simulated (~1 min)
    python -m benchmarks slo_aimd [--seconds 5] [--ray-python /tmp/peer-ray/bin/python]  # HTTP + Ray

The model: AlexNet's proportions scaled to a 28x28 image (two 3x3 conv + pool layers,
dense 3136 -> 2048 -> 2048 -> 10, 10.6 M random weights, one torch thread; the same net as
``benchmarks/batching.py``'s ``mini_alexnet``): about 1.5 + 0.7 b ms for a batch of b on
this machine when it is quiet.

"Throughput at the SLO" of a configuration: the highest open-loop Poisson rate of a
ladder at which p99 <= 20 ms and nothing failed (open loop: a server that cannot keep up
shows it in its p99). At each rate, ``--reps`` rounds: in each, every configuration still
holding runs one step (``--seconds`` long, after a warm-up at the same rate), the order
rotating per round, so that what the shared machine does meanwhile falls on all of them
alike; a configuration holds the rate when the *median* of its rounds' p99 is within the
SLO, and its throughput is the last rate it held before its first miss (a later lucky
step does not count). With one round, one bisection step follows the first miss. The
deployments are kept across the ladder (AIMD carries its state, as a live service would).

Modes:

- ``stage`` (the goal's measurement): the executor's own ``Batcher`` (AIMD or the fixed
  cap, built from the plan as an executor builds it) in front of the net, fed open loop by
  a thread, no HTTP; latency from a request's scheduled arrival to the end of its batch.
  Ladder ``STAGE_RATES`` (50 req/s apart from 500: a coarser one cannot tell "within
  10%"). Each step also records the batch sizes, AIMD's cap, and the simulator's
  prediction of that step (same trace, the profile the run measured, AIMD modelled):
  ``results/slo_aimd_stage.json``;
- ``sim``: the fixed sweep, AIMD and variants of its rules in the simulator on the stage's
  curve, with and without stalls: what the rules are worth without machine noise
  (``results/slo_aimd_sim.json``);
- ``http``: one flow per configuration on one executor of a local cluster, JSON bodies of
  one image, then Ray Serve 2.60 ``@serve.batch`` on the same net at its documented
  defaults (``max_batch_size=10, batch_wait_timeout_s=0.01``) and at the sweep's best size
  with a 1 ms wait (``results/slo_aimd.json``).

Configurations: ``fixed-b``: ``BatchConfig(max_batch_size=b)``, no SLO (a batch is what is
queued when the replica is free); ``aimd``: the flow served under ``SLO(p99_ms=20)``
unplanned (one stage: its budget is the whole SLO; ``aimd_config`` gives a batch half of
it; the cap climbs from 1 up to 64). The 2-core machine is shared: read the
configurations of one run side by side, not across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SLO_MS = 20.0
RATES = (25, 50, 75, 100, 150, 200, 300, 400, 600, 800)
SWEEP = (1, 4, 8, 12, 16, 24, 32)
AIMD_CAP = 64


def net():
    """The model (fixed seed, one torch thread): batching.cnn("mini_alexnet") written out
    again on purpose, because this file also runs in the Ray Serve venv (``--serve-ray``),
    which has torch but not FlowServe, so it cannot import benchmarks.batching."""
    import torch

    nn = torch.nn
    torch.set_num_threads(1)
    torch.manual_seed(0)
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


def predict(model, imgs: np.ndarray) -> np.ndarray:
    """(n, 28, 28) uint8 images -> (n,) int64 classes."""
    import torch

    x = torch.from_numpy(((np.asarray(imgs, dtype=np.float32) / 255.0 - 0.1307) / 0.3081)[:, None])
    with torch.inference_mode():
        return model(x).argmax(dim=1).numpy().astype(np.int64)


class CNN:
    """The model as a FlowServe batching operator."""

    def __init__(self):
        self.model = net()

    def __call__(self, table):
        return predict(self.model, table["img"])


def body() -> bytes:
    img = np.random.default_rng(0).integers(0, 256, size=(28, 28), dtype=np.uint8)
    return json.dumps({"img": img.tolist()}).encode()


# -- one rate, one ladder ----------------------------------------------------------------------


def at_rate(url: str, rate: float, seconds: float) -> dict:
    from benchmarks.openloop import replay
    from optimizer.slo import poisson

    asyncio.run(replay(url, body(), poisson(rate, max(int(rate), 20), seed=11)))  # 1 s warm-up
    trace = poisson(rate, int(rate * seconds), seed=int(rate))
    lat, ok, done = asyncio.run(replay(url, body(), trace, timeout_s=10.0))
    span = float(done.max() - trace[0] / 1000.0) if len(done) else 1.0
    p99 = float(np.percentile(np.where(ok, lat, np.inf), 99, method="higher"))
    answered = float(ok.sum() / span)  # open loop: a server that falls behind shows it in p99
    return {
        "rate_rps": rate,
        "p50_ms": float(np.percentile(np.where(ok, lat, np.inf), 50, method="higher")),
        "p99_ms": p99,
        "answered_rps": answered,
        "errors": int((~ok).sum()),
        "held": bool(p99 <= SLO_MS and ok.all()),
    }


def ladders(urls: dict, seconds: float, rates=RATES, reps: int = 1) -> dict:
    """Every configuration (label -> url or callable) up the ladder of rates, interleaved:
    at each rate, ``reps`` rounds in which each configuration still holding runs once (the
    order rotates per round), so that what the shared machine does meanwhile falls on all
    of them alike. A configuration holds a rate when the median of its rounds' p99 is within
    the SLO and nothing failed; its throughput at the SLO is the last rate it held before
    its first miss (a later rate is not tried: one lucky step does not count). With one
    round, one bisection step between the last rate held and the first missed follows."""
    from benchmarks.common import progress

    steps = {k: [] for k in urls}
    best = dict.fromkeys(urls, 0.0)
    failed = {}

    def step(label, rate):
        target = urls[label]
        r = target(rate, seconds) if callable(target) else at_rate(target, rate, seconds)
        steps[label].append(r)
        extra = f", batch {r['mean_batch']:.1f}" if "mean_batch" in r else ""
        extra += f", cap {r['mean_cap']:.1f} (min {r['min_cap']})" if r.get("mean_cap") is not None else ""
        progress(
            f"{label} @ {rate:g}/s: p50 {r['p50_ms']:.1f} p99 {r['p99_ms']:.1f} ms, {r['answered_rps']:.0f}/s, "
            f"{r['errors']} errors{extra}"
        )
        return r

    def held(label, rate):
        got = [r for r in steps[label] if r["rate_rps"] == rate]
        p99 = float(np.median([r["p99_ms"] for r in got]))
        ok = p99 <= SLO_MS and not any(r["errors"] for r in got)
        progress(f"{label} @ {rate:g}/s: median p99 of {len(got)} {p99:.1f} ms -> {'held' if ok else 'missed'}")
        return ok

    for rate in rates:
        alive = [k for k in urls if k not in failed]
        if not alive:
            break
        for rnd in range(reps):
            for label in alive[rnd % len(alive) :] + alive[: rnd % len(alive)]:
                step(label, rate)
        for label in alive:
            if held(label, rate):
                best[label] = rate
            else:
                failed[label] = rate
    if reps == 1:
        for label, rate in failed.items():
            if best[label] > 0:
                mid = (best[label] + rate) / 2
                step(label, mid)
                if held(label, mid):
                    best[label] = mid
    return {k: {"throughput_at_slo_rps": best[k], "steps": steps[k]} for k in urls}


# -- the stage alone: the executor's Batcher and the model, no HTTP ---------------------------------

# 50 req/s apart from 500 on: 10% of 500 (a coarser ladder cannot tell "within 10%")
STAGE_RATES = (200, 400, 500, 550, 600, 650, 700, 750, 800, 850, 900, 950, 1000, 1100, 1200, 1400)
STAGE_SWEEP = (4, 8, 12, 16, 24, 32, 64)
WARMUP_S = 0.5  # before each step, at the step's rate (AIMD adapts to it; the batcher is kept)


def stage_plan(name: str, cap: int, budget: float | None):
    """A one-stage plan of the net: fixed cap ``cap``, or AIMD under ``budget`` up to it."""
    from dataclasses import replace

    from flow import ColumnType, Flow
    from optimizer import optimize
    from optimizer.plan import BatchConfig
    from optimizer.slo import SLO, ServingSLO

    flow = Flow(name, schema={"img": ColumnType.tensor(np.uint8, (28, 28))})
    flow.map(CNN, names=["cls"], batching=True)
    plan = optimize(flow, rules=["batching"])
    (stage_name,) = plan.stages
    stage = replace(plan.stages[stage_name], batch=BatchConfig(max_batch_size=cap), replicas=1)
    plan = plan.replace_stages({stage_name: stage})
    if budget is not None:  # unplanned SLO: AIMD from 1 up to the cap, within the budget
        plan = replace(plan, slo=ServingSLO(SLO(SLO_MS), budgets={stage_name: budget}))
    return plan, stage_name


class StageTarget:
    """One configuration of the stage alone: the executor's own ``Batcher`` (AIMD or the
    fixed cap, as the runtime builds it from the plan) in front of the net, fed open loop
    by a thread. Latency: from a request's scheduled arrival to the end of its batch. The
    batcher is kept across the ladder (AIMD keeps its state, as a live replica would)."""

    def __init__(self, label: str, cap: int, budget: float | None, model, samples: dict | None = None):
        import threading

        from executors.worker.batcher import Batcher
        from executors.worker.hosting import HostedStage

        plan, stage = stage_plan(f"stage-{label}", cap, budget)
        self.model = model
        self.img = np.random.default_rng(0).integers(0, 256, size=(28, 28), dtype=np.uint8)
        self.done_at = None
        self.left = 0
        self.all_done = threading.Event()
        self.lock = threading.Lock()
        self.sizes: list[int] = []
        self.caps: list[int] = []  # AIMD's cap when each batch was formed
        self.samples = {} if samples is None else samples  # batch size -> measured ms (the profile)
        self.cap, self.budget = cap, budget
        self.batcher = Batcher(HostedStage(plan, stage, 1), self._run, threading.Event())

    def _run(self, _hosted, batch) -> None:
        import time

        t0 = time.perf_counter()
        predict(self.model, np.stack([img for _, img in batch]))
        now = time.perf_counter()
        self.samples.setdefault(len(batch), []).append((now - t0) * 1000.0)
        self.sizes.append(len(batch))
        if self.batcher.aimd is not None:
            self.caps.append(self.batcher.aimd.batch_size)
        with self.lock:
            for i, _ in batch:
                self.done_at[i] = now
            self.left -= len(batch)
            if self.left == 0:
                self.all_done.set()

    def feed(self, trace_ms) -> np.ndarray:
        import time

        self.done_at = np.full(len(trace_ms), np.nan)
        self.left = len(trace_ms)
        self.all_done.clear()
        t0 = time.perf_counter()
        for i, at in enumerate(trace_ms.tolist()):
            delay = t0 + at / 1000.0 - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.batcher.put((i, self.img))
        if not self.all_done.wait(60):
            raise RuntimeError("the stage did not finish its requests within 60 s")
        return (self.done_at - t0) * 1000.0 - trace_ms

    def __call__(self, rate: float, seconds: float) -> dict:
        from optimizer.slo import poisson

        self.feed(poisson(rate, max(int(rate * WARMUP_S), 20), seed=11))
        del self.sizes[:], self.caps[:]
        self.seed = getattr(self, "seed", 0) + 1  # each round its own trace
        trace_seed = int(rate) * 1000 + self.seed
        lat = self.feed(poisson(rate, int(rate * seconds), seed=trace_seed))
        p99 = float(np.percentile(lat, 99))
        return {
            "rate_rps": rate,
            "trace_seed": trace_seed,
            "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": p99,
            "answered_rps": rate,
            "errors": 0,
            "mean_batch": float(np.mean(self.sizes)),
            "max_batch": int(max(self.sizes)),
            "mean_cap": float(np.mean(self.caps)) if self.caps else None,
            "min_cap": int(min(self.caps)) if self.caps else None,
            "held": bool(p99 <= SLO_MS),
        }


def stage_configs(only=None) -> list:
    """(label, cap, stage budget or None): the fixed sweep and AIMD (one stage: its budget
    is the whole SLO; ``aimd_config`` gives a batch ``BATCH_SHARE`` of it)."""
    configs = [(f"fixed-{b}", b, None) for b in STAGE_SWEEP] + [("aimd", AIMD_CAP, SLO_MS)]
    return [c for c in configs if not only or c[0] in only]


def stage_runs(seconds: float, rates=STAGE_RATES, reps: int = 3, only=None) -> dict:
    model = net()
    samples: dict[int, list] = {}
    targets = {label: StageTarget(label, cap, budget, model, samples) for label, cap, budget in stage_configs(only)}
    runs = ladders(targets, seconds, rates, reps)
    simulated(targets, runs, samples, seconds)
    return runs


def simulated(targets: dict, runs: dict, samples: dict, seconds: float) -> None:
    """The simulator's prediction of every step (same trace, the stage's profile from the
    batches the run measured, AIMD modelled as the runtime runs it): ``sim_p99_ms``,
    ``sim_mean_batch``, ``sim_mean_cap`` beside the measured figures."""
    from optimizer import INPUT
    from optimizer.slo import Profile, SimPipeline, SimStage, poisson, profile_service, simulate
    from optimizer.slo.aimd import aimd_config
    from optimizer.slo.sizing import ServingSLO
    from optimizer.slo.spec import SLO

    profile = Profile({"cnn": {"cpu": {b: ms for b, ms in sorted(samples.items())}}})
    for label, target in targets.items():
        serving = None if target.budget is None else ServingSLO(SLO(SLO_MS), budgets={"cnn": target.budget})
        stage = SimStage(
            "cnn",
            (INPUT,),
            profile_service(profile, "cnn", "cpu"),
            max_batch=target.cap,
            aimd=aimd_config(serving, "cnn", target.cap),
        )
        for step in runs[label]["steps"]:
            rate = step["rate_rps"]
            warm = poisson(rate, max(int(rate * WARMUP_S), 20), seed=11)  # as the run: warm-up, then the step
            trace = poisson(rate, int(rate * seconds), seed=step["trace_seed"])
            both = np.concatenate([warm, warm[-1] + 1000.0 / rate + trace])
            result = simulate(SimPipeline((stage,), "cnn"), both, seed=step["trace_seed"])
            st = result.stages["cnn"]
            p99 = float(np.percentile(result.latencies_ms[len(warm) :], 99))
            step.update(sim_p99_ms=p99, sim_mean_batch=st.mean_batch, sim_mean_cap=st.mean_cap)


# -- the stage in the simulator: the rules side by side on the stage's curve --------------------

SIM_CURVE = (1.5, 0.7)  # ms per call + ms per row: the net on this machine, quiet (2026-11-25)
SIM_NOISE = ((0.0, 0.0), (0.01, 4.0))  # (share of batches stalled, mean extra ms of a stall)


def sim_runs(seeds: int = 7, seconds: float = 4.0, rates=None) -> dict:
    """Throughput at the SLO in the simulator (median p99 over ``seeds`` Poisson traces),
    for the fixed sweep, the runtime's AIMD and variants of its rules, on the stage's
    curve with +-10% noise per batch and, in the second setting, 1% of batches stalled by
    an exponential extra 4 ms. No machine noise: what the rules alone are worth."""
    from optimizer import INPUT
    from optimizer.slo import SimPipeline, SimStage, poisson, simulate
    from optimizer.slo.aimd import AIMDConfig

    a, c = SIM_CURVE
    rates = rates or tuple(range(700, 1425, 25))
    batch_budget = SLO_MS / 2  # aimd_config: a batch gets half the stage's budget
    configs = {f"fixed-{b}": {"max_batch": b} for b in STAGE_SWEEP}
    configs["aimd"] = {"aimd": AIMDConfig(batch_budget, max_batch=AIMD_CAP)}
    configs["aimd-window-to-headroom"] = {"aimd": AIMDConfig(batch_budget, max_batch=AIMD_CAP, max_delay_ms=SLO_MS)}
    configs["aimd-no-window"] = {"aimd": AIMDConfig(batch_budget, max_batch=AIMD_CAP, max_delay_ms=0)}
    configs["aimd-whole-budget"] = {"aimd": AIMDConfig(SLO_MS, max_batch=AIMD_CAP)}
    out = {}
    for stalled, stall_ms in SIM_NOISE:

        def service(b, rng, stalled=stalled, stall_ms=stall_ms):
            ms = (a + c * b) * (0.9 + 0.2 * rng.random())
            return ms + (rng.expovariate(1 / stall_ms) if stalled and rng.random() < stalled else 0.0)

        setting = f"stalls {stalled:.0%} x {stall_ms:g} ms"
        out[setting] = {}
        for label, kw in configs.items():
            best, steps = 0.0, []
            for rate in rates:
                p99s, batches = [], []
                for seed in range(seeds):
                    stage = SimStage(
                        "cnn", (INPUT,), service, max_batch=kw.get("max_batch", AIMD_CAP), aimd=kw.get("aimd")
                    )
                    r = simulate(SimPipeline((stage,), "cnn"), poisson(rate, int(rate * seconds), seed=seed), seed=seed)
                    p99s.append(r.p99_ms)
                    batches.append(r.stages["cnn"].mean_batch)
                p99 = float(np.median(p99s))
                steps.append({"rate_rps": rate, "p99_ms": p99, "mean_batch": float(np.median(batches))})
                if p99 > SLO_MS:
                    break
                best = rate
            out[setting][label] = {"throughput_at_slo_rps": best, "steps": steps}
    return out


# -- FlowServe configurations -------------------------------------------------------------------


def flowserve_runs(seconds: float, only=None, rates=RATES, reps: int = 1) -> dict:
    """Each FlowServe configuration (the fixed sweep and AIMD) on one executor, up the ladder over HTTP."""
    from benchmarks.common import progress
    from benchmarks.slo import register
    from executors.hosts.cluster import LocalCluster
    from executors.hosts.cluster_config import ClusterConfig

    configs = [(f"fixed-{b}", b, None) for b in SWEEP] + [
        ("aimd", AIMD_CAP, SLO_MS),  # the runtime's rule: a batch gets half the stage's budget (10 ms)
        ("aimd-batch-20ms", AIMD_CAP, 2 * SLO_MS),  # the rule before: a batch got the whole SLO
    ]
    urls = {}
    with LocalCluster(ClusterConfig(executors=1, threads=4, request_timeout_s=10)) as cluster:
        for i, (label, cap, budget) in enumerate(configs):
            if only and label not in only:
                continue
            name = f"aimd-cnn-{i}"
            plan, _ = stage_plan(name, cap, budget)
            register(cluster, plan)  # all on the one executor: an idle flow costs nothing
            urls[label] = f"{cluster.url}/flows/{name}"
        progress(f"deployed {list(urls)}")
        return ladders(urls, seconds, rates, reps)


# -- Ray Serve -----------------------------------------------------------------------------------


def ray_runs(python: str, seconds: float, settings, rates=RATES, reps: int = 1) -> dict:
    from benchmarks.common import ROOT, free_port, progress, wait_http

    runs = {}
    for max_batch, wait_s in settings:
        label = f"ray-{max_batch}-{wait_s * 1000:g}ms"
        port = free_port()
        proc = subprocess.Popen(
            [python, str(ROOT / "benchmarks" / "slo_aimd.py"), "--serve-ray", str(port), str(max_batch), str(wait_s)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        try:
            url = f"http://127.0.0.1:{port}/cnn"
            wait_http(url, body(), timeout=180, proc=proc)
            progress(f"{label}: serving")
            runs.update(ladders({label: url}, seconds, rates, reps))
        finally:
            proc.terminate()
            proc.wait()
            subprocess.run([python, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True)
    return runs


def serve_ray(port: int, max_batch: int, wait_s: float) -> None:
    """Run in the Ray virtualenv: the net behind ``@serve.batch`` at ``/cnn``."""
    import time

    import ray
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    @serve.deployment(ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=1000)
    class Model:
        def __init__(self):
            self.model = net()

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=wait_s)
        async def run(self, imgs: list) -> list:
            return predict(self.model, np.stack(imgs)).tolist()

        async def __call__(self, request: Request) -> Response:
            img = np.asarray(json.loads(await request.body())["img"], dtype=np.uint8)
            return Response(json.dumps({"cls": await self.run(img)}), media_type="application/json")

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Model.bind(), name="cnn", route_prefix="/cnn")
    print("READY", flush=True)
    while True:
        time.sleep(3600)


def summarise(out: dict) -> None:
    """AIMD against the best fixed size of the sweep: ``out["best_fixed"]``, ``out["aimd_vs_best"]``."""
    from benchmarks.common import progress

    runs = out["runs"]
    fixed = {k: v["throughput_at_slo_rps"] for k, v in runs.items() if k.startswith("fixed-")}
    for k, v in runs.items():
        progress(f"{k}: {v['throughput_at_slo_rps']:.0f} req/s with median p99 <= {SLO_MS:g} ms")
    if fixed and "aimd" in runs:
        best = max(fixed, key=lambda k: (fixed[k], -int(k.split("-")[1])))
        out["best_fixed"] = best
        out["aimd_vs_best"] = runs["aimd"]["throughput_at_slo_rps"] / max(fixed[best], 1e-9)
        progress(f"aimd / best fixed ({best}): {out['aimd_vs_best']:.2f}")
    # per rate: the median over rounds of each measured (and simulated) figure
    table = {}
    for k, v in runs.items():
        by_rate: dict[float, list] = {}
        for st in v["steps"]:
            by_rate.setdefault(st["rate_rps"], []).append(st)
        table[k] = {
            rate: {
                f: float(np.median([st[f] for st in sts]))
                for f in ("p50_ms", "p99_ms", "mean_batch", "mean_cap", "sim_p99_ms", "sim_mean_batch", "sim_mean_cap")
                if all(st.get(f) is not None for st in sts)
            }
            for rate, sts in by_rate.items()
        }
        for rate, m in table[k].items():
            sim = f", simulated p99 {m['sim_p99_ms']:.1f} batch {m['sim_mean_batch']:.1f}" if "sim_p99_ms" in m else ""
            cap = f" cap {m['mean_cap']:.1f}" if "mean_cap" in m else ""
            progress(
                f"  {k} @ {rate:g}: p50 {m['p50_ms']:.1f} p99 {m['p99_ms']:.1f} batch {m.get('mean_batch', 0):.1f}{cap}{sim}"
            )
    out["medians"] = table


def run(argv=None) -> dict:
    from benchmarks.common import machine, progress, save

    p = argparse.ArgumentParser(prog="python -m benchmarks slo_aimd", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0, help="each rate of the ladder (after a 1 s warm-up)")
    p.add_argument("--ray-python", default=os.environ.get("RAY_PYTHON", "/tmp/peer-ray/bin/python"))
    p.add_argument("--only", nargs="*", help="FlowServe configurations to run (default all)")
    p.add_argument("--no-ray", action="store_true")
    p.add_argument(
        "--mode", choices=["http", "stage", "sim"], default="http", help="over HTTP, the stage alone, or simulated"
    )
    p.add_argument("--rates", type=float, nargs="*", help="the ladder of offered rates (req/s; default per mode)")
    p.add_argument("--reps", type=int, help="rounds per rate, median p99 over them (default: 3 stage, 1 http)")
    args = p.parse_args(argv)
    progress(f"machine: {json.dumps(machine())} (shared with other engineers' work)")
    if args.mode == "sim":
        out = {"slo_ms": SLO_MS, "curve_ms": SIM_CURVE, "settings": sim_runs()}
        for setting, runs in out["settings"].items():
            for k, v in runs.items():
                progress(f"{setting}: {k}: {v['throughput_at_slo_rps']:.0f} req/s at median p99 <= {SLO_MS:g} ms")
        save("slo_aimd_sim", out)
        return out
    if args.mode == "stage":
        rates = args.rates or STAGE_RATES
        reps = args.reps or 3
        out = {
            "slo_ms": SLO_MS,
            "rates": list(rates),
            "seconds": args.seconds,
            "reps": reps,
            "runs": stage_runs(args.seconds, rates, reps, args.only),
        }
        summarise(out)
        save("slo_aimd_stage", out)
        return out
    rates = args.rates or RATES
    out = {
        "slo_ms": SLO_MS,
        "rates": list(rates),
        "seconds": args.seconds,
        "runs": flowserve_runs(args.seconds, args.only, rates, args.reps or 1),
    }
    fixed = {k: v["throughput_at_slo_rps"] for k, v in out["runs"].items() if k.startswith("fixed-")}
    best = max(fixed, key=lambda k: fixed[k]) if fixed else None
    out["best_fixed"] = best
    if not args.no_ray and Path(args.ray_python).exists():
        best_b = int(best.split("-")[1]) if best else 10
        out["runs"].update(
            ray_runs(args.ray_python, args.seconds, [(10, 0.01), (best_b, 0.001)], rates, args.reps or 1)
        )
    else:
        out["ray"] = f"no Python with ray[serve] at {args.ray_python}"
    for k, v in out["runs"].items():
        progress(f"{k}: {v['throughput_at_slo_rps']:.0f} req/s at p99 <= {SLO_MS:g} ms")
    save("slo_aimd", out)
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-ray":
        serve_ray(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    else:
        run(sys.argv[1:])
