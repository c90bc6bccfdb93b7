"""A discrete-event simulation of a pipeline over an arrival trace: p50/p99/throughput.

    result = simulate(pipe, poisson(rate_rps=300, n=5000, seed=1), seed=7)
    result.p99_ms, result.throughput_rps, result.stages["model"].mean_batch

Events are request arrivals at a stage (after a hop), batch completions and the expiry
of a batch's wait window; each replica runs one batch at a time. Times are milliseconds.
The same seed and trace give the same result, so a planner can compare configurations.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from flow.errors import FlowValueError
from optimizer.plan import INPUT
from optimizer.slo._check import positive_number
from optimizer.slo.pipeline import SimPipeline
from optimizer.slo.traces import check_trace

_ARRIVE, _DONE, _TIMER, _ENTER, _FINISH = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class StageStats:
    """Per stage: batches run, mean requests per batch, mean queueing delay (ms, from being
    ready at the stage to its batch starting) and busy share of its replicas' time; with
    AIMD, the mean cap the batches were formed under."""

    batches: int
    mean_batch: float
    mean_wait_ms: float
    utilisation: float
    mean_cap: float | None = None


@dataclass(frozen=True)
class SimResult:
    """End-to-end latencies (ms, in trace order) and what they add up to."""

    latencies_ms: np.ndarray
    throughput_rps: float
    stages: dict

    def quantile(self, q: float) -> float:
        """The ``q``-th percentile of end-to-end latency, in ms."""
        q = positive_number("percentile", q, allow_zero=True)
        if q > 100:
            raise FlowValueError(f"a percentile is in [0, 100], got {q!r}")
        return float(np.percentile(self.latencies_ms, q))

    @property
    def p50_ms(self) -> float:
        return self.quantile(50)

    @property
    def p99_ms(self) -> float:
        return self.quantile(99)

    @property
    def mean_ms(self) -> float:
        return float(self.latencies_ms.mean())

    def attainment(self, bound_ms: float) -> float:
        """The share of requests answered within ``bound_ms``."""
        return float(np.mean(self.latencies_ms <= bound_ms))


class _Stage:
    """A stage's mutable state during one run."""

    def __init__(self, spec, index, routing, clock):
        self.spec = spec
        self.index = index
        self.service = spec.service
        self.max_batch = spec.max_batch
        self.max_wait = spec.max_wait_ms
        self.k = spec.competitive
        self.first = spec.wait == "first"
        self.n_inputs = len(spec.inputs)
        # competing copies must land on distinct replicas, so they never share a queue
        self.shared = routing == "shared" and self.k == 1
        self.round_robin = routing == "round_robin"
        self.gateway = routing == "gateway"
        n = spec.replicas
        self.queues: list[deque] = [deque() for _ in range(1 if self.shared else n)]
        self.timer = [None] * len(self.queues)
        self.n = n
        self.threads = spec.threads
        self.running = [0] * n  # calls running per replica, at most ``threads``
        self.idle = [r for r in range(n - 1, -1, -1) for _ in range(self.threads)]  # shared mode: free slots
        self.load = [0] * n  # queued + running requests per replica
        self.next = 0
        self.consumers: list[int] = []
        self.sink = False
        self.joins: dict[int, int] = {}
        self.seen: set[int] = set()  # wait="first": requests already let in
        self.answered: set[int] = set()  # competitive: requests a copy already answered
        self.busy_ms = 0.0
        self.batches = 0
        self.rows = 0
        self.wait_ms = 0.0
        # AIMD (the runtime under an SLO): a batcher per replica, on the simulation's clock
        self.aimd = None if spec.aimd is None else [spec.aimd.batcher(clock) for _ in range(n)]
        self.collect = [None] * n  # AIMD: when the delay window of a replica's forming batch ends
        self.caps: list[int] = []  # AIMD: the cap each batch was formed under


