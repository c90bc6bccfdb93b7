"""What one config idiom costs: pydantic v2 against flow.configuration.

Measures, each in fresh processes (median of N):
- import: ``python -X importtime`` cumulative time of ``pydantic`` (and of ``BaseModel``
  plus one 26-field model class, what a ClusterConfig would need), and of flow.configuration;
- construction: building a ClusterConfig-shaped object (26 fields, all checked) with each;
- attribute read: one field read, the only thing a request path does with a config.

    PYTHONPATH=. python benchmarks/config_cost.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import timeit

PYDANTIC_MODEL = """
from pydantic import BaseModel, ConfigDict, Field
class ClusterModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    host: str = Field("127.0.0.1", min_length=1)
    port: int = Field(0, ge=0, le=65535)
    executors: int = Field(2, ge=1)
    gpu_executors: int = Field(0, ge=0)
    threads: int = Field(4, ge=1, le=256)
    token: str | None = Field(None, min_length=8)
    public_metrics: bool = False
    max_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    max_rows: int = Field(1_000_000, ge=1)
    max_header_bytes: int = Field(64 * 1024, ge=1024)
    max_headers: int = Field(100, ge=8)
    header_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    body_timeout_s: float = Field(60.0, gt=0, allow_inf_nan=False)
    max_connections: int = Field(1024, ge=1)
    request_timeout_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    load_timeout_s: float = Field(300.0, gt=0, allow_inf_nan=False)
    max_retries: int = Field(2, ge=0, le=10)
    restart_executors: bool = True
    autoscaling: dict | None = None
    max_executors: int = Field(8, ge=1)
    colocate: bool = True
    busy_poll_ms: float = Field(10.0, ge=0, le=1000, allow_inf_nan=False)
    executor_cache_bytes: int = Field(256 << 20, ge=0)
    stuck_grace_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False)
    persistence: bool = True
    dir: str | None = None
"""

HELPER_MODEL = """
from dataclasses import dataclass
from flow.configuration import Bool, Check, Config, Int, Number, Str, setting
S = Number(gt=0)
@dataclass(frozen=True)
class ClusterModel(Config):
    host: str = setting("127.0.0.1", Str())
    port: int = setting(0, Int(0, 65535))
    executors: int = setting(2, Int(1))
    gpu_executors: int = setting(0, Int(0))
    threads: int = setting(4, Int(1, 256))
    token: str | None = setting(None, Str("8+ chars", lambda v: len(v) >= 8, optional=True))
    public_metrics: bool = setting(False, Bool())
    max_body_bytes: int = setting(64 * 1024 * 1024, Int(1024))
    max_rows: int = setting(1_000_000, Int(1))
    max_header_bytes: int = setting(64 * 1024, Int(1024))
    max_headers: int = setting(100, Int(8))
    header_timeout_s: float = setting(10.0, S)
    body_timeout_s: float = setting(60.0, S)
    max_connections: int = setting(1024, Int(1))
    request_timeout_s: float = setting(30.0, S)
    load_timeout_s: float = setting(300.0, S)
    max_retries: int = setting(2, Int(0, 10))
    restart_executors: bool = setting(True, Bool())
    autoscaling: dict | None = None
    max_executors: int = setting(8, Int(1))
    colocate: bool = setting(True, Bool())
    busy_poll_ms: float = setting(10.0, Number(ge=0, le=1000))
    executor_cache_bytes: int = setting(256 << 20, Int(0))
    stuck_grace_s: float = setting(10.0, Number(gt=0, le=3600))
    persistence: bool = setting(True, Bool())
    dir: str | None = setting(None, Check("a path", types=(str,), optional=True))
"""


def import_us(code: str, module: str, runs: int) -> float:
    """Median microseconds ``module``'s cumulative import takes (python -X importtime)."""
    times = []
    for _ in range(runs):
        err = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
        ).stderr
        line = next(
            x for x in err.splitlines() if x.rstrip().endswith(f"| {module}") or x.split("|")[-1].strip() == module
        )
        times.append(int(line.split("|")[1]))
    return statistics.median(times)


def inside_us(prelude: str, code: str, runs: int) -> float:
    """Median microseconds ``code`` (imports and class definitions) takes in a fresh
    interpreter, timed inside it after ``prelude`` (what every process has imported already)."""
    probe = f"{prelude}\nimport time\n_t = time.perf_counter()\n{code}\nprint((time.perf_counter() - _t) * 1e6)"
    return statistics.median(
        float(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
        for _ in range(runs)
    )


def per_call_us(setup: str, stmt: str) -> float:
    t = timeit.Timer(stmt, setup=setup)
    n, _ = t.autorange()
    return min(t.repeat(5, n)) / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=7)
    runs = p.parse_args().runs
    print(f"import (median of {runs}, -X importtime cumulative):")
    print(f"  pydantic                       {import_us('import pydantic', 'pydantic', runs) / 1000:6.1f} ms")
    print(
        f"  flow.configuration (alone)     "
        f"{import_us('import flow.errors; import flow.configuration', 'flow.configuration', runs) / 1000:6.1f} ms"
        "  (flow.errors already imported, as every process has)"
    )
    print(
        f"  pydantic + a 26-field model (import and class), in process:           "
        f"{inside_us('import flow.errors', PYDANTIC_MODEL, runs) / 1000:6.1f} ms"
    )
    print(
        f"  flow.configuration + a 26-field model (import and class), in process: "
        f"{inside_us('import flow.errors', HELPER_MODEL, runs) / 1000:6.1f} ms"
    )
    print("per call (best of 5):")
    kwargs = "dict(executors=3, port=8000, request_timeout_s=5.0, token='abcdefgh1234')"
    for name, model in (("pydantic", PYDANTIC_MODEL), ("helper", HELPER_MODEL)):
        build = per_call_us(model, f"ClusterModel(**{kwargs})")
        read = per_call_us(model + f"\nc = ClusterModel(**{kwargs})", "c.request_timeout_s")
        print(f"  {name:8s} build {build:7.2f} us   read one field {read * 1000:6.1f} ns")


if __name__ == "__main__":
    main()
