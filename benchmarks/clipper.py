"""Clipper's layer, four experiments side by side on one local cluster:

- cache: a 2 ms "model" behind ``map(..., cache=100)``, queries drawn from a bounded Zipf
  over 1000 keys (skew s = 0.6 / 1.0 / 1.4): throughput and hit rate vs no cache, per
  replica and shared through the KVS (``CacheSpec(shared=True)``).
- deadline: an ensemble of 3 members (each right 75% of the time, independently), one
  member per request slowed to 150 ms with probability 0.3; majority vote of what arrived:
  p99 and accuracy with ``deadline_ms=25`` vs waiting for all.
- hedging: one stage sleeping Gamma(shape 0.5, scale 10 ms) (high variance): p50/p99 and extra runs per
  request with ``hedge="p90"``, ``hedge="p95"``, racing 3 copies (``high_variance``) and none.
- selection: 4 classifiers trained on scikit-learn's digits (their test-set predictions,
  precomputed); halfway through the run the best one drifts (70% of its answers become
  wrong). Exp3 (one model per query, reward feedback) regret against the best fixed model
  in hindsight; Exp4 (weighted vote, label feedback) error against the best single model;
  Exp4 on the models' predicted probabilities (weighted mean of the vectors) likewise.

Configurations of an experiment are interleaved in rounds on one cluster (their order
rotates from round to round); figures are medians over rounds. On a shared 2-core machine the absolute numbers are noisy; compare
within one run.

    python -m benchmarks clipper [--rounds 3] [--requests 200] [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import time

import numpy as np

from benchmarks.common import RESULTS, plt, progress, save, save_plot

SKEWS = (0.6, 1.0, 1.4)
KEYS = 1000
HEDGES = ("none", "p90", "p95", "race3")
CACHES = ("none", "cache", "shared")
SECTIONS = ("cache", "deadline", "hedging", "selection")


def rotated(items, r: int) -> list:
    """``items`` starting at position ``r`` (mod len): each configuration takes each place in turn."""
    items = list(items)
    k = r % len(items)
    return items[k:] + items[:k]


# -- operators (shipped to the executors by value) ----------------------------------------


def model_2ms(row):
    time.sleep(0.002)
    return row.k * 7 % 11


def model_of(ms: float):
    """A model that takes ``ms`` per row (2 ms: ``model_2ms``, the first runs' setting)."""
    if ms == 2:
        return model_2ms

    def model(row):
        time.sleep(ms / 1000)
        return row.k * 7 % 11

    model.__name__ = f"model_{ms:g}ms"
    return model


def member(j: int):
    def predict(row):
        rng = np.random.default_rng([row.seed, j])
        if row.slow == j:
            time.sleep(0.15)
        else:
            time.sleep(0.002)
        return row.label if rng.random() < 0.75 else int((row.label + 1 + j) % 10)

    predict.__name__ = f"member{j}"
    return predict


def vote(answers):
    got = [a.y for a in answers if a is not None]
    values, counts = np.unique(got, return_counts=True)
    return int(values[np.argmax(counts)])


class GammaSleep:
    def __init__(self):
        self.rng = np.random.default_rng()

    def __call__(self, row):
        time.sleep(self.rng.gamma(0.5, 10.0) / 1000)
        return row.x


def make_prob_models(probs: np.ndarray, drift_at: int, worst: int):
    """Model j answers the probability vector probs[j][i]; after ``drift_at`` the drifting
    model's vector is shifted by one class on the same queries as ``make_models``'s."""
    fns = []
    for j in range(len(probs)):

        def fn(row, j=j):
            p = probs[j][row.i]
            if j == worst and row.i >= drift_at and (row.i * 7919) % 10 < 7:
                p = np.roll(p, 1)
            return p

        fn.__name__ = f"model{j}"
        fns.append(fn)
    return fns


def make_models(preds: np.ndarray, drift_at: int, worst: int):
    """Model j answers preds[j][i] for query i; model ``worst`` drifts after ``drift_at``."""
    fns = []
    for j in range(len(preds)):

        def fn(row, j=j):
            p = int(preds[j][row.i])
            if j == worst and row.i >= drift_at and (row.i * 7919) % 10 < 7:
                p = (p + 1) % 10
            return p

        fn.__name__ = f"model{j}"
        fns.append(fn)
    return fns


# -- helpers ----------------------------------------------------------------------------------


def _post_all(url: str, bodies: list, concurrency: int, headers=None) -> list:
    import httpx

    out = [None] * len(bodies)
    clients = [httpx.Client(timeout=30) for _ in range(concurrency)]

    def work(c: int):
        for i in range(c, len(bodies), concurrency):
            t0 = time.perf_counter()
            r = clients[c].post(url, json=bodies[i], headers=headers)
            ms = (time.perf_counter() - t0) * 1000
            if r.status_code != 200:
                raise RuntimeError(f"{url}: {r.status_code} {r.text[:200]}")
            out[i] = (ms, r.json()["rows"], int(r.headers["x-qid-start"]))

    with cf.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(work, range(concurrency)))
    for c in clients:
        c.close()
    return out


