"""The gateway's per-request histograms (metrics.LoopHistogram) expose what
prometheus_client's Histogram exposes for the same observations: the same families,
buckets, counts and sums, parsed back from the text format a scrape reads."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from executors.gateway.metrics import _MS, LoopHistogram, Metrics


def _samples(registry) -> dict:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if not s.name.endswith("_created"):  # prometheus_client's creation time, not a figure
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_loop_histogram_scrapes_as_prometheus_clients_histogram_does():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = LoopHistogram("h_ms", "doc", ["flow", "stage"], _MS, registry=ours)
    reference = Histogram("h_ms", "doc", ["flow", "stage"], buckets=_MS, registry=theirs)
    rng = random.Random(5)
    # values on every bound (a value equal to a bound counts in it), between, below and above all
    values = [*_MS, *(b * 1.0001 for b in _MS), 0.0, 1e9, *(rng.expovariate(0.05) for _ in range(500))]
    for v in values:
        labels = (rng.choice(["a", "b"]), rng.choice(["s1", 's"2\\']))  # label values that need escaping
        mine.observe(labels, v)
        reference.labels(*labels).observe(v)
    got, want = _samples(ours), _samples(theirs)
    assert got.keys() == want.keys() and len(got) == 4 * (len(_MS) + 3)
    for key, value in want.items():
        assert abs(got[key] - value) <= 1e-9 * max(1.0, abs(value)), key


def test_a_traces_stages_are_observed_per_flow_and_stage():
    m = Metrics()
    m.observe_trace("f", [["s1", "e0", 0.3, 1], ["s2", "e0", 7.0, 4]])
    m.observe_trace("f", [["s1", "e0", 30.0, 2]])
    s = _samples(m.registry)
    assert s[("flowserve_stage_latency_ms_count", (("flow", "f"), ("stage", "s1")))] == 2
    assert s[("flowserve_stage_latency_ms_bucket", (("flow", "f"), ("le", "0.5"), ("stage", "s1")))] == 1
    assert s[("flowserve_stage_latency_ms_sum", (("flow", "f"), ("stage", "s2")))] == 7.0
    assert s[("flowserve_stage_batch_size_bucket", (("flow", "f"), ("le", "2.0"), ("stage", "s1")))] == 2
    assert s[("flowserve_stage_batch_size_bucket", (("flow", "f"), ("le", "2.0"), ("stage", "s2")))] == 0
