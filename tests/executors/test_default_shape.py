"""The embedded cluster's default shape: executors from the machine's cores."""

import os

from executors.config import ClusterConfig, default_executors, machine_cores


def test_one_core_is_left_to_the_gateway():
    assert [default_executors(c) for c in (1, 2, 3, 4, 16)] == [1, 1, 2, 3, 15]


def test_the_default_follows_this_process_affinity():
    cores = len(os.sched_getaffinity(0))
    assert machine_cores() == cores
    assert ClusterConfig().executors == max(1, cores - 1)
    assert ClusterConfig(executors=3).executors == 3  # a hand-picked shape wins
