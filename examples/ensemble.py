"""Ensemble: preprocess, then two models in parallel, then keep the more confident answer.

    python examples/ensemble.py            # embedded local cluster, HTTP, cleans up

With `flowserve up` running it uses that cluster instead: under a flow name of its own,
undeploying only that, and never stopping the cluster (examples/sharing.py).

Deployable with the CLI too (`flowserve up`, then `flowserve deploy examples/ensemble.py`):
``setup(store)`` puts what the flow reads into the store, ``flows()`` builds the flow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `models` when run as a script

from models import BigNet, SmallNet, digits_28, ensure_models, preprocess_batch  # noqa: E402
from sharing import own_name  # noqa: E402

import flowserve as fs  # noqa: E402


def preprocess(table):
    return preprocess_batch(table["img"])


def pick(row):
    """The answer of the more confident model."""
    if row.conf >= row.conf_right:
        return row.cls, row.conf
    return row.cls_right, row.conf_right


def setup(store) -> None:
    """Train (once: cached on disk) and store the two models the flow reads, unless the store has them."""
    ensure_models(store, names=("small", "big"))


def flows(name: str = "ensemble") -> fs.Flow:
    flow = fs.Flow(name, schema={"img": fs.ColumnType.tensor(np.uint8, (28, 28))})
    img = flow.map(preprocess, names=["img"], batching=True)
    small = img.map(SmallNet, names=["cls", "conf"], batching=True)
    big = img.map(BigNet, names=["cls", "conf"], batching=True)
    small.join(big).map(pick, names=["cls", "conf"])
    return flow


def main(n: int = 20) -> float:
    cluster = fs.default_cluster()
    d = None
    try:
        setup(cluster.kvs)
        flow = flows(own_name(cluster, "ensemble"))
        images, labels = digits_28()
        test_x, test_y = images[-n:], labels[-n:]
        d = flow.deploy(cluster)
        print(d.explain())
        with httpx.Client(timeout=30) as http:
            rows = http.post(d.url, json=[{"img": img.tolist()} for img in test_x]).raise_for_status().json()["rows"]
        predicted = [r["cls"] for r in rows]
        local = flow.run([{"img": img} for img in test_x], kvs=cluster.kvs)
        assert predicted == local["cls"].tolist(), "deployed and in-process answers differ"
        accuracy = float(np.mean(np.asarray(predicted) == test_y))
        for r, y in list(zip(rows, test_y))[:5]:
            print(f"qid {r['qid']}: predicted {r['cls']} (confidence {r['conf']:.2f}), true {y}")
        print(f"ensemble accuracy on {n} held-out digits over HTTP: {accuracy:.0%}")
        return accuracy
    finally:
        if d is not None:
            d.undeploy()
        cluster.release()  # stops the cluster only if this run started it


if __name__ == "__main__":
    main()
