"""The metrics a real Prometheus scrapes (docs/operations.md, "Metrics"): Debian's
``prometheus`` scrapes a local cluster's gateway while flows of every kind serve a little
load, and its HTTP API finds each documented metric; every metric the gateway exports is
documented; the Grafana dashboard is valid JSON and queries only exported metrics."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from flow import Flow
from kvs.server import free_port
from optimizer import OptimizerOptions
from tests.executors.conftest import unique
from tests.executors.test_slo import APART, PROFILE, RULES, two_stage

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
ONLY_ON_GPUS = "flowserve_gpu_"  # GPU executors' figures: none on a machine without GPUs


def documented() -> dict[str, str]:
    """Metric -> type, from the table of docs/operations.md."""
    rows = re.findall(r"^\| `(flowserve_\w+)` \| (counter|gauge|histogram) \|", OPERATIONS.read_text(), re.M)
    assert len(rows) > 20, "the metrics table of docs/operations.md was not found"
    return dict(rows)


def exported_families(text: str) -> dict[str, str]:
    """Metric -> type, from Prometheus text: the ``# TYPE`` lines (a counter under its
    ``_total`` name, as it is queried; not the ``_created`` gauge prometheus_client gives
    each counter and histogram series, a time of its own)."""
    out = {}
    for name, kind in re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M):
        if name.endswith("_created"):
            continue
        out[name + "_total" if kind == "counter" and not name.endswith("_total") else name] = kind
    return out


def series_name(metric: str, kind: str) -> str:
    """The series a query for ``metric`` finds (a histogram's count)."""
    return metric + "_count" if kind == "histogram" else metric


def fast(row):
    return row.x + 1


def slow(row):
    time.sleep(0.03)  # longer than the hedge's delay: every request sends a backup
    return row.x * 2


def batched(table):
    time.sleep(0.01)  # requests queue behind a run: batches of more than one
    return table.column("x").to_numpy() * 3


def key_of(row):
    return f"prom/k:{row.x % 3}"


def flows() -> list[tuple[Flow, dict]]:
    """A flow for each kind of stage a metric is about: batching, racing, hedged, cached,
    a per-row store lookup; each deployed with its options."""
    out = []
    f = Flow(unique("prom-batch"), schema={"x": int})
    f.map(batched, names=["y"], batching=True)
    out.append((f, {}))
    f = Flow(unique("prom-race"), schema={"x": int})
    f.map(fast, names=["y"], high_variance=True)
    out.append((f, {"options": OptimizerOptions(competitive_replicas=2)}))
    f = Flow(unique("prom-hedge"), schema={"x": int})
    f.map(slow, names=["y"], hedge=0.005)
    out.append((f, {}))
    f = Flow(unique("prom-cache"), schema={"x": int})
    f.map(fast, names=["y"], cache=True)
    out.append((f, {}))
    f = Flow(unique("prom-lookup"), schema={"x": int})
    f.map(key_of, names=["key"]).lookup(column="key", name="v")
    out.append((f, {}))
    return out


@pytest.fixture(scope="module")
def prometheus_bin() -> str:
    """Debian's prometheus. Where it is missing the test skips saying how to install it,
    except in CI (``CI`` set, as .ci/run runs) or with FLOWSERVE_PROMETHEUS_REQUIRED=1,
    where a missing binary is a failure: the test must run there, not skip."""
    path = shutil.which("prometheus")
    if path is None:
        why = "Debian's prometheus is not installed: apt-get install -y --no-install-recommends prometheus"
        if os.environ.get("CI") or os.environ.get("FLOWSERVE_PROMETHEUS_REQUIRED") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return path


def _wait(what: str, ok, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.1)


def _query(api: str, expr: str) -> list:
    r = httpx.get(f"{api}/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


def test_a_real_prometheus_scrapes_every_documented_metric(cluster, prometheus_bin, tmp_path):
    """On the runtime tests' shared cluster (conftest.py: two executors)."""
    cluster.kvs.mput({f"prom/k:{i}": i for i in range(3)})
    deployed = [cluster.deploy(f, **options) for f, options in flows()]
    slo = cluster.deploy(two_stage("prom-slo"), rules=RULES, slo=_slo(), profile=PROFILE, traffic=50, planner=APART)
    deployed.append(slo)
    port = free_port()
    target = urlparse(cluster.url).netloc
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: flowserve\n    static_configs:\n      - targets: ['{target}']\n"
    )
    prom = subprocess.Popen(
        [
            prometheus_bin,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("wb"),
    )
    api = f"http://127.0.0.1:{port}"
    try:
        _wait("prometheus ready", lambda: _ready(api, prom))
        _load(cluster, deployed)
        expected = {m: k for m, k in documented().items() if not m.startswith(ONLY_ON_GPUS)}
        missing: list[str] = []

        def found_all() -> bool:
            missing[:] = [m for m, k in expected.items() if not _query(api, series_name(m, k))]
            return not missing

        deadline = time.monotonic() + 60
        while not found_all():
            assert time.monotonic() < deadline, f"Prometheus has no series of {missing}"
            _load(cluster, deployed, rounds=1)
            time.sleep(0.5)
        # the figures are the cluster's: the executors' own, summed, match what they did
        assert sum(float(s["value"][1]) for s in _query(api, "flowserve_executors{state='answering'}")) == 2
        race = _query(api, f"flowserve_race_wins_total{{flow='{deployed[1].name}'}}")
        assert {s["metric"]["executor"] for s in race} <= {"cpu0", "cpu1"}
        hits = _query(api, "sum(flowserve_kvs_cache_lookups_total{result='hit'})")
        assert float(hits[0]["value"][1]) > 0  # the lookup flow's keys, read again from the local cache
        batches = _query(api, f"sum(flowserve_executor_batch_size_count{{flow='{deployed[0].name}'}})")
        assert float(batches[0]["value"][1]) > 0
        # each of the dashboard's queries is PromQL this Prometheus runs (its variables filled
        # in as Grafana would); a query it cannot parse answers 400
        for expr in _dashboard_exprs():
            filled = expr.replace("$__rate_interval", "1m").replace('"$flow"', '".*"')
            r = httpx.get(f"{api}/api/v1/query", params={"query": filled}, timeout=10)
            assert r.status_code == 200, f"the dashboard's {expr!r}: {r.text}"
    finally:
        prom.terminate()
        prom.wait(10)
        for d in deployed:
            d.undeploy()


def _slo():
    from optimizer.slo import SLO

    return SLO(p99_ms=200)


def _ready(api: str, prom: subprocess.Popen) -> bool:
    assert prom.poll() is None, f"prometheus exited with {prom.returncode}"
    try:
        return httpx.get(f"{api}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _load(cluster, deployed, rounds: int = 3) -> None:
    """A little load on every flow, 4 clients at a time (batches form), and one bad request."""

    def client(d, k: int) -> None:
        for i in range(rounds * 4):
            cluster.http.post(f"/flows/{d.name}", json={"x": k * 100 + i}, timeout=30).raise_for_status()

    threads = [threading.Thread(target=client, args=(d, k)) for d in deployed for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert cluster.http.post(f"/flows/{deployed[0].name}", json={"y": "no"}, timeout=30).status_code == 400


def test_every_exported_metric_is_documented_with_its_type(cluster):
    """The gateway's metrics (its /metrics has every family, with or without series) are
    the documentation's table, each with the documented type."""
    text = cluster.http.get("/metrics").text
    exported = {m: k for m, k in exported_families(text).items() if m.startswith("flowserve_")}
    assert exported == documented()


def _dashboard_exprs() -> list[str]:
    """The PromQL of the dashboard's panels."""
    dashboard = json.loads(DASHBOARD.read_text())  # valid JSON, or this fails naming the line
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]


def test_the_grafana_dashboard_queries_only_exported_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _dashboard_exprs() + [str(v.get("query")) for v in dashboard["templating"]["list"]]
    assert len(dashboard["panels"]) >= 10 and all(exprs)
    known = documented()
    series = {series_name(m, "") for m in known} | {
        m + suffix for m, k in known.items() if k == "histogram" for suffix in ("_bucket", "_sum", "_count")
    }
    used = {name for e in exprs for name in re.findall(r"\bflowserve_\w+", e)}
    assert used - series == set(), "the dashboard queries metrics the gateway does not export"
    # and it shows each of them (but the histograms' _bucket-only uses)
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) if n not in known else n for n in used}
    assert set(known) - shown == set(), "documented metrics the dashboard does not show"
