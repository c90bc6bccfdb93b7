"""Deployed flows answer like flow.run: generated flows (tests/flowgen.py) on a real
local cluster, one HTTP request each, optimized and not.

A deployed ``anyof`` takes the first valid answer to *arrive* (that is the point of
racing), while ``flow.run`` takes the first valid in argument order; both are right, but
only the second can be compared row for row. Flows with an ``anyof`` are therefore
deployed without the competition rule (the alternatives then run in one stage, in
argument order); racing alternatives are tested in test_runtime_paths.py. Everything else
keeps flow.run's row order, so rows are compared in order.

Racing stages feeding key-routed lookups get flows of their own, run after one executor's
cache was warmed with a lookup key that the other executor owns: each racing copy then
sees another cache, which must not change how the copies split their rows.
"""

from __future__ import annotations

import pytest

from flow.errors import FlowError, OperatorError
from optimizer import DEFAULT_RULES
from tests.executors.caches import CacheWarmer
from tests.executors.conftest import unique
from tests.flowgen import KEYS, assert_same_rows, random_case

N_FLOWS = 60
N_RACING = 24
WARM_CALLS = 12  # a stage is measured quick (hosting.CHEAP_MS) after ~8 quick runs


def _rename(flow, name):
    flow.name = name  # flows share one cluster: give each its own name
    return flow


@pytest.mark.parametrize("optimize", [True, False], ids=["optimized", "unoptimized"])
def test_deployed_flows_match_flow_run(cluster, optimize):
    checked = errors = 0
    for seed in range(N_FLOWS // 2 if optimize is False else N_FLOWS):
        case = random_case(1000 + seed, same_anyof=True)
        flow = _rename(case.flow, unique(f"gen{seed}"))
        cluster.kvs.mput(case.store)
        try:
            rules = None
            if optimize and any(f.startswith("anyof") for f in case.features):
                rules = [r for r in DEFAULT_RULES if r != "competition"]
            d = cluster.deploy(flow, optimize=optimize, rules=rules)
            try:
                answer = d.call(case.table)
            except FlowError as e:
                # the reference run on the same qids must fail the same way
                with pytest.raises(OperatorError):
                    flow.run(case.table.with_qid(_gateway_qids(d, case)), kvs=case.store)
                assert e.status in (422, 500), e
                errors += 1
                continue
            expected = flow.run(case.table.with_qid(answer.input_qids), kvs=case.store)
            assert_same_rows(
                answer.table, expected, f"seed {1000 + seed}, optimize={optimize}:\n{case.script}\n", ordered=True
            )
            # the same request again, warm: stages measured quick run on the IO thread and
            # chain into their consumers (executors/worker/running.py), paths a first call never takes
            for _ in range(WARM_CALLS):
                answer = d.call(case.table)
            expected = flow.run(case.table.with_qid(answer.input_qids), kvs=case.store)
            assert_same_rows(
                answer.table, expected, f"seed {1000 + seed}, optimize={optimize}, warm:\n{case.script}\n", ordered=True
            )
            checked += 1
        finally:
            cluster.kvs.delete(*case.store)
            d.undeploy()
    assert checked >= (N_FLOWS // 2 if not optimize else N_FLOWS) * 0.9, (checked, errors)


def _gateway_qids(d, case):
    raise AssertionError("generated flows run without errors; a deployed error is a runtime bug")


def test_racing_stages_feeding_lookups_match_flow_run_with_uneven_caches(cluster, http):
    warmer = CacheWarmer(cluster, http)
    racing = 0
    for seed in range(N_RACING):
        case = random_case(2000 + seed, max_rows=10, race_lookups=50, same_anyof=True)
        flow = _rename(case.flow, unique(f"race{seed}"))
        cluster.kvs.mput(case.store)  # invalidates every cached copy of the keys...
        warmer.warm_foreign(KEYS)  # ...then an executor holds a key it does not own
        d = cluster.deploy(flow)
        try:
            stages = d.plan.stages
            racing += any(
                i in stages and stages[i].competitive > 1 for s in stages.values() if s.continuation for i in s.inputs
            )
            answer = d.call(case.table)
            expected = flow.run(case.table.with_qid(answer.input_qids), kvs=case.store)
            assert_same_rows(answer.table, expected, f"seed {2000 + seed}:\n{case.script}\n", ordered=True)
        finally:
            cluster.kvs.delete(*case.store)
            d.undeploy()
    assert racing >= N_RACING // 2, f"only {racing} flows had a racing stage feeding a lookup"
