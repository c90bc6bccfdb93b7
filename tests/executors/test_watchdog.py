"""The watchdog's pieces without a cluster: run deadlines, hand-over and recycling
decisions (driven with deadlines already in the past, not with sleeps), and the blackbox
a crashed executor leaves for its supervisor."""

from __future__ import annotations

import threading
import time

from executors.wire.messages import StageInput
from executors.worker.watchdog import Blackbox, Run, Watchdog, monotonic_deadline


def _run(lane="pool", deadlines=None, n=1):
    messages = [StageInput(10 + i, 0, "f", 1, "a+b", "__input__", {}, "ipc:///tmp/gw") for i in range(n)]
    return Run("f", "a+b", messages, lane, deadlines or [time.monotonic() + 60] * n, qid=7)


class Calls:
    def __init__(self):
        self.overdue, self.long_io, self.stuck = [], [], []

    def watchdog(self, grace_s=60.0, io_handoff_s=60.0) -> Watchdog:
        return Watchdog(
            lambda r, due, why: self.overdue.append((r, due, why)),
            self.long_io.append,
            self.stuck.append,
            grace_s=grace_s,
            io_handoff_s=io_handoff_s,
        )


def test_a_run_within_its_deadline_is_left_alone():
    calls = Calls()
    w = calls.watchdog()
    w.begin(_run())
    w.check()
    assert not (calls.overdue or calls.long_io or calls.stuck)


def test_past_the_request_deadline_only_late_requests_are_answered():
    calls = Calls()
    w = calls.watchdog()
    now = time.monotonic()
    run = _run(deadlines=[now - 1, now + 60], n=2)
    w.begin(run)
    w.check()
    assert [(due, why) for _, due, why in calls.overdue] == [([0], "deadline")]
    assert not run.abandoned  # the other request of the batch may still get its answer
    w.check()
    assert len(calls.overdue) == 1  # each request is answered once


def test_an_operator_timeout_abandons_the_whole_run():
    calls = Calls()
    w = calls.watchdog()
    run = _run(n=3)
    run.enter("b", 0.5)
    run.node_started -= 1.0  # entered a second ago
    w.begin(run)
    w.check()
    assert [(due, why) for _, due, why in calls.overdue] == [([0, 1, 2], "timeout")]
    assert run.abandoned and run.node == "b"


def test_abandoned_work_not_back_after_the_grace_period_recycles():
    calls = Calls()
    w = calls.watchdog(grace_s=5.0)
    run = _run(deadlines=[time.monotonic() - 1])
    w.begin(run)
    w.check()
    assert run.abandoned and not calls.stuck
    run.overdue_at -= 6.0  # abandoned six seconds ago
    w.check()
    assert calls.stuck == [run]


def test_a_run_back_in_time_is_forgotten():
    calls = Calls()
    w = calls.watchdog()
    key = w.begin(_run(deadlines=[time.monotonic() + 60]))
    assert w.end(key) is not None and not w.runs
    w.check()
    assert not calls.overdue


def test_the_io_thread_is_handed_off_once():
    calls = Calls()
    w = calls.watchdog(io_handoff_s=0.05)
    run = _run(lane="io")
    run.started -= 1.0
    w.begin(run)
    w.check()
    w.check()
    assert calls.long_io == [run] and run.handed_off
    pool_run = _run(lane="pool")
    pool_run.started -= 1.0
    w.begin(pool_run)
    w.check()
    assert calls.long_io == [run]  # only the IO lane is handed off


def test_monotonic_deadline_follows_the_wall_clock_deadline():
    assert abs(monotonic_deadline(time.time() + 5) - (time.monotonic() + 5)) < 0.5
    assert monotonic_deadline(None, default_s=60) > time.monotonic() + 59


def test_blackbox_lists_what_each_thread_was_running(tmp_path):
    box = Blackbox(str(tmp_path / "e0.running"))
    runs = {}

    def worker(k):
        run = _run(n=2)
        run.node = f"op{k}"
        box.record(run)
        runs[k] = run

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    box.clear(runs[1])
    records = Blackbox.read(tmp_path / "e0.running")
    assert sorted(r["operator"] for r in records) == ["op0", "op2"]
    assert all(r["requests"] == [(10, 0), (11, 0)] and r["qid"] == 7 and r["flow"] == "f" for r in records)
    assert all(r["gateway"] == "ipc:///tmp/gw" and r["stage"] == "a+b" for r in records)
    box.close()


def test_a_chained_runs_record_names_each_stage_as_it_starts(tmp_path):
    box = Blackbox(str(tmp_path / "e0.running"))
    run = _run(n=2)
    run.node = "first_op"
    box.record(run)
    run.stage, run.node = "next", "next_op"  # the run goes on to the next stage (running.Runner._chained)
    box.restage(run)
    (record,) = Blackbox.read(tmp_path / "e0.running")
    assert (record["stage"], record["operator"]) == ("next", "next_op")
    assert record["requests"] == [(10, 0), (11, 0)] and record["qid"] == 7 and record["gateway"] == "ipc:///tmp/gw"
    run.node = "next_op2"
    box.note_node(run)  # an operator of the new stage: its record still names that stage
    (record,) = Blackbox.read(tmp_path / "e0.running")
    assert (record["stage"], record["operator"]) == ("next", "next_op2")
    box.clear(run)
    assert Blackbox.read(tmp_path / "e0.running") == []
    box.close()


def test_blackbox_of_a_missing_file_is_empty(tmp_path):
    assert Blackbox.read(tmp_path / "nothing") == []


def test_check_says_when_the_next_deadline_falls():
    calls = Calls()
    w = calls.watchdog()
    now = time.monotonic()
    w.begin(_run(deadlines=[now + 5, now + 3], n=2))
    run = _run(deadlines=[now + 9])
    run.enter("b", 1.0)
    w.begin(run)
    due = w.check()
    assert due is not None and abs(due - (now + 1.0)) < 0.5  # b's timeout comes first
    assert Calls().watchdog().check() is None
