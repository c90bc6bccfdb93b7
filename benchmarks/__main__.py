"""Run one benchmark: ``python -m benchmarks NAME [options]`` (``--help`` after NAME).

Each writes raw results to benchmarks/results/NAME.json and a PNG plot beside it;
benchmarks/README.md summarises the latest figures.
"""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = {
    "e2e": "Ensemble and Cascade over HTTP: FlowServe vs Ray Serve vs the in-process floor",
    "matrix": "Ensemble, Cascade, lookup written every way (row/Table, 1/3/6 stages, JSON/Arrow) vs a floor running the same code",
    "matrix_peers": "the matrix's cells on Ray Serve, LitServe and BentoML beside FlowServe and the floor: FlowServe / peer per cell",
    "overhead": "the e2e Ensemble's CPU per request in each process beside the floor's; the pieces in a hot loop",
    "polling": "a round trip between two processes: busy polling, sleeping, the runtime's back-off; idle and beside CPU hogs",
    "chain": "added latency per stage on a chain of no-op stages",
    "stages": "chains of 1/2/4/8 no-op stages, unfused and fused, beside Ray Serve's chain: req/s at c=8, p50 at c=1",
    "autoscale": "a 2x load step: time until a new replica serves; replicas and p99 over time",
    "kvs_cache": "8 MB reads: local cache vs Redis vs Redis + decode",
    "fusion": "chains of 2-10 no-op stages, 10 KB-10 MB payloads: fused vs one stage per operator",
    "competition": "a Gamma-sleeping stage raced by 1, 3 or 7 replicas: median and p99",
    "locality": "100 objects of 8 KB-8 MB read by per-row lookups: naive, fusion, fusion + continuations",
    "batching": "one CNN operator at batch 1-40: in-process through the batching path, and over HTTP",
    "messages": "one request's run message built, encoded, decoded and read: ns per message; wire vs Arrow IPC",
    "slo": "SLO serving: simulator vs the local cluster (validate); planner+tuner vs fused-for-peak vs autoscaler",
    "slo_aimd": "AIMD vs the best fixed batch size (sweep) vs Ray Serve @serve.batch: a torch CNN under a 20 ms p99 SLO",
    "clipper": "prediction cache (Zipf), ensemble deadline answers, hedging vs racing, Exp3/Exp4 on drifting digits",
    "hop": "one 10 MB Table between two processes: through the socket vs shared memory (fresh, forwarded)",
    "bigpayload": "10 MB through a fused 10-stage chain over HTTP vs a bare HTTP echo of the same bytes",
    "coldcpu": "the gateway's parse of a 10 KB body hot vs right after a sleep, a 10 MiB segment written or freed",
    "bigbeside": "a small flow's p50 / p99 while 10 MB requests arrive at a fixed rate; big requests' latency",
    "soak": "N requests at concurrency C while kill -9, hangs, poison inputs and redeploys are injected",
    "gateway_restart": "the gateway process killed (kill -9, SIGSEGV) under load: gap, answered / lost / wrong",
    "store_failover": "a Sentinel / Cluster store's primary killed under load: answered / lost / wrong; WAIT 1's cost",
    "store_restart": "the embedded store killed under load holding GBs: what clients meet while it reads its AOF back; its data after",
    "value_checks": "checking that request values fit their column's type (300 in uint8): its cost on JSON, flow.run and Arrow inputs",
    "leanhttp": "the gateway's HTTP layer alone: the lean invocation path vs the same through the ASGI app",
    "large_requests": "5/50 MB JSON and 200 MB Arrow bodies: time, gateway memory / body, other clients' p99",
    "rollout": "a canary's share held over N requests (windows of 100 and 1000); a shadow's cost on the primary's p50/p99",
    "tracing": "OpenTelemetry tracing off / sampling 1% / 100%: p50 at concurrency 1 and throughput at 8, side by side",
    "scaling_limits": "10 / 100 / 1,000 executors: routing CPU per request, liveness pings, heartbeats in the store, dead-executor notice, autoscaler step",
    "devloop": "flowserve serve --reload: start to the first answer, a saved edit to its answer, Ctrl-C to exit",
    "cancellation": "a client's disconnect: time until the worker thread its request holds in fs.wait is free, idle and under load",
    "streaming": "streamed answers: time to the first row vs the whole answer (100 rows, a progressive cascade); the plain path's p50",
    "gpu": "GPU executors: batching 1-40 on the GPU vs the CPU (in-process, deployed), the Ensemble's large model on a GPU, NVML over a load step",
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in BENCHMARKS:
        print(__doc__)
        for name, what in BENCHMARKS.items():
            print(f"  {name:10s} {what}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    module = importlib.import_module(f"benchmarks.{argv[0]}")
    module.run(argv[1:]) if hasattr(module, "run") else module.main(argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
