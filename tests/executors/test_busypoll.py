"""Busy polling (executors/wire/busypoll.py): the window, the settings and their validation.
The runtime tests run with the default window on; test_runtime_paths runs a cluster with
it off."""

import pytest

from executors.hosts.cluster_config import ClusterConfig
from executors.wire.busypoll import BUSY_BACKOFF_S, LOST_WINDOW_S, LOST_YIELD_S, LOST_YIELDS, BusyPoll
from executors.worker.executor import main as executor_main


def test_the_window_opens_on_a_message_and_closes_after_it(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("executors.wire.busypoll.time.perf_counter", lambda: now[0])
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


def test_yields_that_keep_losing_the_cpu_stop_polling_for_a_while(monkeypatch):
    # a busy machine: every yield comes back a time slice later, so sleeping (and being
    # woken by the next message) beats waiting out other work's slices, for BUSY_BACKOFF_S
    now = [100.0]
    monkeypatch.setattr("executors.wire.busypoll.time.perf_counter", lambda: now[0])
    monkeypatch.setattr("executors.wire.busypoll.os.sched_yield", lambda: now.__setitem__(0, now[0] + delay))
    poll = BusyPoll(10)
    poll.touch()
    delay = LOST_YIELD_S / 4  # another process ran a moment (a client's turn): keep polling
    poll.pause()
    assert poll.hot()
    delay = LOST_YIELD_S * 2  # time slices went to other work, one after another
    for _ in range(LOST_YIELDS - 1):
        poll.pause()
        assert poll.hot()  # not yet: one lost slice is no sign of a busy machine
        poll.touch()
    poll.pause()
    assert not poll.hot()
    poll.touch()  # messages meanwhile do not start polling again...
    assert not poll.hot()
    now[0] += BUSY_BACKOFF_S
    poll.touch()  # ...until the back-off is over
    assert poll.hot()


def test_a_lost_yield_now_and_then_keeps_polling(monkeypatch):
    # on a quiet VM a yield loses a millisecond a few times a second (the hypervisor, an
    # interrupt): backing off on each kept a gateway asleep most of the time
    now = [100.0]
    monkeypatch.setattr("executors.wire.busypoll.time.perf_counter", lambda: now[0])
    monkeypatch.setattr(
        "executors.wire.busypoll.os.sched_yield", lambda: now.__setitem__(0, now[0] + LOST_YIELD_S * 1.5)
    )
    poll = BusyPoll(10)
    for _ in range(4 * LOST_YIELDS):
        poll.touch()
        poll.pause()
        assert poll.hot()
        now[0] += LOST_WINDOW_S / (LOST_YIELDS - 1)  # the next lost yield comes too late to count with this one
