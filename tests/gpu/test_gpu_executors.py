"""GPU executors on a real GPU (marked ``gpu``: they skip, saying why, where torch sees no
CUDA device). A local cluster of 2 CPU executors and 1 gpu executor, a real KVS server,
real HTTP:

- a gpu=True stage builds its torch model on CUDA (``fs.current_device()``);
- NVML's utilisation and memory reach ``/metrics``, ``/healthz`` and ``flowserve status``;
- a flow mixing CPU and GPU stages answers exactly ``flow.run``'s rows;
- CUDA is initialised in the gpu executor only: not in the cluster's own processes (its
  supervisor, the gateway), the CPU executors, nor the user's process;
- two GPU stages on the gpu executor hand their tensors over in GPU memory, never through
  the host (as two stages, and fused into one).

Models use small integer weights and inputs, so float32 sums are exact on any device and
in any order: the GPU's answers equal the CPU's bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flow import ColumnType, Flow, current_device
from flow.table import TorchColumn

pytestmark = pytest.mark.gpu

ROWS = 12


def int_weights(shape, seed: int):
    """Weights in {-1, 0, 1} (exact in float32 and TF32)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(-1, 2, shape, generator=g).float()


# -- operators (module level: plans carry them) ------------------------------------------------


class WhereAmI:
    """A gpu stage: a torch MLP on ``current_device()``; says where it and CUDA are."""

    def __init__(self):
        import torch

        self.model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        self.model.to(current_device()).eval()

    def __call__(self, table):
        import torch

        with torch.inference_mode():
            y = self.model(table.tensor("x").to(current_device()))
        n = len(table)
        return (
            y.sum(dim=1),
            [str(next(self.model.parameters()).device)] * n,
            [current_device()] * n,
            np.full(n, torch.cuda.is_initialized()),
            np.full(n, os.getpid(), dtype=np.int64),
        )


def features(table):
    """CPU stage: small ints -> float32 features."""
    return np.asarray(table["x"], dtype=np.float32)


class IntMLP:
    """GPU stage: an MLP of integer weights; its logits stay a tensor on the device."""

    def __init__(self):
        import torch

        dev = current_device()
        self.w1, self.w2 = int_weights((64, 256), 1).to(dev), int_weights((256, 10), 2).to(dev)
        self.relu = torch.relu

    def __call__(self, table):
        x = table.tensor("f").to(self.w1.device)
        return self.relu(x @ self.w1) @ self.w2


def label(row):
    """CPU stage, row-wise: the class and its logit."""
    return int(np.argmax(row.logits)), float(np.max(row.logits))


class Embed:
    """GPU stage: an embedding of the input (on the device), and where each row lies."""

    def __init__(self):
        self.w = int_weights((16, 32), 3).to(current_device())

    def __call__(self, table):
        emb = table.tensor("x").to(self.w.device) @ self.w
        return emb, np.array([emb[i].data_ptr() for i in range(len(emb))], dtype=np.int64)


class Head:
    """GPU stage after Embed: reads Embed's tensor and reports how it came."""

    def __call__(self, table):
        col = table.column("emb")
        t = table.tensor("emb")
        held = isinstance(col, TorchColumn)
        untouched = held and not col.on_host  # nothing made a host copy on the way
        same = [t[i].data_ptr() == p for i, p in enumerate(table["ptr"].tolist())]
        n = len(table)
        return t.sum(dim=1), [str(t.device)] * n, np.full(n, held), np.full(n, untouched), np.array(same)


# -- helpers -------------------------------------------------------------------------------------


def int_rows(n: int, width: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.integers(0, 4, width).astype(np.float32)} for _ in range(n)]


def placed(cluster, flow: str) -> dict[str, list[str]]:
    status = cluster.status()
    f = next(f for f in status["flows"] if f["name"] == flow)
    return {s["name"]: s["executors"] for s in f["stages"]}


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from each process's parent in /proc/N/stat)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        parents[int(stat.parent.name)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, parent in parents.items() if parent == p]
        out += kids
        todo += kids
    return out


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def cuda_mapped(pid: int) -> bool:
    """Whether the CUDA driver library is loaded in the process (cuInit loads it)."""
    return "libcuda.so" in Path(f"/proc/{pid}/maps").read_text()


