"""Stuck work on an executor: run deadlines, lane hand-over, recycling, and a crash record.

Every stage run registers a ``Run`` (which requests, which operator is running now, until
when it may run). A ``Watchdog`` thread looks at the runs a few times a second:

- a run past its deadline (the request's deadline, or ``node_start + timeout_s`` of the
  operator it is in) is *abandoned*: its requests are answered 504 naming the operator,
  its output will be dropped when (if ever) it returns, and the thread it holds is
  replaced so the executor keeps its capacity (``on_overdue``);
- a run that holds the IO thread for longer than ``io_handoff_s`` gets the IO duties taken
  off it: a new IO thread takes over reading, and the old one finishes its call as a plain
  thread (``on_long_io``). Cheap stages run on the IO thread to save a thread hop (about
  half the hop's cost on this kind of machine); this is what makes that safe: a cheap stage
  that hangs cannot wedge the executor's reading;
- a run still not back ``grace_s`` after its deadline means a thread is lost for good
  (a hung model call cannot be interrupted in Python): the executor is recycled, a new
  process takes its place (``on_stuck``).

The ``Blackbox`` is a small memory-mapped file, one slot per thread, holding what each
thread is running. If the process dies (a segfault, ``os._exit``, the OOM killer) the
supervisor reads it to learn which requests were running: only those count as having
crashed an executor (poison-input quarantine, Dispatcher.executor_died); requests that were
merely queued there are re-run without blame.
"""

from __future__ import annotations

import itertools
import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("flowserve.executor")

IO_HANDOFF_S = 0.1  # cheap stages average < 2 ms: 50x that on the IO thread is a stall
DEFAULT_GRACE_S = 10.0
# How often the watchdog looks while work runs, and while none does. A run never wakes it
# (that would cost each request a thread switch); each look takes the interpreter lock from
# the threads serving requests, which an A/B on the e2e benchmark showed at a 20 ms tick
# (2-4% of the c=1 latency on a loaded machine): deadlines are seconds, and the IO
# hand-over may come 50 ms late.
TICK_S = 0.05
IDLE_TICK_S = 0.25
EXIT_RECYCLED = 75  # an executor that recycled itself exits with this (EX_TEMPFAIL)


@dataclass(eq=False)
class Run:
    """One stage run in progress on one thread: a request, or a batch of requests."""

    flow: str
    stage: str
    messages: list  # the run's requests, as StageInput messages (one per batched request)
    lane: str  # "io", "pool" or "batcher": what must be replaced if the thread is lost
    deadlines: list  # per message: monotonic time by which its request must be answered
    qid: int | None = None  # the first row's qid, for logs
    thread: int = field(default_factory=threading.get_ident)
    started: float = field(default_factory=time.monotonic)
    node: str = ""  # the operator running now
    node_started: float = 0.0
    node_timeout: float | None = None
    answered: set = field(default_factory=set)  # indexes of messages already answered 504
    overdue_at: float | None = None  # when the run was abandoned
    handed_off: bool = False  # an IO-lane run whose reading was given to a new IO thread
    lost: bool = False  # abandoned, and its thread replaced
    slot: int = -1
    owner: object = None  # the executor's HostedStage
    record_parts: tuple = ()  # the Blackbox's line around the operator's name, encoded

    def enter(self, node: str, timeout_s: float | None) -> None:
        """The stage moved on to operator ``node`` (with its ``timeout_s``, if any)."""
        self.node, self.node_started, self.node_timeout = node, time.monotonic(), timeout_s

    @property
    def abandoned(self) -> bool:
        return self.overdue_at is not None

    def next_due(self) -> float | None:
        """When this run's next request (or its operator's timeout) falls due, if any is left."""
        times = [d for i, d in enumerate(self.deadlines) if i not in self.answered]
        if self.node_timeout is not None and len(self.answered) < len(self.messages):
            times.append(self.node_started + self.node_timeout)
        return min(times) if times else None

    def due(self) -> tuple[list[int], str | None]:
        """Indexes of the messages whose time is up now, and why (``"timeout"``: the operator's
        ``timeout_s``, which applies to every request of the run; ``"deadline"``)."""
        now = time.monotonic()
        if self.node_timeout is not None and now >= self.node_started + self.node_timeout:
            return [i for i in range(len(self.messages)) if i not in self.answered], "timeout"
        late = [i for i, d in enumerate(self.deadlines) if now >= d and i not in self.answered]
        return late, ("deadline" if late else None)


