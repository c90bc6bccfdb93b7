"""Profiler core: time a stage runner on batches of sample inputs, per batch size.

    measured = measure_batches(run, samples, max_batch=32)     # {1: (ms, ...), 2: ..., 32: ...}
    profile = profile.with_stage("SmallNet", "gpu", measured)

It knows nothing of executors: ``run(batch)`` is any callable (the runtime passes one that
calls a real replica), ``make_batch`` builds a batch from a list of samples (default: the
list itself; the runtime concatenates Tables), and ``clock`` returns seconds (default
``time.perf_counter``; tests inject a fake one so that the figures are exact).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from flow.errors import FlowTypeError, FlowValueError
from optimizer.slo._check import positive_int


def default_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, 32, ... up to ``max_batch`` (always included): powers
    of two and the points halfway between, so the fit sees the curve's knee."""
    max_batch = positive_int("max_batch", max_batch)
    sizes = {max_batch}
    p = 1
    while p <= max_batch:
        sizes.add(p)
        if p >= 2 and p * 3 // 2 <= max_batch:
            sizes.add(p * 3 // 2)
        p *= 2
    return tuple(sorted(sizes))


def measure_batches(
    run: Callable,
    samples: Sequence,
    *,
    batch_sizes: Sequence[int] | None = None,
    max_batch: int = 32,
    warmup: int = 2,
    repeats: int = 10,
    make_batch: Callable[[list], object] = list,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[int, tuple[float, ...]]:
    """Milliseconds per ``run(batch)`` call, ``repeats`` calls per batch size after
    ``warmup`` untimed ones (caches, lazy loading, JIT). Batches cycle through ``samples``
    so that every sample is used and a batch larger than the samples repeats them.

        measure_batches(model, rows, batch_sizes=[1, 8, 32], repeats=20)
    """
    if not callable(run):
        raise FlowTypeError(f"run must be a callable taking one batch, got {run!r:.80}")
    if isinstance(samples, (str, bytes)) or not isinstance(samples, Sequence) or not samples:
        raise FlowValueError(f"samples must be a non-empty sequence of stage inputs, got {samples!r:.80}")
    sizes = default_batch_sizes(max_batch) if batch_sizes is None else tuple(batch_sizes)
    if not sizes:
        raise FlowValueError("batch_sizes is empty; give at least one batch size")
    sizes = tuple(sorted({positive_int("batch size", b) for b in sizes}))
    warmup = positive_int("warmup", warmup, minimum=0)
    repeats = positive_int("repeats", repeats)
    cursor = 0
    out: dict[int, tuple[float, ...]] = {}
    for b in sizes:
        times = []
        for i in range(warmup + repeats):
            batch = make_batch([samples[(cursor + k) % len(samples)] for k in range(b)])
            cursor = (cursor + b) % len(samples)
            start = clock()
            run(batch)
            elapsed_ms = (clock() - start) * 1000.0
            if i >= warmup:
                times.append(elapsed_ms)
        out[b] = tuple(times)
    return out
