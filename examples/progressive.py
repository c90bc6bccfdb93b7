"""A progressive cascade: the small model answers at once, the big one refines the rows the
small one is unsure of, in one stream.

    python examples/progressive.py         # embedded local cluster, HTTP, cleans up

``first_then(SmallNet, BigNet, when=unsure)`` means, per row, the big model's answer where
the small model's confidence is under THRESHOLD, else the small model's (what ``flow.run``
and a plain POST answer). Asked for a stream (``Accept: application/x-ndjson``), the
gateway sends each row's small-model answer as soon as it is computed, marked ``"final":
false`` when the big model's answer follows and ``"final": true`` when it does not, then
the big model's answer (``"final": true``): 2 events per unsure row, 1 per sure row. The
cascade in examples/cascade.py computes the same final answers with a filter and a join.

Deployable with the CLI too (`flowserve up`, then `flowserve deploy examples/progressive.py`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `models` when run as a script

from models import BigNet, SmallNet, digits_28, ensure_models, preprocess_batch, small_mode  # noqa: E402
from sharing import own_name  # noqa: E402

import flowserve as fs  # noqa: E402

THRESHOLD = 0.9  # the small model's answer is final when its confidence is at least this


def preprocess(table):
    return preprocess_batch(table["img"])


def unsure(row) -> bool:
    return row.conf < THRESHOLD


def setup(store) -> None:
    """Train (once: cached on disk) and store the two models the flow reads, unless the store has them."""
    ensure_models(store, names=("small", "big"))


def flows(name: str = "progressive") -> fs.Flow:
    flow = fs.Flow(name, schema={"img": fs.ColumnType.tensor(np.uint8, (28, 28))})
    img = flow.map(preprocess, names=["img"], batching=True)
    img.first_then(SmallNet, BigNet, names=["cls", "conf"], when=unsure, batching=True)
    return flow


def main(n: int | None = None) -> dict:
    n = n or (20 if small_mode() else 100)
    cluster = fs.default_cluster()
    d = None
    try:
        setup(cluster.kvs)
        flow = flows(own_name(cluster, "progressive"))
        images, _labels = digits_28()
        test_x = images[-n:]
        d = flow.deploy(cluster)
        events: dict[int, list[dict]] = {}
        with httpx.Client(timeout=60) as http:
            body = [{"img": x.tolist()} for x in test_x]
            with http.stream("POST", d.url, json=body, headers={"Accept": "application/x-ndjson"}) as r:
                r.raise_for_status()
                start = int(r.headers["x-qid-start"])
                for line in r.iter_lines():
                    event = json.loads(line)
                    if "row" in event:
                        events.setdefault(event["qid"] - start, []).append(event)
                    elif "error" in event:
                        raise RuntimeError(f"the stream failed: {event}")

        local = flow.run([{"img": x} for x in test_x], kvs=cluster.kvs)
        final = [events[i][-1] for i in range(n)]
        assert all(e["final"] for e in final), "each row's last event is its final answer"
        assert [e["row"]["cls"] for e in final] == local["cls"].tolist(), "streamed and in-process answers differ"
        refined = [i for i in range(n) if len(events[i]) == 2]
        sure = [i for i in range(n) if len(events[i]) == 1]
        assert len(refined) + len(sure) == n
        for i in refined[:4]:
            first, last = events[i]
            print(
                f"row {i:3d}: small model says {first['row']['cls']} ({first['row']['conf']:.2f}, final: "
                f"{first['final']}), then the big model {last['row']['cls']} ({last['row']['conf']:.2f})"
            )
        print(
            f"{len(refined)} of {n} rows were refined by the big model (2 events each), {len(sure)} answered "
            f"by the small one alone (1 event); streamed over HTTP, final answers equal to flow.run's"
        )
        return {"refined": len(refined), "sure": len(sure)}
    finally:
        if d is not None:
            d.undeploy()
        cluster.release()  # stops the cluster only if this run started it


if __name__ == "__main__":
    main()
