"""The two-process floor (benchmarks/relay_server.py) is a floor only if it answers what the
floor answers: over real HTTP, through its relay and worker processes, every matrix cell
(JSON and Arrow bodies) gives the matrix floor's answer, and e2e's two flows the e2e floor's."""

from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("torch")
from benchmarks import matrix  # noqa: E402
from benchmarks.common import wait_http  # noqa: E402


@pytest.fixture(scope="module")
def relay():
    proc, port = matrix.start_two_process_floor()
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def test_every_matrix_cell_answers_through_the_relay_what_the_floor_answers(relay):
    proc, url = relay
    cells = matrix.floor_cells()
    first = next(iter(cells))
    wait_http(f"{url}/flows/{first}", matrix.body(first.split("_")[0], "json"), proc=proc)
    for name, run in cells.items():
        pipeline = name.split("_")[0]
        for kind, ctype in [("json", matrix.JSON), ("arrow", matrix.ARROW)]:
            raw = matrix.body(pipeline, kind)
            got = httpx.post(f"{url}/flows/{name}", content=raw, headers={"content-type": ctype}, timeout=30)
            assert got.status_code == 200, (name, kind, got.text)
            assert got.json() == json.loads(matrix.floor_answer(run, raw, ctype)), (name, kind)
    assert httpx.post(f"{url}/flows/nowhere", content=b"{}", timeout=30).status_code == 404


def test_e2es_flows_answer_through_the_relay_what_the_e2e_floor_answers():
    import subprocess
    import sys

    from benchmarks import floor_server
    from benchmarks.common import ROOT, free_port
    from benchmarks.pipelines import sample_image

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "relay_server.py"), "--port", str(port)], cwd=ROOT
    )
    try:
        raw = json.dumps({"img": sample_image().tolist()}).encode()
        for flow, answer in [("ensemble", floor_server.ensemble_answer), ("cascade", floor_server.cascade_answer)]:
            url = f"http://127.0.0.1:{port}/flows/{flow}"
            wait_http(url, raw, proc=proc)
            got = httpx.post(url, content=raw, headers={"content-type": matrix.JSON}, timeout=30)
            assert got.status_code == 200 and got.json() == json.loads(answer(raw)), (flow, got.text)
    finally:
        proc.terminate()
        proc.wait(30)
