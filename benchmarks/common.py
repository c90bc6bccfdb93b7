"""Shared benchmark plumbing: wrk load, server processes, results files and plots.

Load comes from wrk (C, closed loop: each of C connections sends its next request when
the last is answered), so the load generator costs the 2-core machine little and the same
for every system measured.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ROOT = HERE.parent


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "gpu": False,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(
    url: str,
    body: bytes,
    timeout: float = 120.0,
    proc: subprocess.Popen | None = None,
    content_type: str = "application/json",
) -> None:
    """Until ``url`` answers a POST of ``body`` with 200 (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.post(url, content=body, headers={"Content-Type": content_type}, timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up within {timeout:.0f} s")
        time.sleep(0.2)


_LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "{content_type}"
wrk.body = io.open("{body}", "rb"):read("*a")
"""


def wrk(
    url: str, body: bytes, concurrency: int, seconds: float, threads: int = 1, content_type: str = "application/json"
) -> dict:
    """Closed-loop load with wrk: requests/s and latency percentiles in ms."""
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed: apt-get install wrk")
    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "body"
        body_file.write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(_LUA.format(body=body_file, content_type=content_type))
        out = subprocess.run(
            [
                "wrk",
                f"-t{min(threads, concurrency)}",
                f"-c{concurrency}",
                f"-d{max(1, round(seconds))}s",
                "--latency",
                "-s",
                str(script),
                url,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return parse_wrk(out)


def parse_wrk(out: str) -> dict:
    def ms(v: str) -> float:
        num, unit = re.match(r"([\d.]+)(us|ms|s)", v).groups()
        return float(num) * {"us": 1e-3, "ms": 1.0, "s": 1000.0}[unit]

    pct = dict(re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", out, re.M))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    return {
        "rps": rps,
        "p50_ms": ms(pct["50"]),
        "p90_ms": ms(pct["90"]),
        "p99_ms": ms(pct["99"]),
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": errors.group(0) if errors else None,
    }


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2))
    progress(f"wrote {path.relative_to(ROOT)}")
    return path


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def save_plot(fig, name: str) -> Path:
    """Write ``fig`` as benchmarks/results/NAME.png beside the figures it plots."""
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.png"
    fig.savefig(path, dpi=110)
    progress(f"wrote {path.relative_to(ROOT)}")
    return path