def _metric(cluster, name: str, **labels) -> float:
    total = 0.0
    for line in cluster.http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _p(values, q):
    return float(np.percentile(np.asarray(values, dtype=float), q))


# -- experiments -------------------------------------------------------------------------------


def exp_cache(cluster, rounds: int, requests: int, model_ms: float = 2) -> dict:
    from flow import CacheSpec, Flow

    specs = {"none": None, "cache": CacheSpec(size=100), "shared": CacheSpec(size=100, shared=True, ttl_s=600)}
    rows = {s: [] for s in SKEWS}
    for r in range(rounds):
        for s in SKEWS:
            p = np.arange(1, KEYS + 1, dtype=float) ** -s
            keys = np.random.default_rng([r, int(s * 10)]).choice(KEYS, size=requests, p=p / p.sum())
            bodies = [{"k": int(k)} for k in keys]
            entry = {}
            for mode in rotated(CACHES, r):  # fresh deployments: the caches start empty
                f = Flow(f"cache-{model_ms:g}ms-{mode}-{r}-{int(s * 10)}", schema={"k": int})
                f.map(model_of(model_ms), names=["y"], cache=specs[mode])
                d = cluster.deploy(f)
                _post_all(d.url, [{"k": -1 - i} for i in range(8)], 4)  # warm: connections, replicas
                t0 = time.perf_counter()
                _post_all(d.url, bodies, 4)
                secs = time.perf_counter() - t0
                looked = {
                    res: _metric(cluster, "flowserve_prediction_cache_lookups_total", flow=f.name, result=res)
                    for res in ("hit", "shared_hit", "miss")
                }
                total = sum(looked.values())
                entry[mode] = {
                    "req_per_s": requests / secs,
                    "hit_rate": (looked["hit"] + looked["shared_hit"]) / total if total else 0.0,
                    "shared_hit_rate": looked["shared_hit"] / total if total else 0.0,
                }
                d.undeploy()
            rows[s].append(entry)
            progress(
                f"cache ({model_ms:g} ms model) round {r + 1} s={s}: "
                + ", ".join(f"{m} {entry[m]['req_per_s']:.0f} req/s hit {entry[m]['hit_rate']:.2f}" for m in CACHES)
            )
    summary = {}
    keys = ("req_per_s", "hit_rate", "shared_hit_rate")
    for s in SKEWS:
        summary[str(s)] = {mode: {k: float(np.median([e[mode][k] for e in rows[s]])) for k in keys} for mode in CACHES}
        # the speedup of each round (both sides measured within it), then the median
        for mode in ("cache", "shared"):
            summary[str(s)][f"speedup_{mode}"] = float(
                np.median([e[mode]["req_per_s"] / e["none"]["req_per_s"] for e in rows[s]])
            )
    return {
        "model_ms": model_ms,
        "skews": list(SKEWS),
        "keys": KEYS,
        "cache_size_per_replica": 100,
        "summary": summary,
        "rounds": {str(s): rows[s] for s in SKEWS},
    }