def monotonic_deadline(wall_deadline, default_s: float = 60.0) -> float:
    """A request's wall-clock deadline (StageInput.deadline) on this process's monotonic clock."""
    now = time.time()
    left = (float(wall_deadline) - now) if wall_deadline else default_s
    return time.monotonic() + left


class Watchdog:
    """Watches the runs in progress; calls back into the executor when one is overdue,
    holds the IO thread too long, or is stuck past the grace period."""

    def __init__(
        self, on_overdue, on_long_io, on_stuck, *, grace_s: float = DEFAULT_GRACE_S, io_handoff_s: float = IO_HANDOFF_S
    ):
        self.on_overdue, self.on_long_io, self.on_stuck = on_overdue, on_long_io, on_stuck
        self.grace_s, self.io_handoff_s = grace_s, io_handoff_s
        self.runs: dict[int, Run] = {}
        self._ids = itertools.count()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def begin(self, run: Run) -> int:
        key = next(self._ids)
        self.runs[key] = run
        return key

    def end(self, key: int) -> Run | None:
        return self.runs.pop(key, None)

    def stuck(self) -> list[Run]:
        """Runs abandoned and not back yet."""
        return [r for r in list(self.runs.values()) if r.abandoned]

    def _loop(self) -> None:
        wait = IDLE_TICK_S
        while not self._stopping.wait(wait):
            try:
                due = self.check()
            except Exception:  # the watchdog must outlive anything it watches
                log.exception("watchdog check failed")
                due = None
            # look again at the next tick, or at the next deadline if sooner: a run is
            # answered at its deadline, not up to a tick later
            wait = TICK_S if self.runs else IDLE_TICK_S
            if due is not None:
                wait = max(0.001, min(wait, due - time.monotonic()))

    def check(self) -> float | None:
        """Act on what is due now; returns when the next known deadline falls (or None)."""
        now = time.monotonic()
        soonest = None
        for run in list(self.runs.values()):
            if run.lane == "io" and not run.handed_off and now - run.started >= self.io_handoff_s:
                run.handed_off = True
                self.on_long_io(run)
            due, why = run.due()
            if due:
                run.answered.update(due)
                if len(run.answered) == len(run.messages) and run.overdue_at is None:
                    run.overdue_at = now
                self.on_overdue(run, due, why)
            if run.overdue_at is not None and now - run.overdue_at >= self.grace_s:
                self.on_stuck(run)
                return None
            nxt = run.next_due()
            if nxt is not None and (soonest is None or nxt < soonest):
                soonest = nxt
        return soonest


