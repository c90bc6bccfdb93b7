"""A replicated store under a local cluster: its primary killed under load, and what the
writes that wait for a replica cost.

1. Failover. A local cluster points at an external store (``ClusterConfig.kvs_url``): a
   Sentinel set (a primary, one replica, three sentinels) or a Redis Cluster (three
   primaries, one replica each). Closed-loop clients call a flow whose rows each look up
   their own key; a writer ``put``s numbered keys and a deployer redeploys a small flow,
   both retrying what the store refuses. Then the primary holding the lookup data (on the
   Cluster, the one that also holds the deploy registry) is killed with SIGKILL; once the
   sentinels or the cluster promoted its replica, the killed node is started again as a
   replica, as a deployment's supervisor would. Reported: requests answered / failed /
   lost / wrong, how long a client waited for the first answer needing the killed primary
   (the failover as clients see it), when writes and deploys went on, and whether every
   acknowledged ``put`` and deploy is still there after it. On the Cluster half the
   clients ask for keys on the killed primary and half for keys elsewhere.
2. Cost. Sequential ``put``s of 1 KiB with ``WAIT 1`` (``wait_replicas=1``, the default of
   both forms) and without (``wait_replicas=0``), on each store, beside one Redis server;
   the settings take turns, in a shuffled order each round.

    python -m benchmarks store_failover [--clients 4] [--after 8] [--puts 2000]

Writes results/store_failover.json and results/store_failover.png.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import machine, plt, progress, save, save_plot

N_KEYS = 200


def key_of(row):
    return f"emb/{row.i}"


def total(row):
    return float(row.vec.sum())


def one(row):
    return row.x + 1


def failover_run(kind: str, *, clients: int = 4, before_s: float = 2.0, after_s: float = 8.0, tmp: str) -> dict:
    """One failover of ``kind`` ("sentinel" or "cluster") under load; the figures, and the
    events' times (seconds from the start of the load) for a plot."""
    import httpx

    from executors.hosts.cluster import LocalCluster
    from executors.hosts.cluster_config import ClusterConfig
    from executors.plans import DEPLOYED_KEY, load_plan
    from flow import Flow
    from kvs.replicated import ClusterStore, SentinelStore

    Store = SentinelStore if kind == "sentinel" else ClusterStore
    store = Store(dir=Path(tmp) / kind).start()
    cluster = LocalCluster(ClusterConfig(executors=1, kvs_url=store.url, dir=str(Path(tmp) / f"{kind}-cluster")))
    try:
        cluster.start()
        kvs = cluster.kvs
        kvs.mput({f"emb/{i}": np.full(4, i, dtype=np.float32) for i in range(N_KEYS)})
        lookups = Flow("lookups", schema={"i": int})
        lookups.map(key_of, names=["key"]).lookup(column="key", name="vec").map(total, names=["s"])
        d = cluster.deploy(lookups)
        probe = Flow("probe", schema={"x": int})
        probe.map(one, names=["y"])
        cluster.deploy(probe)
        if kind == "cluster":
            victim = store.primary_for(DEPLOYED_KEY)  # lookups, puts and deploys all lose a primary
            on_victim = {i for i in range(N_KEYS) if store.primary_for(f"emb/{i}").port == victim.port}
        else:
            victim = store.primary()
            on_victim = set(range(N_KEYS))

        lock = threading.Lock()
        stop = threading.Event()
        t_start = time.monotonic()
        answers: list[tuple[float, float, int, bool]] = []  # (sent, answered, key, on the victim)
        failed: list[tuple[float, int, str]] = []  # (sent, status, error name)
        lost: list[tuple[float, str]] = []
        wrong: list = []
        acked: dict[str, int] = {}  # key -> value of every acknowledged put
        put_times: list[tuple[float, bool]] = []  # (when, acknowledged)
        deploys: list[tuple[float, bool, str]] = []  # (when, acknowledged, version or error)

        # on a Cluster half the clients ask for keys on the killed primary, half for keys
        # elsewhere: a closed-loop client that asked for both would soon wait on the first
        elsewhere = sorted(set(range(N_KEYS)) - on_victim)
        pools = [sorted(on_victim), elsewhere] if elsewhere else [sorted(on_victim)]

        def client(k: int) -> None:
            rng = random.Random(k)
            pool = pools[k % len(pools)]
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    i = rng.choice(pool)
                    t0 = time.monotonic()
                    try:
                        r = http.post(d.url, json={"i": i})
                    except httpx.TransportError as e:
                        with lock:
                            lost.append((t0, type(e).__name__))
                        continue
                    t1 = time.monotonic()
                    with lock:
                        if r.status_code != 200:
                            failed.append((t0, r.status_code, r.json().get("error", "?")))
                        elif r.json()["rows"][0]["s"] == 4.0 * i:
                            answers.append((t0, t1, i, i in on_victim))
                        else:
                            wrong.append((i, r.text[:200]))

        def writer() -> None:
            from kvs import KVS

            n = 0
            with KVS.from_url(store.url, retry_timeout=1.0) as w:
                while not stop.is_set():
                    key = f"acked/{n % 500}"
                    try:
                        w.put(key, n)
                        with lock:
                            acked[key] = n
                            put_times.append((time.monotonic(), True))
                    except Exception:  # refused (NOREPLICAS) or unreachable: not acknowledged, retried
                        with lock:
                            put_times.append((time.monotonic(), False))
                    n += 1
                    stop.wait(0.01)  # about 100 puts a second: a writer beside the lookups, not a flood

        def deployer() -> None:
            while not stop.is_set():
                try:
                    v = cluster.deploy(probe).version
                    with lock:
                        deploys.append((time.monotonic(), True, str(v)))
                except Exception as e:  # refused or unreachable: not acknowledged, tried again
                    with lock:
                        deploys.append((time.monotonic(), False, type(e).__name__))
                stop.wait(0.25)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        threads += [threading.Thread(target=writer), threading.Thread(target=deployer)]
        for t in threads:
            t.start()
        stop.wait(before_s)  # the load runs before the kill: this is the schedule, not a wait for state
        progress(f"{kind}: kill -9 of the primary on port {victim.port}")
        t_kill = time.monotonic()
        victim.kill()
        if kind == "cluster":
            store.wait_new_primary(DEPLOYED_KEY, victim.port)
        else:
            store.wait_new_primary(victim.port)
        t_promoted = time.monotonic()
        if kind == "cluster":
            victim.start()  # its nodes.conf makes it a replica of the node that replaced it
            store.wait_in_sync()
        else:
            store.rejoin(victim)
            store.wait_replicas_attached(1)
        t_rejoined = time.monotonic()
        stop.wait(after_s)
        stop.set()
        for t in threads:
            t.join(120)

        # every acknowledged write is still there
        values = kvs.mget(list(acked), default=None)
        missing_puts = [k for k, v in zip(acked, values) if v != acked[k]]
        registered = int(kvs.redis.hget(DEPLOYED_KEY, "probe"))
        acked_versions = [int(v) for _, ok, v in deploys if ok]
        deploys_lost = [v for v in acked_versions if v > registered]
        plan_readable = load_plan(kvs, "probe", registered).flow_name == "probe"
        health = httpx.get(f"{cluster.url}/healthz", timeout=30).json()
    finally:
        cluster.stop()
        store.stop()

    def rel(t: float) -> float:
        return round(t - t_start, 3)

    window = [a for a in answers if a[0] >= t_kill]
    victim_after = [a for a in window if a[3]]
    first_victim_answer = min((a[1] for a in victim_after), default=None)
    during = (t_kill, t_rejoined + 1.0)
    in_window = lambda t: during[0] <= t <= during[1]  # noqa: E731
    put_ok_after = [t for t, ok in put_times if ok and t > t_kill]
    deploy_ok_after = [t for t, ok, _ in deploys if ok and t > t_kill]
    return {
        "kind": kind,
        "clients": clients,
        "victim_port": victim.port,
        "keys_on_victim": len(on_victim),
        "promoted_after_s": round(t_promoted - t_kill, 3),
        "replica_back_after_s": round(t_rejoined - t_kill, 3),
        "lookups": {
            "answered": len(answers),
            "failed": len(failed),
            "failed_by_error": {e: sum(1 for *_, x in failed if x == e) for e in sorted({x for *_, x in failed})},
            "lost": len(lost),
            "wrong": len(wrong),
            "during_failover": {
                "answered": sum(1 for a in answers if in_window(a[0])),
                "failed": sum(1 for f in failed if in_window(f[0])),
                "lost": sum(1 for x in lost if in_window(x[0])),
            },
            # a request sent after the kill for a key on the killed primary waits for the failover
            "first_answer_needing_the_killed_primary_s": (
                round(first_victim_answer - t_kill, 3) if first_victim_answer is not None else None
            ),
            # the longest a request waited, of those answered after the kill (some were in flight at it)
            "slowest_answer_after_the_kill_s": round(
                max((a[1] - a[0] for a in answers if a[1] >= t_kill), default=0.0), 3
            ),
            "p50_before_ms": round(1000 * statistics.median([a[1] - a[0] for a in answers if a[1] < t_kill]), 2),
        },
        "puts": {
            "acknowledged": sum(1 for _, ok in put_times if ok),
            "refused": sum(1 for _, ok in put_times if not ok),
            "first_acknowledged_after_the_kill_s": round(min(put_ok_after) - t_kill, 3) if put_ok_after else None,
            "acknowledged_then_lost": len(missing_puts),
        },
        "deploys": {
            "acknowledged": len(acked_versions),
            "refused": sum(1 for _, ok, _ in deploys if not ok),
            "refused_by_error": {
                e: sum(1 for _, ok, x in deploys if not ok and x == e)
                for e in sorted({x for _, ok, x in deploys if not ok})
            },
            "first_acknowledged_after_the_kill_s": (
                round(min(deploy_ok_after) - t_kill, 3) if deploy_ok_after else None
            ),
            "acknowledged_then_lost": len(deploys_lost),
            "registered_plan_readable": plan_readable,
        },
        "gateway_restarts": (health.get("gateway") or {}).get("restarts"),
        "timeline": {
            "kill": rel(t_kill),
            "promoted": rel(t_promoted),
            "replica_back": rel(t_rejoined),
            "answers": [(rel(a[1]), a[3]) for a in answers],
            "puts_acknowledged": [rel(t) for t, ok in put_times if ok],
            "deploys_acknowledged": [rel(t) for t, ok, _ in deploys if ok],
        },
    }