def until(check, timeout: float, what: str):
    """``check()``'s first truthy value, polled (it reads state the cluster updates on its own
    clock, a liveness ping per second); fails naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:.0f} s")
        time.sleep(0.2)


def metric(text: str, name: str, **labels) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


# -- tests -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def where(gpu_cluster):
    f = Flow("gpu-where", schema={"x": ColumnType.tensor(np.float32, (16,))})
    f.map(WhereAmI, names=["y", "param_device", "device", "cuda_initialized", "pid"], batching=True, gpu=True)
    d = gpu_cluster.deploy(f)
    return d, d.invoke(int_rows(ROWS, 16))


def test_gpu_stage_builds_its_model_on_cuda(gpu_cluster, where):
    d, out = where
    assert set(out["param_device"].tolist()) == {"cuda:0"}
    assert set(out["device"].tolist()) == {"cuda"}
    assert out["cuda_initialized"].all()
    (stage,) = placed(gpu_cluster, "gpu-where").values()
    assert stage and all(e.startswith("gpu") for e in stage), stage


def test_nvml_figures_in_metrics_healthz_and_status(gpu_cluster, where):
    _, out = where
    (executor,) = placed(gpu_cluster, "gpu-where").values()
    (gpu_id,) = executor

    def healthz_gpus():
        return gpu_cluster.http.get("/healthz").json().get("gpus", {}).get(gpu_id)

    gpus = until(healthz_gpus, 10, f"/healthz lists no NVML figures for executor {gpu_id} (key 'gpus')")
    g = gpus[0]
    assert g["memory_total"] > 0 and 0 < g["memory_used"] <= g["memory_total"], g
    assert 0 <= g["utilisation"] <= 100, g
    assert g.get("process_memory_used", 1) > 0, g  # the executor holds the model (where NVML can see it)
    text = gpu_cluster.http.get("/metrics").text
    used = metric(text, "flowserve_gpu_memory_used_bytes", executor=gpu_id, gpu=str(g["index"]))
    util = metric(text, "flowserve_gpu_utilisation_percent", executor=gpu_id, gpu=str(g["index"]))
    assert used is not None and used > 0, [ln for ln in text.splitlines() if "gpu" in ln][:20]
    assert util is not None and 0 <= util <= 100
    r = subprocess.run(
        [sys.executable, "-m", "flowserve", "--dir", str(gpu_cluster.dir), "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    status = json.loads(r.stdout)
    assert status["health"]["gpus"][gpu_id][0]["memory_used"] > 0
    text = subprocess.run(
        [sys.executable, "-m", "flowserve", "--dir", str(gpu_cluster.dir), "status"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert f"executor {gpu_id}: GPU {g['index']} " in text and "% busy" in text, text


def test_mixed_cpu_gpu_flow_answers_flow_runs_rows(gpu_cluster):
    f = Flow("gpu-mixed", schema={"x": ColumnType.tensor(np.float32, (64,))})
    f.map(features, names=["f"], batching=True).map(IntMLP, names=["logits"], batching=True, gpu=True).map(
        label, names=["cls", "logit"]
    )
    d = gpu_cluster.deploy(f)
    stages = placed(gpu_cluster, "gpu-mixed")
    gpu_stages = [s for s in d.plan.stages.values() if s.device == "gpu"]
    assert len(gpu_stages) == 1 and all(e.startswith("gpu") for e in stages[gpu_stages[0].name])
    assert all(e.startswith("cpu") for name, ids in stages.items() if name != gpu_stages[0].name for e in ids)
    rows = int_rows(40, 64, seed=5)
    expected = f.run(rows).to_pylist(qid=False)
    assert d.invoke(rows).to_pylist(qid=False) == expected
    answers = [d.invoke(rows[i : i + 1]).to_pylist(qid=False)[0] for i in range(5)]  # one row at a time too
    assert answers == expected[:5]


def test_cuda_is_initialised_in_gpu_executors_only(gpu_cluster, where):
    _, out = where
    gpu_pid = int(out["pid"][0])
    assert cuda_mapped(gpu_pid), "positive control: the gpu executor that ran the model has CUDA loaded"
    daemon = gpu_cluster.proc.pid
    python = [p for p in [daemon, *descendants(daemon)] if "python" in Path((cmdline(p) or ["-"])[0]).name]
    executors = {p: cmdline(p) for p in python if "executors.worker.executor" in cmdline(p)}
    gpu_executors = [p for p, cmd in executors.items() if cmd[cmd.index("--device") + 1] == "gpu"]
    assert gpu_pid in gpu_executors, (gpu_pid, executors)
    runtime = [p for p in python if p not in executors]  # the supervisor, the gateway
    assert daemon in runtime
    with_cuda = {p: " ".join(cmdline(p)) for p in python if p not in gpu_executors and cuda_mapped(p)}
    assert not with_cuda, f"CUDA initialised outside the gpu executors: {with_cuda}"
    # a user's own process (this one ran other tests that use CUDA in process): it calls the
    # GPU flow over HTTP and runs it with flow.run, and initialises no CUDA doing so
    user = subprocess.run(
        [sys.executable, "-c", USER_PROCESS, str(gpu_cluster.dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert user.returncode == 0, user.stderr[-3000:]
    seen = json.loads(user.stdout.splitlines()[-1])
    assert seen["answered"] == seen["ran"] == ROWS and not seen["initialised"], seen
    # the driver library is mapped only if importing torch itself maps it (a CUDA build may)
    assert seen["mapped"] == seen["mapped_by_import"], seen


USER_PROCESS = """
import json, sys
import torch
mapped_by_import = "libcuda.so" in open("/proc/self/maps").read()
import numpy as np
from executors.hosts.cluster import Deployment, LocalCluster
from flow import ColumnType, Flow
from tests.gpu.test_gpu_executors import ROWS, WhereAmI, int_rows
c = LocalCluster.connect(sys.argv[1])
f = Flow("gpu-where", schema={"x": ColumnType.tensor(np.float32, (16,))})
f.map(WhereAmI, names=["y", "param_device", "device", "cuda_initialized", "pid"], batching=True, gpu=True)
rows = int_rows(ROWS, 16)
answered = len(Deployment(c, "gpu-where", None).invoke(rows))
ran = len(f.run(rows))
mapped = "libcuda.so" in open("/proc/self/maps").read()
print(json.dumps({"answered": answered, "ran": ran, "initialised": torch.cuda.is_initialized(),
                  "mapped": mapped, "mapped_by_import": mapped_by_import}))