def simulate(pipe: SimPipeline, trace, seed: int = 0) -> SimResult:
    """Run ``pipe`` on the arrival ``trace`` (sorted timestamps, ms) to the last answer."""
    if not isinstance(pipe, SimPipeline):
        raise FlowValueError(f"simulate needs a SimPipeline, got {type(pipe).__name__}")
    arrivals = check_trace(trace)
    # a seed of its own: the same int given to a trace generator must not correlate them
    rng = random.Random(f"simulate:{seed}")
    hop, hops = pipe.hop_ms, pipe.hop_samples
    hop_rng = random.Random(f"hops:{seed}")  # apart, so measured hops do not shift service draws
    per_request = pipe.hop_per_request and bool(hops)
    # [] when unused, not None: hop_ms reads it only when per_request
    req_hop = [hops[int(hop_rng.random() * len(hops))] for _ in range(len(arrivals))] if per_request else []

    def hop_ms(req: int) -> float:
        if per_request:
            return req_hop[req]
        return hops[int(hop_rng.random() * len(hops))] if hops else hop

    sim_now = [0.0]  # ms: the AIMD batchers' clock (seconds) reads it
    for spec in pipe.stages:
        if spec.aimd is not None and pipe.routing == "shared":
            raise FlowValueError(
                f"stage {spec.name!r}: AIMD batches per replica; routing='shared' has one queue per stage"
            )
    stages = [_Stage(s, i, pipe.routing, lambda: sim_now[0] / 1000.0) for i, s in enumerate(pipe.stages)]
    index = {s.spec.name: s for s in stages}
    entry: list[int] = []
    for s in stages:
        for i in s.spec.inputs:
            (entry if i == INPUT else index[i].consumers).append(s.index)
    index[pipe.sink].sink = True

    gateway = pipe.routing == "gateway"
    if gateway:
        # each replica's executor; the gateway routes a request's every stage when it enters
        placement = pipe.placement or {s.spec.name: tuple(f"{s.spec.name}#{r}" for r in range(s.n)) for s in stages}
        ex_ids = sorted({e for ids in placement.values() for e in ids})
        ex_index = {e: i for i, e in enumerate(ex_ids)}
        replica_ex = [[ex_index[e] for e in placement[s.spec.name]] for s in stages]
        inflight = [0] * len(ex_ids)
        assigned = [[0] * len(exs) for exs in replica_ex]  # per stage, per replica: requests routed there
        routes: dict[int, list] = {}
        uses: dict[int, set] = {}
        turn = 0
        # (time ms, sequence, event kind, stage index, the request or a (replica, batch, ms) result)
        events: list[tuple[float, int, int, int, Any]] = [
            (t, req, _ENTER, -1, req) for req, t in enumerate(arrivals.tolist())
        ]
    else:
        events = [
            (t + hop_ms(req), req * len(entry) + j, _ARRIVE, si, req)
            for req, t in enumerate(arrivals.tolist())
            for j, si in enumerate(entry)
        ]
    heapq.heapify(events)
    seq = len(events)
    finish = np.full(len(arrivals), np.nan)
    push, pop = heapq.heappush, heapq.heappop

    def start(st, qi, now):
        nonlocal seq
        if st.aimd is not None:
            return start_aimd(st, qi, now)
        q = st.queues[qi]
        while q and (st.idle if st.shared else st.running[qi] < st.threads):
            n = len(q)
            if n < st.max_batch and st.max_wait > 0:
                deadline = q[0][1] + st.max_wait
                if now < deadline:
                    if st.timer[qi] != deadline:
                        st.timer[qi] = deadline
                        seq += 1
                        push(events, (deadline, seq, _TIMER, st.index, qi))
                    return
            run_batch(st, qi, min(st.max_batch, n), now)

    def run_batch(st, qi, b, now):
        nonlocal seq
        q = st.queues[qi]
        batch = []
        for _ in range(b):
            req, ready_at = q.popleft()
            batch.append(req)
            st.wait_ms += now - ready_at
        r = st.idle.pop() if st.shared else qi
        st.running[r] += 1
        ms = st.service(b, rng)
        st.busy_ms += ms
        st.batches += 1
        st.rows += b
        seq += 1
        push(events, (now + ms, seq, _DONE, st.index, (r, batch, ms)))

    def start_aimd(st, qi, now):
        """The executor's batcher loop under an SLO (executors/worker/batcher.py): a free replica
        takes up to the AIMD cap of what is queued; holding a single request, it waits up
        to the delay window (from now) for the batch to fill, else it runs at once."""
        nonlocal seq
        q, ab = st.queues[qi], st.aimd[qi]
        if not q or st.running[qi]:
            return
        cap, n = ab.batch_size, len(q)
        if n < cap:
            window_end = st.collect[qi]
            if window_end is None and n == 1:
                wait = ab.delay_ms()
                if wait > 0:
                    st.collect[qi] = now + wait
                    seq += 1
                    push(events, (now + wait, seq, _TIMER, st.index, qi))
                    return
            elif window_end is not None and now < window_end:
                return
        st.collect[qi] = None
        st.caps.append(cap)
        run_batch(st, qi, min(cap, n), now)

    def ready(st, req, now):
        if st.shared:
            st.queues[0].append((req, now))
            start(st, 0, now)
            return
        n = st.n
        if st.gateway:
            targets = routes[req][st.index]
        elif st.round_robin:
            targets = [(st.next + j) % n for j in range(st.k)]
            st.next = (st.next + st.k) % n
        else:  # least loaded; ties go round the replicas so that none is favoured
            order = sorted(range(n), key=lambda r: (st.load[r], (r - st.next) % n))
            targets = order[: st.k]
            st.next = (targets[-1] + 1) % n
        for r in targets:
            st.queues[r].append((req, now))
            st.load[r] += 1
            if st.aimd is not None:
                st.aimd[r].arrived()
            start(st, r, now)

    def emit(st, req, now):
        nonlocal seq
        if st.sink:
            finish[req] = now + hop_ms(req)
            if gateway:
                seq += 1
                push(events, (finish[req], seq, _FINISH, -1, req))
        for ci in st.consumers:
            seq += 1
            push(events, (now + hop_ms(req), seq, _ARRIVE, ci, req))

    def enter(req, now):
        """The dispatcher's routing: per stage, the replicas with the fewest of that stage's
        requests in flight, then on the executors with the fewest requests in flight (ties in
        turn), all chosen when the request enters."""
        nonlocal seq, turn
        chosen: list[list[int]] = []
        used: set[int] = set()
        for si, (s, exs) in enumerate(zip(stages, replica_ex)):
            n = len(exs)
            turn += 1
            order = sorted(range(n), key=lambda r: (assigned[si][r], inflight[exs[r]], (r + turn) % n))
            targets = [order[j % n] for j in range(s.k)]
            chosen.append(targets)
            used.update(exs[r] for r in targets)
            for r in targets:
                assigned[si][r] += 1
        for e in used:
            inflight[e] += 1
        routes[req], uses[req] = chosen, used
        for si in entry:
            seq += 1
            push(events, (now + hop_ms(req), seq, _ARRIVE, si, req))

    while events:
        now, _, kind, si, data = pop(events)
        if kind == _ENTER:
            enter(data, now)
            continue
        if kind == _FINISH:
            for e in uses.pop(data):
                inflight[e] -= 1
            for si, targets in enumerate(routes[data]):
                for r in targets:
                    assigned[si][r] -= 1
            continue
        st = stages[si]
        sim_now[0] = now
        if kind == _ARRIVE:
            req = data
            if st.first:
                if req in st.seen:
                    continue
                st.seen.add(req)
            elif st.n_inputs > 1:
                got = st.joins.get(req, 0) + 1
                if got < st.n_inputs:
                    st.joins[req] = got
                    continue
                del st.joins[req]
            ready(st, data, now)
        elif kind == _DONE:
            r, batch, ms = data
            st.running[r] -= 1
            if st.aimd is not None:
                st.aimd[r].observe(len(batch), ms)
            if st.shared:
                st.idle.append(r)
            else:
                st.load[r] -= len(batch)
            for req in batch:
                if st.k > 1:
                    if req in st.answered:  # a slower copy: its answer is dropped
                        continue
                    st.answered.add(req)
                emit(st, req, now)
            start(st, 0 if st.shared else r, now)
        else:
            st.timer[data] = None
            start(st, data, now)

    latencies = finish - arrivals
    span_ms = max(float(np.max(finish) - arrivals[0]), 1e-9)
    stats = {
        s.spec.name: StageStats(
            s.batches,
            s.rows / max(s.batches, 1),
            s.wait_ms / max(s.rows, 1),
            s.busy_ms / (s.n * s.threads * span_ms),
            float(np.mean(s.caps)) if s.caps else None,
        )
        for s in stages
    }
    return SimResult(latencies, len(arrivals) / span_ms * 1000.0, stats)