def wait_cost(*, puts: int, tmp: str) -> dict:
    """Sequential 1 KiB puts with and without WAIT 1 on each store, beside one Redis server:
    p50 / p99 in ms. The settings take turns put by put, so noise from the machine's other
    work falls on all of them alike."""
    from kvs import KVS, RedisServer
    from kvs.replicated import ClusterStore, SentinelStore

    value = b"x" * 1024
    server = RedisServer(dir=Path(tmp) / "one").start()
    sentinel = SentinelStore(dir=Path(tmp) / "sentinel-cost").start()
    cluster = ClusterStore(dir=Path(tmp) / "cluster-cost").start()
    urls = {
        ("one server", "no wait"): server.url,
        ("sentinel", "WAIT 1"): sentinel.url,
        ("sentinel", "no wait"): sentinel.url + "?wait_replicas=0",
        ("cluster", "WAIT 1"): cluster.url,
        ("cluster", "no wait"): cluster.url + "?wait_replicas=0",
    }
    clients = {k: KVS.from_url(u) for k, u in urls.items()}
    times: dict = {k: [] for k in urls}
    order = list(clients.items())
    rng = random.Random(0)
    try:
        for i in range(200 + puts):  # the first 200: warming connections and servers
            rng.shuffle(order)  # no setting always first (or last) in a round
            for k, kvs in order:
                t0 = time.perf_counter()
                kvs.put(f"cost/{i % 1000}", value)
                if i >= 200:
                    times[k].append(time.perf_counter() - t0)
    finally:
        for kvs in clients.values():
            kvs.close()
        for s in (server, sentinel, cluster):
            s.stop()
    out: dict = {}
    for (kind, label), ts in times.items():
        ts.sort()
        out.setdefault(kind, {})[label] = {
            "p50_ms": round(1000 * ts[len(ts) // 2], 3),
            "p99_ms": round(1000 * ts[int(len(ts) * 0.99)], 3),
            "mean_ms": round(1000 * statistics.fmean(ts), 3),
        }
    return out


def run(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks store_failover", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--before", type=float, default=2.0, help="seconds of load before the kill")
    p.add_argument("--after", type=float, default=8.0, help="seconds of load after the killed node is back")
    p.add_argument("--puts", type=int, default=2000, help="puts per setting in the cost part")
    args = p.parse_args(argv)
    result: dict = {"failover": {}, "wait_cost": {}}
    with tempfile.TemporaryDirectory(prefix="flowserve-bench-") as tmp:
        for kind in ("sentinel", "cluster"):
            result["failover"][kind] = r = failover_run(
                kind, clients=args.clients, before_s=args.before, after_s=args.after, tmp=tmp
            )
            lk, pu, de = r["lookups"], r["puts"], r["deploys"]
            progress(
                f"{kind}: promoted after {r['promoted_after_s']} s; lookups answered {lk['answered']}, "
                f"failed {lk['failed']}, lost {lk['lost']}, wrong {lk['wrong']}; first answer needing the killed "
                f"primary {lk['first_answer_needing_the_killed_primary_s']} s; puts lost {pu['acknowledged_then_lost']}, "
                f"deploys lost {de['acknowledged_then_lost']}"
            )
        result["wait_cost"] = wait_cost(puts=args.puts, tmp=tmp)
        progress(f"put cost: {result['wait_cost']}")
    save("store_failover", {**result, "machine": machine()})

    pyplot = plt()
    fig, axes = pyplot.subplots(1, 3, figsize=(15, 3.8), gridspec_kw={"width_ratios": [2, 2, 1.3]})
    for ax, kind in zip(axes, ("sentinel", "cluster")):
        tl = result["failover"][kind]["timeline"]
        end = max(t for t, _ in tl["answers"])
        bins = [i * 0.1 for i in range(int(end / 0.1) + 2)]
        ax.hist(
            [[t for t, v in tl["answers"] if v], [t for t, v in tl["answers"] if not v]],
            bins=bins,
            stacked=True,
            color=["tab:red", "tab:blue"],
            label=["key on the killed primary", "key elsewhere"],
        )
        for name, color in (("kill", "black"), ("promoted", "tab:green"), ("replica_back", "tab:purple")):
            ax.axvline(tl[name], color=color, lw=1, label=name.replace("_", " "))
        ax.set_title(f"{kind}: lookups answered per 100 ms")
        ax.set_xlabel("seconds")
        ax.legend(fontsize=7, loc="lower left")
    ax = axes[2]
    labels, p50, p99 = [], [], []
    for kind, by in result["wait_cost"].items():
        for label, v in by.items():
            labels.append(f"{kind}\n{label}")
            p50.append(v["p50_ms"])
            p99.append(v["p99_ms"])
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], p50, 0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], p99, 0.4, label="p99")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("ms per 1 KiB put")
    ax.set_title("what waiting for a replica costs")
    ax.legend(fontsize=7)
    save_plot(fig, "store_failover")