"""


@pytest.mark.parametrize("fused", [False, True], ids=["two-stages", "fused"])
def test_gpu_stages_hand_tensors_over_in_gpu_memory(gpu_cluster, fused):
    name = f"gpu-handover-{'fused' if fused else 'stages'}"
    f = Flow(name, schema={"x": ColumnType.tensor(np.float32, (16,))})
    f.map(Embed, names=["emb", "ptr"], batching=True, gpu=True).map(
        Head, names=["score", "device", "held", "untouched", "same_memory"], batching=True, gpu=True
    )
    rules = None if fused else ("placement", "batching")  # without fusion: one stage per operator
    d = gpu_cluster.deploy(f, rules=rules)
    assert len(d.plan.stages) == (1 if fused else 2), d.explain()
    executors = {e for ids in placed(gpu_cluster, name).values() for e in ids}
    assert len(executors) == 1 and executors.pop().startswith("gpu")
    rows = int_rows(ROWS, 16, seed=7)
    out = d.invoke(rows)
    assert set(out["device"].tolist()) == {"cuda:0"}
    assert out["held"].all(), "Head got a numpy column: Embed's tensor was copied to the host"
    assert out["untouched"].all(), "a host copy of Embed's tensor was made on the way"
    assert out["same_memory"].all(), "Head got other memory than Embed wrote"
    ref = f.run(rows)  # in the user's process: numpy columns, CPU tensors
    assert out["score"].tolist() == ref["score"].tolist()
    assert not ref["held"].any()


def test_gpu_executor_log_has_no_cpu_fallback_warning(gpu_cluster, where):
    logs = Path(gpu_cluster.dir) / "logs"
    texts = {p.name: p.read_text(errors="replace") for p in logs.glob("gpu*.log")}
    assert texts, f"no gpu executor log in {logs}"
    for name, text in texts.items():
        assert not re.search(r"without a usable GPU", text), f"{name}: {text[-2000:]}"