def exp_deadline(cluster, rounds: int, requests: int) -> dict:
    from flow import Flow

    flows = {}
    for mode, dl in (("wait_all", None), ("deadline_25ms", 25)):
        f = Flow(f"ens-{mode}", schema={"seed": int, "label": int, "slow": int})
        m = [f.map(member(j), names=["y"]) for j in range(3)]
        m[0].ensemble(m[1], m[2], fn=vote, names=["y"], deadline_ms=dl)
        flows[mode] = cluster.deploy(f)
    res = {mode: [] for mode in flows}
    for r in range(rounds):
        rng = np.random.default_rng(100 + r)
        bodies = [
            {"seed": int(r * 100000 + i), "label": int(rng.integers(10)), "slow": int(rng.integers(3))}
            if rng.random() < 0.3
            else {"seed": int(r * 100000 + i), "label": int(rng.integers(10)), "slow": -1}
            for i in range(requests)
        ]
        for mode in rotated(flows, r):
            d = flows[mode]
            got = _post_all(d.url, bodies, 4)
            ms = [g[0] for g in got]
            acc = np.mean([g[1][0]["y"] == b["label"] for g, b in zip(got, bodies)])
            part = np.mean([g[1][0]["missing"] != "" for g in got])
            res[mode].append({"p50_ms": _p(ms, 50), "p99_ms": _p(ms, 99), "accuracy": float(acc), "partial": part})
            progress(
                f"deadline round {r + 1} {mode}: p50 {_p(ms, 50):.1f} ms p99 {_p(ms, 99):.1f} ms "
                f"accuracy {acc:.3f} answered partially {part:.2f}"
            )
    for d in flows.values():
        d.undeploy()
    return {
        "members": 3,
        "member_accuracy": 0.75,
        "slow_probability": 0.3,
        "slow_ms": 150,
        "summary": {m: {k: float(np.median([e[k] for e in v])) for k in v[0]} for m, v in res.items()},
    }


def exp_hedging(cluster, rounds: int, requests: int) -> dict:
    from flow import Flow
    from optimizer import OptimizerOptions

    deps = {}
    for mode in HEDGES:
        f = Flow(f"hedge-{mode}", schema={"x": int})
        if mode == "race3":
            f.map(GammaSleep, names=["x"], high_variance=True)
        else:
            f.map(GammaSleep, names=["x"], hedge=None if mode == "none" else mode)
        deps[mode] = cluster.deploy(f, options=OptimizerOptions(competitive_replicas=3))
        _post_all(deps[mode].url, [{"x": 0}] * 60, 2)  # warm: the hedge learns its percentile
    res = {m: [] for m in HEDGES}
    for r in range(rounds):
        for mode in rotated(HEDGES, r):
            d = deps[mode]
            before = _metric(cluster, "flowserve_hedges_total", flow=d.name, outcome="sent")
            got = _post_all(d.url, [{"x": i} for i in range(requests)], 2)
            sent = _metric(cluster, "flowserve_hedges_total", flow=d.name, outcome="sent") - before
            ms = [g[0] for g in got]
            extra = 2.0 if mode == "race3" else sent / requests
            res[mode].append({"p50_ms": _p(ms, 50), "p99_ms": _p(ms, 99), "extra_runs_per_request": extra})
            progress(
                f"hedging round {r + 1} {mode:5s}: p50 {_p(ms, 50):.1f} ms p99 {_p(ms, 99):.1f} ms extra {extra:.2f}"
            )
    for d in deps.values():
        d.undeploy()
    return {
        "gamma": {"shape": 0.5, "scale_ms": 10.0},
        "summary": {m: {k: float(np.median([e[k] for e in v])) for k in v[0]} for m, v in res.items()},
    }


def digits_predictions():
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.tree import DecisionTreeClassifier

    X, y = load_digits(return_X_y=True)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.5, random_state=0)
    models = [
        LogisticRegression(max_iter=2000),
        KNeighborsClassifier(3),
        GaussianNB(),
        DecisionTreeClassifier(max_depth=6, random_state=0),
    ]
    for m in models:
        m.fit(Xtr, ytr)
    preds = np.asarray([m.predict(Xte) for m in models])
    probs = np.asarray([m.predict_proba(Xte) for m in models])  # every model was fit on all 10 classes
    return preds, probs, yte, [type(m).__name__ for m in models]


