"""explain() against stored text: the seed's ensemble, cascade and competition flows, and a
recommender with per-row lookups (continuations).

The files in tests/optimizer/explain/ were written by running these flows and then read
and checked by hand against the rules' documentation; if a change to the optimizer changes
them on purpose, rerun with FLOWSERVE_UPDATE_EXPLAIN=1 and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from optimizer import optimize
from tests.optimizer import examples as ex

HERE = Path(__file__).parent / "explain"
CASES = {
    "ensemble": (ex.ensemble, None),
    "ensemble_unoptimized": (ex.ensemble, []),
    "cascade": (ex.cascade, None),
    "competition": (ex.competition, None),
    "recommender": (ex.recommender, None),
    "recommender_fusion_only": (ex.recommender, ["fusion"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_explain_matches_stored_text(name):
    make, rules = CASES[name]
    text = optimize(make(), rules=rules).explain()
    path = HERE / f"{name}.txt"
    if os.environ.get("FLOWSERVE_UPDATE_EXPLAIN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"explain() of {name} changed; see {path}"


@pytest.mark.parametrize("name", list(CASES))
def test_explain_is_deterministic_and_free_of_ids(name):
    make, rules = CASES[name]
    a, b = optimize(make(), rules=rules).explain(), optimize(make(), rules=rules).explain()
    assert a == b
    assert not re.search(r"0x[0-9a-f]+|<lambda>|<function|object at", a)
