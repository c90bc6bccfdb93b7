"""The matrix benchmark's floor is fair only if it computes what the flow means: for every
cell, the floor's hand-written run of the user functions gives ``flow.run``'s rows."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
from benchmarks import matrix  # noqa: E402

CELLS = [(p, s, n) for p in matrix.PIPELINES for s in matrix.STYLES for n in matrix.STAGES]


@pytest.mark.parametrize(("pipeline", "style", "stages"), CELLS)
def test_the_floor_answers_what_flow_run_answers(pipeline, style, stages):
    store = matrix.store_data()
    row = matrix.request_row(pipeline)
    want = matrix.build_flow(pipeline, style, stages).run([row], kvs=store).to_pylist()
    got = matrix.FloorPipeline(pipeline, style, stages, store)([row])
    assert len(got) == len(want) == 1
    assert set(got[0]) == set(want[0]) - {"qid"}, (sorted(got[0]), sorted(want[0]))
    for name, value in got[0].items():
        np.testing.assert_allclose(np.asarray(value, dtype=float), np.asarray(want[0][name], dtype=float), rtol=1e-5)
