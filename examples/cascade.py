"""Cascade: the small model answers first; only the rows it is unsure of go to the big model.

    python examples/cascade.py             # embedded local cluster, HTTP, cleans up

With `flowserve up` running it uses that cluster instead: under a flow name of its own,
undeploying only that, and never stopping the cluster (examples/sharing.py).

The flow: preprocess -> SmallNet -> filter(conf < THRESHOLD) -> BigNet on those rows ->
left join with the small model's answers (rows the big model never saw keep missing
values there) -> pick the big model's answer where there is one.

Deployable with the CLI too (`flowserve up`, then `flowserve deploy examples/cascade.py`):
``setup(store)`` puts what the flow reads into the store, ``flows()`` builds the flow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `models` when run as a script

from models import BigNet, SmallNet, digits_28, ensure_models, preprocess_batch, small_mode  # noqa: E402
from sharing import own_name  # noqa: E402

import flowserve as fs  # noqa: E402

THRESHOLD = 0.9  # the small model's answer is kept when its confidence is at least this


def preprocess(table):
    return preprocess_batch(table["img"])


def unsure(row) -> bool:
    return row.conf < THRESHOLD


def pick(row):
    """The big model's answer where it ran (the left join leaves None elsewhere)."""
    if row.cls_right is None:
        return row.cls, row.conf, "small"
    return row.cls_right, row.conf_right, "big"


def setup(store) -> None:
    """Train (once: cached on disk) and store the two models the flow reads, unless the store has them."""
    ensure_models(store, names=("small", "big"))


def flows(name: str = "cascade") -> fs.Flow:
    flow = fs.Flow(name, schema={"img": fs.ColumnType.tensor(np.uint8, (28, 28))})
    img = flow.map(preprocess, names=["img"], batching=True)
    fast = img.map(SmallNet, names=["cls", "conf"], batching=True)
    hard = img.join(fast).filter(unsure)  # the image and the small model's answer, unsure rows only
    slow = hard.map(BigNet, names=["cls", "conf"], batching=True)
    fast.join(slow, how="left").map(pick, names=["cls", "conf", "model"])
    return flow


def main(n: int | None = None) -> float:
    n = n or (40 if small_mode() else 200)
    cluster = fs.default_cluster()
    d = None
    try:
        setup(cluster.kvs)
        flow = flows(own_name(cluster, "cascade"))
        images, labels = digits_28()
        test_x, test_y = images[-n:], labels[-n:]
        d = flow.deploy(cluster)
        print(d.explain())
        with httpx.Client(timeout=60) as http:
            rows = http.post(d.url, json=[{"img": x.tolist()} for x in test_x]).raise_for_status().json()["rows"]
        rows.sort(key=lambda r: r["qid"])  # the rows of one request, in request order

        local = flow.run([{"img": x} for x in test_x], kvs=cluster.kvs)
        assert [r["cls"] for r in rows] == local["cls"].tolist(), "deployed and in-process answers differ"
        assert [r["model"] for r in rows] == local["model"].tolist(), "deployed and in-process routing differ"
        assert np.allclose([r["conf"] for r in rows], local["conf"], atol=1e-5)

        predicted = np.asarray([r["cls"] for r in rows])
        escalated = np.asarray([r["model"] == "big" for r in rows])
        for r, y in list(zip(rows, test_y))[:8]:
            print(f"qid {r['qid']:3d}: {r['model']:5s} model says {r['cls']} (confidence {r['conf']:.2f}), true {y}")
        accuracy = float(np.mean(predicted == test_y))
        print(
            f"{escalated.sum()} of {n} rows had small-model confidence below {THRESHOLD} and went to the big "
            f"model; accuracy there {np.mean(predicted[escalated] == test_y[escalated]):.0%}"
            if escalated.any()
            else f"no row had small-model confidence below {THRESHOLD}"
        )
        print(
            f"cascade accuracy on {n} held-out digits over HTTP: {accuracy:.0%} (same answers as flow.run in-process)"
        )
        return accuracy
    finally:
        if d is not None:
            d.undeploy()
        cluster.release()  # stops the cluster only if this run started it


if __name__ == "__main__":
    main()
