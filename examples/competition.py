"""Competition: three models race on every query; the first confident answer wins.

    python examples/competition.py         # embedded local cluster, HTTP, cleans up

With `flowserve up` running it uses that cluster instead: under a flow name of its own,
undeploying only that, and never stopping the cluster (examples/sharing.py).

``img.anyof(small, medium, big, valid=...)`` (the seed's ``map_compete``) runs the three
models on the same rows. Deployed, they race on different replicas and, per row, the first
valid answer to arrive moves on; locally (``flow.run``) the first valid one in argument
order is taken. An answer is valid when its confidence is at least THRESHOLD; the big
model's answer is always accepted, so every query gets one (Clipper's default answer).
A format map then turns the winner into a readable answer.

Deployable with the CLI too (`flowserve up`, then `flowserve deploy examples/competition.py`):
``setup(store)`` puts what the flow reads into the store, ``flows()`` builds the flow.
"""

from __future__ import annotations

import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `models` when run as a script

from models import BigNet, MediumNet, SmallNet, digits_28, ensure_models, preprocess_batch, small_mode  # noqa: E402
from sharing import own_name  # noqa: E402

import flowserve as fs  # noqa: E402

THRESHOLD = 0.9


def preprocess(img):
    return preprocess_batch(img)


class Named:
    """A model that also says which model it is, so the answer names its source."""

    def __call__(self, table):
        cls, conf = super().__call__(table)
        return cls, conf, [self.name] * len(cls)


class Small(Named, SmallNet):
    pass


class Medium(Named, MediumNet):
    pass


class Big(Named, BigNet):
    pass


def confident(row) -> bool:
    return row.conf >= THRESHOLD or row.model == "big"


def answer(row):
    return row.cls, row.conf, row.model, f"{row.cls} ({row.conf:.0%} sure, {row.model} model)"


def setup(store) -> None:
    """Train (once: cached on disk) and store the three models the flow races, unless the store has them."""
    ensure_models(store, names=("small", "medium", "big"))


def flows(name: str = "competition") -> fs.Flow:
    flow = fs.Flow(name, schema={"img": fs.ColumnType.tensor(np.uint8, (28, 28))})
    img = flow.map(preprocess, names=["img"], col="img")  # per row: cheap; the models batch
    best = img.anyof(Small, Medium, Big, names=["cls", "conf", "model"], valid=confident, batching=True)
    best.map(answer, names=["cls", "conf", "model", "answer"])
    return flow


def each_model(images, store) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every model's (cls, conf) on ``images``, computed in-process (to check the race)."""
    out = {}
    for model in (Small, Medium, Big):
        f = fs.Flow(f"reference-{model.name}", schema={"img": fs.ColumnType.tensor(np.uint8, (28, 28))})
        f.map(preprocess, names=["img"], col="img").map(model, names=["cls", "conf", "model"], batching=True)
        t = f.run([{"img": x} for x in images], kvs=store)
        out[model.name] = (t["cls"], t["conf"])
    return out


def main(n: int | None = None) -> Counter:
    n = n or (30 if small_mode() else 200)
    cluster = fs.default_cluster()
    d = None
    try:
        setup(cluster.kvs)
        flow = flows(own_name(cluster, "competition"))
        images, labels = digits_28()
        test_x, test_y = images[-n:], labels[-n:]
        d = flow.deploy(cluster)
        print(d.explain())

        # one query per request, several in flight: each races the three models on its own
        with httpx.Client(timeout=60) as http, ThreadPoolExecutor(4) as pool:

            def ask(x):
                return http.post(d.url, json={"img": x.tolist()}).raise_for_status().json()["rows"][0]

            rows = list(pool.map(ask, test_x))

        # every deployed answer is valid and is exactly what the model it names answers
        ref = each_model(test_x, cluster.kvs)
        for i, r in enumerate(rows):
            cls, conf = ref[r["model"]][0][i], ref[r["model"]][1][i]
            assert r["cls"] == cls and abs(r["conf"] - conf) < 1e-5, f"row {i}: {r} is not {r['model']}'s answer"
            assert r["conf"] >= THRESHOLD or r["model"] == "big", f"row {i}: invalid answer won: {r}"
        local = flow.run([{"img": x} for x in test_x], kvs=cluster.kvs)
        same = sum(r["model"] == m for r, m in zip(rows, local["model"].tolist()))

        for i, (r, y) in enumerate(list(zip(rows, test_y))[:8]):
            print(f"digit {i} (qid {r['qid']}): {r['answer']}, true {y}")
        winners = Counter(r["model"] for r in rows)
        accuracy = float(np.mean([r["cls"] == y for r, y in zip(rows, test_y)]))
        print(
            f"answers by model: {dict(sorted(winners.items()))}; {same} of {n} rows won by the same model as "
            f"flow.run's first-valid-in-argument-order (the rest: another valid answer arrived first)"
        )
        print(f"competition accuracy on {n} held-out digits over HTTP: {accuracy:.0%}")
        return winners
    finally:
        if d is not None:
            d.undeploy()
        cluster.release()  # stops the cluster only if this run started it


if __name__ == "__main__":
    main()
