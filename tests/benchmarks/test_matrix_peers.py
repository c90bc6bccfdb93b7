"""The peers on the matrix are a comparison only if they compute what the floor computes: for
every cell, the code the peer servers call (Ray Serve's per-operator deployments chained, and
the whole cell in one service) gives the floor's rows, on JSON and on Arrow bodies. Runs
without any peer installed."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
from benchmarks import matrix, matrix_peers  # noqa: E402
from benchmarks.pipelines import preprocess  # noqa: E402

CELLS = [(p, s, n) for p in matrix.PIPELINES for s in matrix.STYLES for n in matrix.STAGES]


def _floor_rows(cell, rows):
    """The floor's answer as its HTTP handler writes it (floor_app)."""
    out = matrix.FloorPipeline(*cell, matrix.store_data())(rows)
    return json.loads(json.dumps([{k: matrix._plain(v) for k, v in r.items()} for r in out]))


def _same(got, want):
    assert len(got) == len(want) == 1
    assert got[0].keys() == want[0].keys(), (sorted(got[0]), sorted(want[0]))
    for name, value in want[0].items():
        np.testing.assert_allclose(np.asarray(got[0][name], dtype=float), np.asarray(value, dtype=float), rtol=1e-6)


@pytest.mark.parametrize("kind", matrix.BODIES)
@pytest.mark.parametrize(("pipeline", "style", "stages"), CELLS)
def test_the_peers_code_answers_the_floors_rows(pipeline, style, stages, kind):
    cell = (pipeline, style, stages)
    ctype = matrix.ARROW if kind == "arrow" else matrix.JSON
    rows = matrix._parse(matrix.body(pipeline, kind), ctype)
    want = _floor_rows(cell, rows)
    operators = matrix_peers.operator_chain(*cell)
    assert len(operators) == (3 if stages == 1 else stages)
    chained = json.loads(matrix.answer(matrix_peers.run_chain(pipeline, style, operators, rows)))["rows"]
    _same(chained, want)
    whole = matrix.run_whole(matrix.FloorPipeline(*cell, matrix.store_data()), rows)
    _same(json.loads(matrix.answer(whole))["rows"], want)


def test_an_operator_alone_runs_only_its_own_step():
    """The ensemble's first operator, alone, answers the preprocessed image and nothing else."""
    rows = [matrix.request_row("ensemble")]
    op = matrix_peers.Operator("ensemble", "row", 3, 0)
    (out,) = op(rows)
    assert list(out) == ["x"]
    np.testing.assert_allclose(out["x"], preprocess(np.asarray(rows[0]["img"], dtype=np.uint8)))


def test_cells_travel_to_the_peer_servers_as_text():
    assert matrix_peers.parse_cells(matrix_peers.format_cells(CELLS)) == CELLS
