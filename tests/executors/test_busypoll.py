"""Busy polling (executors/wire/busypoll.py): the window, the settings and their validation.
The runtime tests run with the default window on; test_runtime_paths runs a cluster with
it off."""

import asyncio
import threading

import pytest

from executors.hosts.cluster_config import ClusterConfig
from executors.wire.busypoll import BUSY_BACKOFF_S, LOST_WINDOW_S, LOST_YIELD_S, LOST_YIELDS, BusyPoll
from executors.wire.messages import StageInput
from executors.wire.transport import Outbox
from executors.worker.executor import Executor
from executors.worker.executor import main as executor_main
from tests.executors.processes import wait_until


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


def test_concurrent_requests_cool_the_window_until_it_passes_without_them(monkeypatch):
    now = [100.0]
    monkeypatch.setattr("executors.wire.busypoll.time.perf_counter", lambda: now[0])
    poll = BusyPoll(10)
    poll.touch()
    assert poll.hot()
    poll.cool()  # several requests in flight: sleep between messages
    assert not poll.hot()
    now[0] += 0.005
    poll.touch()  # a message within the window does not start polling again...
    assert not poll.hot()
    now[0] += 0.006
    poll.touch()  # ...one after it does
    assert poll.hot()


def test_the_gateway_polls_for_a_lone_request_and_not_past_half_the_cpus(tmp_path):
    from executors.gateway.links import ExecutorLinks

    async def main():
        flying = [1]
        links = ExecutorLinks(f"ipc://{tmp_path}/gw", 1000, lambda m: None, lambda h: False, lambda: flying[0])
        links.start()
        nobody = f"ipc://{tmp_path}/nobody"  # the messages themselves go nowhere: this reads the gateway
        try:
            links.send(nobody, [b"{}"])  # the only request in flight: its answer is read polling
            assert links.busy_poll.hot()
            flying[0] = max(1, links.busy_poll.cpus // 2) + 1  # more in flight than half the CPUs
            links.send(nobody, [b"{}"])
            await asyncio.sleep(0)  # the turn's messages leave at its end (ExecutorLinks.send)
            assert not links.busy_poll.hot()
        finally:
            links.close()

    asyncio.run(main())


def test_an_executor_polls_after_a_lone_request_and_sleeps_past_half_the_cpus_at_once(tmp_path, redis_url):
    ex = Executor("p0", f"ipc://{tmp_path}/p0", redis_url, threads=1, busy_poll_ms=1000)
    outbox = Outbox("test")
    nobody = f"ipc://{tmp_path}/nobody"  # replies go nowhere: this test reads the executor itself

    def ask(*reqs):  # one write: the executor reads these requests in one drain of its sockets
        msgs = [StageInput(r, 0, "no-such-flow", 1, "s", "__input__", {}, nobody).encode() for r in reqs]
        assert outbox.send_many(ex.address, msgs)

    serving = threading.Thread(target=ex.serve, daemon=True)
    serving.start()
    try:
        lone = iter(range(1, 1000))
        # one request at a time: the IO thread polls after it (retried: a machine busy with
        # other work makes it back off for a while, BUSY_BACKOFF_S)
        wait_until("polling after a lone request", lambda: ask(next(lone)) or ex.busy_poll.hot(), timeout=10)
        # more requests in one read than half the CPUs: concurrent traffic that takes the CPUs
        ask(*range(1001, 1002 + max(1, ex.busy_poll.cpus // 2)))
        # hot for the whole 1 s window unless cooled: not hot within half of it is the rule at work
        wait_until("no polling after concurrent requests", lambda: not ex.busy_poll.hot(), timeout=0.5)
    finally:
        ex.stop()
        serving.join(10)
        outbox.close()
        ex.store.close()
