"""Busy polling (executors/busypoll.py): the window, the settings and their validation.
The runtime tests run with the default window on; test_runtime_paths runs a cluster with
it off."""

import pytest

from executors.busypoll import BusyPoll
from executors.config import ClusterConfig
from executors.executor import main as executor_main


def test_the_window_opens_on_a_message_and_closes_after_it(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("executors.busypoll.time.perf_counter", lambda: now[0])
    poll = BusyPoll(10)
    assert not poll.hot()  # nothing happened yet: sleep
    poll.touch()
    now[0] += 0.009
    assert poll.hot()
    now[0] += 0.002
    assert not poll.hot()


@pytest.mark.parametrize("bad", [-1, 1000.5])
def test_a_window_out_of_range_is_refused_not_clamped(bad):
    with pytest.raises(ValueError, match="busy polling window"):
        BusyPoll(bad)


def test_zero_turns_it_off():
    poll = BusyPoll(0)
    poll.touch()
    assert poll.window_s == 0 and not poll.hot()


@pytest.mark.parametrize("bad", [-1, 1001, "10", True, None])
def test_cluster_config_refuses_a_bad_window(bad):
    with pytest.raises(ValueError, match="busy_poll_ms"):
        ClusterConfig(busy_poll_ms=bad)


def test_cluster_config_round_trips_the_window():
    assert ClusterConfig.from_json(ClusterConfig(busy_poll_ms=2.5).to_json()).busy_poll_ms == 2.5


def test_executor_cli_refuses_a_bad_window(capsys):
    with pytest.raises(SystemExit):
        executor_main(
            ["--id", "e", "--address", "ipc:///tmp/unused", "--kvs", "redis://127.0.0.1:1", "--busy-poll-ms", "5000"]
        )
    assert "--busy-poll-ms must be in 0..1000" in capsys.readouterr().err