class Blackbox:
    """What each thread of this process is running, in a memory-mapped file that outlives
    a crash. One fixed-size slot per thread; an empty slot starts with a zero byte.

    A record is ``flow \\t stage \\t operator \\t gateway \\t qid \\t req:att,req:att...``.
    """

    SLOT = 1024
    SLOTS = 64

    def __init__(self, path: str):
        self.path = path
        size = self.SLOT * self.SLOTS
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as e:
            self._map = self._in_memory(size, e)
        else:
            try:
                # the file's blocks are taken now: a sparse file's pages would be allocated
                # when first written, and on a full disk that write is a SIGBUS, not an error
                os.posix_fallocate(fd, 0, size)
                self._map = mmap.mmap(fd, size)
            except OSError as e:
                self._map = self._in_memory(size, e)
            finally:
                os.close(fd)
        self._local = threading.local()
        self._next = itertools.count()
        self._heads: dict[tuple[str, str], bytes] = {}  # (flow, stage) -> its records' first fields

    def _in_memory(self, size: int, error: OSError) -> mmap.mmap:
        """A record that does not outlive the process: what a crash leaves unsaid then is
        only which request to blame; the executor serves as ever."""
        log.warning(
            "cannot keep the running-record %s (%s): a crash of this executor will not name its requests",
            self.path,
            error.strerror or error,
        )
        return mmap.mmap(-1, size)

    def _slot(self) -> int:
        slot = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = next(self._next)
        return slot

    def record(self, run: Run) -> None:
        slot = self._slot()
        if slot >= self.SLOTS:
            return  # more threads than slots: this one runs unrecorded
        messages = run.messages
        if len(messages) == 1:
            m = messages[0]
            reqs, gw = f"{m.req}:{m.attempt}", m.gateway
        else:
            reqs = ",".join(f"{m.req}:{m.attempt}" for m in messages)
            gw = messages[0].gateway if messages else ""
        tail = f"\t{gw}\t{'' if run.qid is None else run.qid}\t{reqs}".encode("utf-8", "replace")
        run.record_parts = (self._head(run), tail)
        self._write(slot, run.record_parts[0] + run.node.encode("utf-8", "replace") + tail)
        self._map[slot * self.SLOT] = 1  # written last: a slot is valid once its first byte is set
        run.slot = slot

    def _head(self, run: Run) -> bytes:
        head = self._heads.get((run.flow, run.stage))
        if head is None:  # the same for every run of a stage: encoded once
            head = self._heads[(run.flow, run.stage)] = f"{run.flow}\t{run.stage}\t".encode("utf-8", "replace")
        return head

    def restage(self, run: Run) -> None:
        """The run went on to the next stage of a chained run (running.Runner._chained):
        rewrite its record (only while it is recorded); the requests are the same, the
        stage and the operator are new."""
        if run.slot >= 0:
            run.record_parts = (self._head(run), run.record_parts[1])
            self.note_node(run)

    def _write(self, slot: int, data: bytes) -> None:
        data = data[: self.SLOT - 1]
        start = slot * self.SLOT
        self._map[start + 1 : start + 1 + len(data)] = data
        self._map[start + 1 + len(data)] = 0

    def note_node(self, run: Run) -> None:
        """The run moved to another operator: rewrite its record (only while it is recorded);
        only the operator's name is new."""
        if run.slot >= 0:
            head, tail = run.record_parts
            self._write(run.slot, head + run.node.encode("utf-8", "replace") + tail)

    def clear(self, run: Run) -> None:
        if run.slot >= 0:
            self._map[run.slot * self.SLOT] = 0

    def close(self) -> None:
        self._map.close()

    @classmethod
    def read(cls, path) -> list[dict]:
        """The runs recorded in a (dead) process's file: flow, stage, operator, gateway, qid,
        requests [(req, attempt)]. Missing or unreadable file: []."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return []
        out = []
        for i in range(0, len(data) - cls.SLOT + 1, cls.SLOT):
            slot = data[i : i + cls.SLOT]
            if slot[0] != 1:
                continue
            line = slot[1:].split(b"\0", 1)[0].decode("utf-8", "replace")
            parts = line.split("\t")
            if len(parts) != 6:
                continue
            flow, stage, node, gw, qid, reqs = parts
            requests = []
            for pair in filter(None, reqs.split(",")):
                req, _, att = pair.partition(":")
                if req.isdigit() and att.isdigit():
                    requests.append((int(req), int(att)))
            out.append(
                {
                    "flow": flow,
                    "stage": stage,
                    "operator": node or stage,
                    "gateway": gw,
                    "qid": int(qid) if qid.lstrip("-").isdigit() else None,
                    "requests": requests,
                }
            )
        return out
