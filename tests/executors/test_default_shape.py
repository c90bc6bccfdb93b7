"""The embedded cluster's default shape: executors, and their math libraries' threads, from
the machine's cores."""

import os

from executors.hosts.cluster_config import (
    MATH_THREAD_ENV,
    ClusterConfig,
    default_executors,
    default_math_threads,
    machine_cores,
    math_thread_env,
)
from flow import ColumnType, Flow
from tests.executors.conftest import unique


def test_one_core_is_left_to_the_gateway():
    assert [default_executors(c) for c in (1, 2, 3, 4, 16)] == [1, 1, 2, 3, 15]


def test_the_default_follows_this_process_affinity():
    cores = len(os.sched_getaffinity(0))
    assert machine_cores() == cores
    assert ClusterConfig().executors == max(1, cores - 1)
    assert ClusterConfig(executors=3).executors == 3  # a hand-picked shape wins


def test_math_threads_share_out_the_cores_the_gateway_leaves():
    # (cores, executors) -> threads per executor's torch / BLAS
    cases = {(1, 1): 1, (2, 1): 1, (4, 3): 1, (16, 15): 1, (16, 1): 15, (16, 3): 5, (9, 2): 4}
    assert {k: default_math_threads(k[1], cores=k[0]) for k in cases} == cases


def test_a_users_own_math_thread_setting_wins():
    env = math_thread_env(3, environ={"OMP_NUM_THREADS": "8"}, cores=16)
    assert env == {"OPENBLAS_NUM_THREADS": "5", "MKL_NUM_THREADS": "5"}
    assert set(math_thread_env(3, environ={}, cores=16)) == set(MATH_THREAD_ENV)


def report_threads(row):
    import torch

    return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()


def test_executors_start_with_their_share_of_the_cores(cluster, http):
    # the shared cluster runs 2 executors: each one's torch gets its share, not every core
    f = Flow(unique("threads"), schema={"x": ColumnType("int")})
    f.map(report_threads, names=["omp", "torch"])
    d = cluster.deploy(f)
    row = http.post(d.url, json={"x": 1}).json()["rows"][0]
    row.pop("qid")
    want = os.environ.get("OMP_NUM_THREADS") or str(default_math_threads(2))
    assert row == {"omp": want, "torch": int(want)}
