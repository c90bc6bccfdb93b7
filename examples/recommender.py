"""Recommender: per-row lookups of a user's vector and a category's products, then top 5.

    python examples/recommender.py         # embedded local cluster, HTTP, cleans up

With `flowserve up` running it uses that cluster instead: under a flow name of its own,
undeploying only that, and never stopping the cluster (examples/sharing.py).

The example generates its data and loads it into the cluster's KVS:

- ``user:{id}``          -> the user's taste vector, float32 (DIM,)
- ``category:{c}``       -> the category's product matrix, float32 (N_PRODUCTS, DIM)
- ``category:{c}:ids``   -> the products' ids, int64 (N_PRODUCTS,)

A request row is ``{"user": 17, "category": "books"}``. The flow makes the keys, then
``lookup(column="user_key")`` reads each row's own user vector and
``lookup(column="category_key")`` its category's matrix (a different key per row); the
optimizer makes each per-row lookup a continuation, so rows are routed by their key to
the executor that caches it instead of the value being shipped to the rows. The last
stage scores every product of the category by dot product and keeps the best five (a
tensor column of 5 ids and one of 5 scores).

Deployable with the CLI too (`flowserve up`, then `flowserve deploy examples/recommender.py`):
``setup(store)`` puts what the flow reads into the store, ``flows()`` builds the flow.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `models` when run as a script

from models import small_mode  # noqa: E402
from sharing import own_name  # noqa: E402

import flowserve as fs  # noqa: E402

DIM = 32
N_PRODUCTS = 2000
CATEGORIES = ("books", "music", "games", "garden", "toys")
TOP = 5


def make_data(n_users: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The KVS contents: user vectors, product matrices and product ids."""
    rng = np.random.default_rng(seed)
    data = {f"user:{u}": rng.standard_normal(DIM).astype(np.float32) for u in range(n_users)}
    for c, name in enumerate(CATEGORIES):
        data[f"category:{name}"] = rng.standard_normal((N_PRODUCTS, DIM)).astype(np.float32)
        data[f"category:{name}:ids"] = np.arange(N_PRODUCTS, dtype=np.int64) + 100_000 * (c + 1)
    return data


def keys(row):
    return row.user, row.category, f"user:{row.user}", f"category:{row.category}", f"category:{row.category}:ids"


def top5(row):
    """The five products of the row's category with the highest dot product with the user."""
    scores = row.products @ row.user_vec
    best = np.argsort(-scores, kind="stable")[:TOP]
    return row.user, row.category, row.user_key, row.product_ids[best], scores[best], os.getpid()


def setup(store) -> None:
    """Generate the users' vectors and the categories' products and put them in the store."""
    store.mput(make_data(200 if small_mode() else 2000))


def flows(name: str = "recommender") -> fs.Flow:
    flow = fs.Flow(name, schema={"user": int, "category": str})
    k = flow.map(keys, names=["user", "category", "user_key", "category_key", "ids_key"])
    users = k.lookup(column="user_key", name="user_vec")
    products = users.lookup(column="category_key", name="products")
    ids = products.lookup(column="ids_key", name="product_ids")
    ids.map(top5, names=["user", "category", "user_key", "top_ids", "top_scores", "served_by"])
    return flow


def main(n: int | None = None) -> None:
    n_users = 200 if small_mode() else 2000
    n = n or (40 if small_mode() else 400)
    cluster = fs.default_cluster()
    d = None
    try:
        data = make_data(n_users)
        cluster.kvs.mput(data)
        rng = np.random.default_rng(1)
        requests = [
            {"user": int(u), "category": CATEGORIES[int(c)]}
            for u, c in zip(rng.integers(0, n_users, n), rng.integers(0, len(CATEGORIES), n))
        ]

        flow = flows(own_name(cluster, "recommender"))
        d = flow.deploy(cluster)
        print(d.explain())
        out = d.invoke(requests)  # Arrow over HTTP both ways
        # continuation stages run per key group, so rows may come back in another order
        out = out.take(np.argsort(out.qid, kind="stable"))

        local = flow.run(requests, kvs=cluster.kvs)
        assert out["user"].tolist() == local["user"].tolist(), "deployed rows differ from flow.run's"
        assert np.array_equal(out["top_ids"], local["top_ids"]), "deployed and in-process top 5 differ"
        assert np.allclose(out["top_scores"], local["top_scores"])
        for r, req in zip(out, requests):  # and against numpy on the generated data
            scores = data[f"category:{req['category']}"] @ data[f"user:{req['user']}"]
            want = data[f"category:{req['category']}:ids"][np.argsort(-scores, kind="stable")[:TOP]]
            assert np.array_equal(r.top_ids, want), f"qid {r.qid}: {r.top_ids} != {want}"

        print(f"{'qid':>4} {'user key':10} {'category key':16} {'top 5 product ids':38} {'best score':>10} executor")
        for r in list(out)[:10]:
            print(
                f"{r.qid:4d} {r.user_key:10} {'category:' + r.category:16} {str(r.top_ids.tolist()):38} "
                f"{r.top_scores[0]:10.2f} pid {r.served_by}"
            )
        served = {}
        for r in out:
            served.setdefault(r.category, set()).add(r.served_by)
        print(
            f"{n} rows read {len(set(out['user_key'].tolist()))} different user keys and "
            f"{len(set(out['category'].tolist()))} category keys; rows were routed by key, e.g. the last stage "
            f"ran each category on one executor: "
            + ", ".join(
                f"{c} -> pid {sorted(p)[0]}" if len(p) == 1 else f"{c} -> pids {sorted(p)}"
                for c, p in sorted(served.items())
            )
        )
        print(f"recommended top {TOP} products for {n} requests over HTTP (same as flow.run in-process)")
    finally:
        if d is not None:
            d.undeploy()
        cluster.release()  # stops the cluster only if this run started it


if __name__ == "__main__":
    main()
