"""OpenTelemetry traces on a real cluster (executors/tracing.py): one trace per request across
the gateway's process and the executors' (each exporting over OTLP/HTTP to a collector in
this process, otlp_collector.py), with its parent/child structure, a continued
``traceparent``, a race's winner and losers, a batch's links, a hedge, cache and store
lookups, the trace id in the answer and in the log lines; and with tracing off, none of its
modules is imported."""

from __future__ import annotations

import ast
import itertools
import os
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from executors import tracing
from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from executors.tracing import TracingConfig
from flow import Flow, current_store, wait
from flow.configuration import ConfigError, ConfigTypeError
from optimizer import OptimizerOptions
from tests.executors.conftest import unique
from tests.executors.otlp_collector import OTLPCollector

ROOT = Path(__file__).resolve().parents[2]
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def collector():
    with OTLPCollector() as c:
        yield c


@pytest.fixture(scope="module")
def traced(collector):
    """A 2-executor cluster tracing every request to ``collector``; spans leave each process
    every 100 ms (the SDK's OTEL_BSP_SCHEDULE_DELAY, 5 s by default)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        config = ClusterConfig(
            executors=2,
            threads=4,
            request_timeout_s=20,
            colocate=False,
            tracing=TracingConfig(endpoint=collector.endpoint),
        )
        c = LocalCluster(config).start()
    yield c
    c.stop()


def _post(cluster, name: str, row: dict, traceparent: str | None = None) -> httpx.Response:
    headers = {} if traceparent is None else {"traceparent": traceparent}
    return cluster.http.post(f"/flows/{name}", json=row, headers=headers, timeout=30)


def _tp(trace_id: str, span: str = CALLER_SPAN, flags: str = "01") -> str:
    return f"00-{trace_id}-{span}-{flags}"


def _new_trace() -> str:
    return os.urandom(16).hex()


def _by_name(spans, prefix: str) -> list:
    return [s for s in spans if s.name.startswith(prefix)]


def _request_span(spans):
    (span,) = [s for s in spans if s.name.startswith("POST /flows/")]
    return span


def plus_one(row):
    return row.x + 1


def times_two(row):
    return row.y * 2


def test_a_request_is_one_trace_across_the_gateway_and_the_executors(traced, collector):
    f = Flow(unique("traced-chain"), schema={"x": int})
    f.map(plus_one, names=["y"]).map(times_two, names=["z"])
    d = traced.deploy(f, optimize=False)  # a stage per operator, spread over both executors
    try:
        r = _post(traced, f.name, {"x": 1}, _tp(TRACE))
        assert r.status_code == 200 and r.json()["rows"][0]["z"] == 4
        # the caller's trace is continued, and the answer names it
        assert r.headers["x-trace-id"] == TRACE
        version, trace_id, span_id, flags = r.headers["traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", TRACE, "01") and span_id != CALLER_SPAN
        spans = collector.trace(TRACE, until=lambda s: len(_by_name(s, "stage ")) == 2 and _by_name(s, "POST"))
        root = _request_span(spans)
        assert root.resource.attributes["service.name"] == "flowserve-gateway"
        assert root.parent is not None and f"{root.parent.span_id:016x}" == CALLER_SPAN
        assert f"{root.context.span_id:016x}" == span_id
        assert root.attributes["flowserve.flow"] == f.name and root.attributes["http.response.status_code"] == 200
        assert root.attributes["flowserve.request.id"] == r.headers["x-request-id"]
        stages = {s.attributes["flowserve.stage"]: s for s in _by_name(spans, "stage ")}
        assert set(stages) == {"plus_one", "times_two"}
        for s in stages.values():  # each stage run is a child of the request, on an executor
            assert s.parent.span_id == root.context.span_id
            assert s.resource.attributes["service.name"] == "flowserve-executor"
            assert s.attributes["flowserve.executor"] == s.resource.attributes["service.instance.id"]
            assert s.attributes["flowserve.batch.size"] == 1
            assert s.attributes["flowserve.queue.wait_ms"] >= 0
            assert root.start_time <= s.start_time <= s.end_time <= root.end_time
        assert stages["plus_one"].end_time <= stages["times_two"].start_time
        assert (
            stages["plus_one"].attributes["flowserve.executor"] != stages["times_two"].attributes["flowserve.executor"]
        )
    finally:
        d.undeploy()


def test_a_request_without_a_traceparent_starts_a_trace_and_an_unsampled_one_records_none(traced, collector):
    f = Flow(unique("traced-new"), schema={"x": int})
    f.map(plus_one, names=["y"])
    d = traced.deploy(f)
    try:
        r = _post(traced, f.name, {"x": 1})
        new = r.headers["x-trace-id"]
        version, trace_id, _span, flags = r.headers["traceparent"].split("-")
        assert (version, trace_id) == ("00", new) and int(flags, 16) & 1  # sampled (a ratio of 1)
        spans = collector.trace(new, until=lambda s: _by_name(s, "stage ") and _by_name(s, "POST"))
        assert _request_span(spans).parent is None  # a root: nobody called it within a trace
        # the caller decided not to record this trace: nothing is, anywhere, but its id is named
        quiet = _new_trace()
        r = _post(traced, f.name, {"x": 2}, _tp(quiet, flags="00"))
        assert (
            r.status_code == 200 and r.headers["x-trace-id"] == quiet and not int(r.headers["traceparent"][-2:], 16) & 1
        )
        marker = _new_trace()  # a sampled request after it: once its spans are in, the quiet one's would be
        _post(traced, f.name, {"x": 3}, _tp(marker))
        collector.trace(marker, until=lambda s: _by_name(s, "stage ") and _by_name(s, "POST"))
        assert [s for s in collector.spans() if s.context.trace_id == int(quiet, 16)] == []
    finally:
        d.undeploy()


class FirstCallQuick:
    """Each replica's first call answers at once and every later one waits 5 s (in
    ``flow.wait``, which a race won elsewhere stops): of three copies on two executors, two
    are quick and race, the third waits and is cancelled."""

    def __init__(self):
        self.calls = itertools.count()

    def __call__(self, row):
        if next(self.calls):
            wait(5.0)
        return row.x


def test_a_race_has_a_span_per_copy_the_winner_marked_and_the_losers_cancelled(traced, collector):
    f = Flow(unique("traced-race"), schema={"x": int})
    f.map(FirstCallQuick, names=["y"], high_variance=True)
    d = traced.deploy(f, options=OptimizerOptions(competitive_replicas=3))
    try:
        t0 = time.monotonic()
        r = _post(traced, f.name, {"x": 7}, _tp(trace := _new_trace()))
        assert r.status_code == 200 and r.json()["rows"][0]["y"] == 7
        assert time.monotonic() - t0 < 4  # the waiting copy did not hold the answer
        spans = collector.trace(trace, until=lambda s: len(_by_name(s, "stage ")) == 3 and _by_name(s, "POST"))
        root = _request_span(spans)
        copies = _by_name(spans, "stage ")
        assert sorted(s.attributes["flowserve.race.copy"] for s in copies) == [0, 1, 2]
        outcomes = sorted(s.attributes["flowserve.race.outcome"] for s in copies)
        assert "cancelled" in outcomes and set(outcomes) <= {"answered", "lost", "cancelled"}
        assert all(s.parent.span_id == root.context.span_id for s in copies)
        # the winner: the copy whose output the answer holds, named on the request's span
        (event,) = [e for e in root.events if e.name == "race won"]
        (won,) = [s for s in copies if f"{s.context.span_id:016x}" == event.attributes["flowserve.race.span"]]
        assert event.attributes["flowserve.race.copy"] == won.attributes["flowserve.race.copy"]
        assert event.attributes["flowserve.executor"] == won.attributes["flowserve.executor"]
        assert won.attributes["flowserve.race.outcome"] == "answered"
        assert won.end_time - won.start_time < 2e9  # a quick copy: its 5 s sibling was stopped
    finally:
        d.undeploy()


def slow_batch(table):
    time.sleep(0.1)  # requests queue behind a run, so the next run takes them as one batch
    return table.column("x").to_numpy() * 10


def test_a_batched_run_links_every_request_it_serves(traced, collector):
    f = Flow(unique("traced-batch"), schema={"x": int})
    f.map(slow_batch, names=["y"], batching=True)
    d = traced.deploy(f)
    try:
        traces = [_new_trace() for _ in range(12)]
        answers: dict = {}

        def call(i: int) -> None:
            answers[i] = _post(traced, f.name, {"x": i}, _tp(traces[i]))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(traces))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(answers[i].json()["rows"][0]["y"] == 10 * i for i in range(len(traces)))
        ids = {int(t, 16) for t in traces}

        def all_in(spans) -> bool:  # every request's span, and runs covering all of them
            gateway = [s for s in spans if s.name.startswith("POST")]
            served = sum(s.attributes["flowserve.batch.size"] for s in spans if s.name.startswith("stage "))
            return len(gateway) == len(traces) and served == len(traces)

        deadline = time.monotonic() + 20
        while not all_in(spans := [s for s in collector.spans() if s.context.trace_id in ids]):
            assert time.monotonic() < deadline, f"{len(spans)} spans of the batch's requests"
            time.sleep(0.05)
        requests = {s.context.trace_id: s for s in spans if s.name.startswith("POST")}
        batches = [s for s in spans if s.name.startswith("stage ") and s.attributes["flowserve.batch.size"] > 1]
        assert batches, "no run served more than one request"
        for b in batches:
            # in the first request's trace, linking each request it serves: their request spans
            assert len(b.links) == b.attributes["flowserve.batch.size"]
            linked = {(link.context.trace_id, link.context.span_id) for link in b.links}
            assert linked == {(t, requests[t].context.span_id) for t, _ in linked}
            assert b.parent.span_id == requests[b.context.trace_id].context.span_id
            assert (b.context.trace_id, b.parent.span_id) in linked
            assert all("flowserve.queue.wait_ms" in link.attributes for link in b.links)
    finally:
        d.undeploy()


def key_of(row):
    return f"traced/emb:{row.user}"


def total(row):
    return float(np.sum(row.vec))


def test_store_and_prediction_cache_lookups_are_spans_of_their_run(traced, collector):
    traced.kvs.put("traced/emb:1", np.arange(4, dtype=np.float32))
    f = Flow(unique("traced-lookup"), schema={"user": int})
    f.map(key_of, names=["key"]).lookup(column="key", name="vec").map(total, names=["t"], cache=True)
    d = traced.deploy(f)
    try:
        runs = []
        for _ in range(2):  # the first reads the store and computes; the second finds both cached
            r = _post(traced, f.name, {"user": 1}, _tp(trace := _new_trace()))
            assert r.status_code == 200 and r.json()["rows"][0]["t"] == 6.0
            runs.append(
                collector.trace(
                    trace,
                    until=lambda s: _by_name(s, "kvs.") and _by_name(s, "prediction_cache") and _by_name(s, "stage "),
                )
            )
        for spans, source, result in zip(runs, ("store", "local"), ("miss", "hit")):
            parents = {s.context.span_id: s for s in _by_name(spans, "stage ")}
            (lookup,) = _by_name(spans, "kvs.")
            assert lookup.attributes["flowserve.kvs.source"] == source
            assert lookup.attributes["flowserve.kvs.keys"] == 1
            assert parents[lookup.parent.span_id].resource.attributes["service.name"] == "flowserve-executor"
            (cached,) = _by_name(spans, "prediction_cache")
            assert cached.attributes["flowserve.cache.result"] == result
            assert parents[cached.parent.span_id].attributes["flowserve.stage"].endswith("total")
    finally:
        d.undeploy()
        traced.kvs.delete("traced/emb:1")


class SlowOnFirstReplica:
    """The replica that runs first becomes slow (2 s a call); the other answers at once."""

    def __init__(self):
        self.slow = None

    def __call__(self, row):
        if self.slow is None:
            self.slow = bool(current_store().redis.set("traced-hedge-slow", os.getpid(), nx=True))
        if self.slow:
            time.sleep(2)
        return row.x * 3


def test_a_hedge_is_a_span_and_its_backup_copy_runs_in_the_same_trace(traced, collector):
    traced.kvs.delete("traced-hedge-slow")
    f = Flow(unique("traced-hedge"), schema={"x": int})
    f.map(SlowOnFirstReplica, names=["y"], hedge=0.1)
    d = traced.deploy(f)
    try:
        hedged = None
        for i in range(6):  # until one is routed to the slow replica and hedged
            r = _post(traced, f.name, {"x": i}, _tp(trace := _new_trace()))
            assert r.status_code == 200 and r.json()["rows"][0]["y"] == 3 * i
            spans = collector.trace(trace, until=lambda s: _by_name(s, "stage ") and _by_name(s, "POST"))
            if _by_name(spans, "hedge "):
                hedged = trace
                break
        assert hedged is not None, "no request was hedged"
        spans = collector.trace(
            hedged, until=lambda s: len(_by_name(s, "stage ")) == 2 and _by_name(s, "POST") and _by_name(s, "hedge ")
        )
        root = _request_span(spans)
        (hedge,) = _by_name(spans, "hedge ")
        assert hedge.parent.span_id == root.context.span_id
        backup = [s for s in _by_name(spans, "stage ") if s.attributes["flowserve.hedge.backup"]]
        assert len(backup) == 1 and backup[0].attributes["flowserve.race.outcome"] == "answered"
        (event,) = [e for e in root.events if e.name == "race won"]
        assert event.attributes["flowserve.race.span"] == f"{backup[0].context.span_id:016x}"
        assert backup[0].parent.span_id == root.context.span_id
    finally:
        d.undeploy()
        traced.kvs.delete("traced-hedge-slow")


def broken(row):
    raise ValueError(f"no good: {row.x}")


def test_the_trace_id_is_in_the_executors_log_line_about_a_failed_request(traced, collector):
    f = Flow(unique("traced-broken"), schema={"x": int})
    f.map(broken, names=["y"])
    d = traced.deploy(f)
    try:
        trace = _new_trace()
        r = _post(traced, f.name, {"x": 1}, _tp(trace))
        assert r.status_code == 500 and r.headers["x-trace-id"] == trace
        spans = collector.trace(trace, until=lambda s: _by_name(s, "stage ") and _by_name(s, "POST"))
        assert _by_name(spans, "stage ")[0].status.status_code.name == "ERROR"
        assert _request_span(spans).status.status_code.name == "ERROR"
        logs = Path(traced.dir) / "logs"
        deadline = time.monotonic() + 10
        while not any(f"trace {trace}" in p.read_text(errors="replace") for p in logs.glob("cpu*.log")):
            assert time.monotonic() < deadline, "no executor log line names the trace"
            time.sleep(0.05)
    finally:
        d.undeploy()


# -- off, and the setting ------------------------------------------------------------------------


def test_tracing_off_imports_no_opentelemetry_module_of_ours():
    """Every import of opentelemetry in the runtime is inside a function of executors/tracing.py,
    which only runs once ``setup`` turned tracing on: with it off, the data path's hooks test
    ``tracing.tracer`` (None) and nothing else."""
    found = []
    for package in ("flow", "optimizer", "kvs", "executors", "k8s", "flowserve"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            top = {id(n) for n in tree.body}
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if any(n.split(".")[0] == "opentelemetry" for n in names):
                    found.append((str(path.relative_to(ROOT)), id(node) in top))
    assert found and all(path == "executors/tracing.py" and not at_top for path, at_top in found), found
    assert tracing.tracer is None  # this process never turned it on


def tracing_loaded(row):
    """The OpenTelemetry modules only tracing loads (the SDK's tracer, the exporter) and
    whether a tracer provider was set. Not the API as a whole: redis-py 8 imports the API and
    the metrics SDK itself wherever they are installed (its own observability layer)."""
    import sys

    trace = sys.modules.get("opentelemetry.trace")
    return sorted(
        [m for m in sys.modules if m.startswith(("opentelemetry.sdk.trace", "opentelemetry.exporter"))]
        + (["a tracer provider"] if trace is not None and trace._TRACER_PROVIDER is not None else [])
    )


def test_an_untraced_clusters_executors_load_no_tracing_module(cluster):
    """On the runtime tests' shared cluster (tracing off), an executor that has run a
    request has loaded none of what tracing needs: the off path is lazy in the running
    process too, and the answer names no trace."""
    f = Flow(unique("untraced"), schema={"x": int})
    f.map(tracing_loaded, names=["loaded"])
    d = cluster.deploy(f)
    try:
        r = cluster.http.post(f"/flows/{f.name}", json={"x": 1}, timeout=30)
        assert r.status_code == 200 and r.json()["rows"][0]["loaded"] == []
        assert "traceparent" not in r.headers and "x-trace-id" not in r.headers
    finally:
        d.undeploy()


def test_the_setting_is_checked_and_travels_as_json():
    with pytest.raises(ConfigError, match=r"TracingConfig.sample_ratio must be a number in \[0, 1\], got 1.5"):
        TracingConfig(sample_ratio=1.5)
    with pytest.raises(
        ConfigError, match="TracingConfig.endpoint must be an http:// or https:// URL or None, got 'collector:4318'"
    ):
        TracingConfig(endpoint="collector:4318")
    with pytest.raises(ConfigTypeError, match="ClusterConfig.tracing must be a TracingConfig or a mapping"):
        ClusterConfig(tracing="on")
    with pytest.raises(ConfigError, match=r"ClusterConfig.tracing: TracingConfig: unknown field\(s\) \['ratio'\]"):
        ClusterConfig(tracing={"ratio": 0.1})
    config = ClusterConfig(tracing={"sample_ratio": 0.01})
    assert config.tracing == TracingConfig(sample_ratio=0.01)
    assert ClusterConfig.from_json(config.to_json()) == config
    assert config.tracing_env() == {tracing.ENV: '{"endpoint": null, "sample_ratio": 0.01}'}
    assert ClusterConfig().tracing_env() == {}
    with pytest.raises(ConfigError, match="FLOWSERVE_TRACING must be a TracingConfig as JSON, got 'yes'"):
        tracing.setup_from_env("x", environ={tracing.ENV: "yes"})
    tracing.setup_from_env("x", environ={})  # absent: off
    assert tracing.tracer is None


def test_the_gateway_draws_the_sampling_ratio_itself_and_names_unsampled_traces(monkeypatch):
    """A request the ratio leaves out costs no SDK span (this process never set tracing up),
    yet its answer names a trace; a caller's unsampled trace is continued, not recorded."""
    monkeypatch.setattr(tracing, "_ratio", 0.0)
    span = tracing.request_span("f", {})
    assert not span.is_recording()
    (tp_name, tp), (id_name, trace_id) = tracing.end_request(span, 200)
    assert (tp_name, id_name) == (b"traceparent", b"x-trace-id")
    assert tp.decode().startswith(f"00-{trace_id.decode()}-") and tp.endswith(b"-00") and len(trace_id) == 32
    quiet = tracing.request_span("f", {"traceparent": _tp(TRACE, flags="00")})
    assert f"{quiet.get_span_context().trace_id:032x}" == TRACE and not quiet.is_recording()
    monkeypatch.setattr(tracing, "_ratio", 0.25)
    drawn = sum(tracing._unsampled({}) is None for _ in range(4000))  # None: the SDK records it
    assert 800 < drawn < 1200
    monkeypatch.setattr(tracing, "_ratio", 1.0)
    assert tracing._unsampled({}) is None and tracing._unsampled({"traceparent": "garbage"}) is None