def exp_selection(cluster, queries: int) -> dict:
    from flow import Flow

    preds, probs, labels, names = digits_predictions()
    n = min(queries, len(labels))
    acc0 = (preds[:, :n] == labels[:n]).mean(axis=1)
    best = int(np.argmax(acc0))
    drift_at = n // 2
    fns = make_models(preds, drift_at, best)
    prob_fns = make_prob_models(probs, drift_at, best)
    realized = np.asarray([[fns[j](_Row(i)) == labels[i] for i in range(n)] for j in range(len(fns))], dtype=float)
    realized_p = np.asarray(
        [[int(np.argmax(prob_fns[j](_Row(i)))) == labels[i] for i in range(n)] for j in range(len(fns))], dtype=float
    )
    out = {"models": names, "queries": n, "drift_at": drift_at, "drifting_model": names[best]}
    for policy in ("exp3", "exp4", "exp4_mean"):
        f = Flow(f"select-{policy}", schema={"i": int})
        f.select(
            prob_fns if policy == "exp4_mean" else fns,
            names=["y"],
            policy=policy[:4],
            seed=1,
            eta=0.3 if policy == "exp3" else 0.5,
            explore=0.05,
        )
        d = cluster.deploy(f)
        correct = []
        import httpx

        with httpx.Client(timeout=30) as http:
            for i in range(n):
                r = http.post(d.url, json={"i": i})
                y = r.json()["rows"][0]["y"]
                y = int(np.argmax(y)) if policy == "exp4_mean" else y
                q = int(r.headers["x-qid-start"])
                ok = float(y == labels[i])
                correct.append(ok)
                fb = {"qid": q, "reward": ok} if policy == "exp3" else {"qid": q, "label": int(labels[i])}
                http.post(f"{d.url}/feedback", json=fb)
        d.undeploy()
        correct = np.asarray(correct)
        best_fixed = (realized_p if policy == "exp4_mean" else realized).sum(axis=1).max()
        out[policy] = {
            "accuracy": float(correct.mean()),
            "cumulative_correct": np.cumsum(correct).tolist(),
            "regret_vs_best_fixed": float(best_fixed - correct.sum()),
            "best_fixed_accuracy": float(best_fixed / n),
            "error": float(1 - correct.mean()),
            "best_single_error": float(1 - best_fixed / n),
        }
        progress(
            f"selection {policy}: accuracy {correct.mean():.3f}; best fixed model {best_fixed / n:.3f}; "
            f"regret {best_fixed - correct.sum():.0f} of {n}"
        )
    out["model_accuracy"] = dict(zip(names, realized.mean(axis=1).tolist()))
    out["model_cumulative"] = {nm: np.cumsum(realized[j]).tolist() for j, nm in enumerate(names)}
    return out


class _Row:
    def __init__(self, i):
        self.i = i


