"""How fast the SLO simulator and planner are ("estimating p50/p99 in
milliseconds of CPU for thousands of requests").

    PYTHONPATH=. python -m benchmarks.slo_sim

A 4-stage pipeline (pre -> two models in parallel -> join) with profiled service-time
samples, Poisson arrivals; CPU seconds per simulate() call, and one plan_for_slo() with two
executor classes. Pure Python, one core; prints a table.
"""

from __future__ import annotations

import time

from optimizer.plan import INPUT
from optimizer.slo import (
    SLO,
    PlannerOptions,
    Profile,
    Shape,
    StageConfig,
    StageShape,
    plan_for_slo,
    poisson,
    simulate,
)

SHAPE = Shape(
    (
        StageShape("pre", (INPUT,), True),
        StageShape("a", ("pre",), True),
        StageShape("b", ("pre",), True),
        StageShape("pick", ("a", "b"), True),
    ),
    "pick",
)


def profile() -> Profile:
    def curve(a, c, spread):
        return {b: [(a + c * b) * (1 + spread * k / 10) for k in range(10)] for b in (1, 2, 4, 8, 16, 32)}

    return Profile(
        {
            "pre": {"cpu": curve(0.3, 0.05, 0.2)},
            "a": {"cpu": curve(4.0, 1.0, 0.5), "gpu": curve(3.0, 0.1, 0.3)},
            "b": {"cpu": curve(6.0, 1.5, 0.5), "gpu": curve(4.0, 0.15, 0.3)},
            "pick": {"cpu": curve(0.2, 0.02, 0.2)},
        }
    )


def cpu_s(fn) -> tuple[float, object]:
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def main() -> None:
    prof = profile()
    configs = {"pre": StageConfig(4, 1), "a": StageConfig(8, 3), "b": StageConfig(8, 4), "pick": StageConfig(4, 1)}
    pipe = SHAPE.pipeline(prof, configs, hop_ms=0.3)
    print("requests  cpu_ms  us/request  p50_ms  p99_ms")
    for n in (1_000, 10_000, 100_000):
        trace = poisson(400, n, seed=1)
        s, r = cpu_s(lambda trace=trace: simulate(pipe, trace, seed=1))
        print(f"{n:8d}  {s * 1000:6.1f}  {s / n * 1e6:10.1f}  {r.p50_ms:6.2f}  {r.p99_ms:6.2f}")
    for n in (1_000, 3_000):
        trace = poisson(400, n, seed=2)
        opts = PlannerOptions(prices={"cpu": 1.0, "gpu": 4.0}, hop_ms=0.3)
        s, plan = cpu_s(lambda trace=trace, opts=opts: plan_for_slo(SHAPE, prof, SLO(p99_ms=40), trace, opts))
        print(f"\nplan_for_slo on {n} requests: {s:.2f} CPU s\n{plan.explain()}")


if __name__ == "__main__":
    main()
