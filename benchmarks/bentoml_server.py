"""The same pipelines on BentoML 1.4: one service with a route per flow, computing
in-process (its documented single-service pattern). Run with a Python that has bentoml
and torch (requirements-peers.txt), from the repository root:

    /path/to/bentoml-venv/bin/bentoml serve benchmarks.bentoml_server:Pipelines --port 8004
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bentoml  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.pipelines import CASCADE_THRESHOLD, MLP, pick, preprocess  # noqa: E402


@bentoml.service(workers=1)
class Pipelines:
    def __init__(self):
        self.small, self.big = MLP("small"), MLP("big")

    @bentoml.api(route="/flows/ensemble")
    def ensemble(self, img: list) -> dict:
        x = preprocess(np.asarray([img], dtype=np.uint8))
        a, b = self.small(x), self.big(x)
        c, p = pick(a[0][0].item(), a[1][0].item(), b[0][0].item(), b[1][0].item())
        return {"rows": [{"cls": c, "conf": p}]}

    @bentoml.api(route="/flows/cascade")
    def cascade(self, img: list) -> dict:
        x = preprocess(np.asarray([img], dtype=np.uint8))
        cls, conf = self.small(x)
        c, p = cls[0].item(), conf[0].item()
        if p < CASCADE_THRESHOLD:
            c2, p2 = self.big(x)
            c, p = pick(c, p, c2[0].item(), p2[0].item())
        return {"rows": [{"cls": c, "conf": p}]}