def run(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks clipper", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=200, help="requests per configuration and round")
    p.add_argument("--queries", type=int, default=898, help="selection: digits test queries (898 at most)")
    p.add_argument("--quick", action="store_true", help="1 round of 100 requests, 400 selection queries")
    p.add_argument("--only", default="cache,deadline,hedging,selection", help="a subset updates only its sections")
    p.add_argument("--cache-model-ms", default="2", help="cache: the model's cost per row, ms (several: 2,20)")
    args = p.parse_args(argv)
    os.environ.setdefault("FLOWSERVE_QUIET", "1")
    if args.quick:
        args.rounds, args.requests, args.queries = 1, 100, 400
    from executors import ClusterConfig, LocalCluster

    only = args.only.split(",")
    out = {"rounds": args.rounds, "requests": args.requests, "executors": 3, "threads": 4}
    model_ms = [float(x) for x in args.cache_model_ms.split(",")]
    cache_keys = ["cache" if ms == 2 else f"cache_{ms:g}ms" for ms in model_ms]
    written = [k for k in only if k != "cache"] + (cache_keys if "cache" in only else [])
    previous = RESULTS / "clipper.json"
    if previous.exists():
        # the sections this run does not measure are kept from the last run (and named)
        kept = json.loads(previous.read_text())
        kept = {k: v for k, v in kept.items() if k in SECTIONS or k.startswith("cache_")}
        kept = {k: v for k, v in kept.items() if k not in written}
        if kept:
            out["kept_from_previous_run"] = sorted(kept)
            out.update(kept)
    with LocalCluster(ClusterConfig(executors=3, threads=4, request_timeout_s=30)) as cluster:
        if "cache" in only:
            for ms, key in zip(model_ms, cache_keys):
                out[key] = exp_cache(cluster, args.rounds, args.requests, ms)
        if "deadline" in only:
            out["deadline"] = exp_deadline(cluster, args.rounds, args.requests)
        if "hedging" in only:
            out["hedging"] = exp_hedging(cluster, args.rounds, args.requests)
        if "selection" in only:
            out["selection"] = exp_selection(cluster, args.queries)
    save("clipper", out)
    _plot(out)
    return out


def _plot_cache(ax, section: dict) -> None:
    c = section["summary"]
    x = np.arange(len(c))
    labels = {"none": "no cache", "cache": "cache (100/replica)", "shared": "shared through the KVS"}
    for j, mode in enumerate(CACHES):
        at = x + (j - 1) * 0.27
        ax.bar(at, [v[mode]["req_per_s"] for v in c.values()], 0.27, label=labels[mode])
        if mode != "none":
            for i, v in enumerate(c.values()):
                ax.annotate(f"{v[mode]['hit_rate']:.0%}", (at[i], v[mode]["req_per_s"]), ha="center", fontsize=7)
    ax.set_xticks(x, [f"Zipf s={s}" for s in c])
    ax.set_ylabel("req/s (c=4)")
    ax.set_title(f"prediction cache, {section.get('model_ms', 2):g} ms model (hit rates)")
    ax.legend(fontsize=7)


def _plot(out: dict) -> None:
    pyplot = plt()
    caches = [k for k in out if k == "cache" or (k.startswith("cache_") and k.endswith("ms"))]
    n = len(caches) + 3
    fig, axes = pyplot.subplots(1, n, figsize=(5 * n, 4))
    for i, key in enumerate(caches):
        _plot_cache(axes[i], out[key])
    ax = [None] + list(axes[len(caches) :])  # ax[1..3]: deadline, hedging, selection
    if "deadline" in out:
        d = out["deadline"]["summary"]
        ax[1].bar(list(d), [v["p99_ms"] for v in d.values()], color=["gray", "tab:green"])
        for i, v in enumerate(d.values()):
            ax[1].annotate(f"acc {v['accuracy']:.3f}", (i, v["p99_ms"]), ha="center")
        ax[1].set_ylabel("p99 ms")
        ax[1].set_title("ensemble: deadline answers")
    if "hedging" in out:
        h = out["hedging"]["summary"]
        x = np.arange(len(h))
        ax[2].bar(x - 0.2, [v["p50_ms"] for v in h.values()], 0.4, label="p50")
        ax[2].bar(x + 0.2, [v["p99_ms"] for v in h.values()], 0.4, label="p99")
        for i, v in enumerate(h.values()):
            ax[2].annotate(f"+{v['extra_runs_per_request']:.0%} runs", (i, v["p99_ms"]), ha="center")
        ax[2].set_xticks(x, list(h))
        ax[2].set_ylabel("ms")
        ax[2].set_title("Gamma(0.5, 10 ms) stage: hedging vs racing")
        ax[2].legend()
    if "selection" in out:
        s = out["selection"]
        for nm, cum in s["model_cumulative"].items():
            ax[3].plot(cum, lw=0.8, ls="--", label=nm)
        for pol in ("exp3", "exp4", "exp4_mean"):
            if pol in s:
                ax[3].plot(s[pol]["cumulative_correct"], lw=2, label=pol)
        ax[3].axvline(s["drift_at"], color="k", lw=0.5)
        ax[3].set_xlabel("query")
        ax[3].set_ylabel("cumulative correct")
        ax[3].set_title("selection on digits (drift at the line)")
        ax[3].legend(fontsize=7)
    save_plot(fig, "clipper")
