"""An executor process: hosts any stage of any deployed flow and runs it on worker threads.

One IO thread owns the receiving sockets (transport.py): it decodes messages, gathers each
request's inputs per stage (all inputs, all parts of a key-split input, the first of
competing copies, the first valid of competing alternatives) and hands ready work to a
thread pool, or to the stage's batcher. Workers run the stage and send its output straight
to the consumers' executors (or the sink's result to the gateway). Redis is only read for
the plans (once per deploy) and for lookup data, through this executor's local cache.

This module is the process: its sockets, the IO thread and the messages it reads, and the
command line. The work is done by parts that each own their state (executor.py composes
them): ``hosting.Stages`` builds and drops stages, ``inputs.Inputs`` gathers a stage's
inputs, ``running.Runner`` runs ready work and watches it, ``outputs.Outputs`` sends outputs
and errors on, ``races.Races`` knows which races were won.

    python -m executors.worker.executor --id e0 --address ipc:///tmp/fs/e0 --kvs redis://...
"""

from __future__ import annotations

import argparse
import logging
import os
import selectors
import signal
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from executors import tracing
from executors.wire.busypoll import DEFAULT_MS as DEFAULT_BUSY_POLL_MS
from executors.wire.busypoll import MAX_MS as BUSY_POLL_MAX_MS
from executors.wire.busypoll import BusyPoll
from executors.wire.frames import WireError
from executors.wire.membership import HEARTBEAT_S, Heartbeat, Member
from executors.wire.messages import Cancel, Load, Ping, Pong, RawInput, Revoke, StageInput, Unload, decode
from executors.wire.transport import Outbox, Reader, accept, listen
from executors.worker import hedging
from executors.worker.gpu import gpu_stats, set_executor_class
from executors.worker.hosting import COSTLY_MS, HostedStage, Stages
from executors.worker.inputs import Inputs
from executors.worker.outputs import Outputs
from executors.worker.races import Races
from executors.worker.running import Runner
from executors.worker.watchdog import DEFAULT_GRACE_S, Run
from flow.context import set_store
from kvs.options import KVSOptions

log = logging.getLogger("flowserve.executor")

DEFAULT_CACHE_BYTES = KVSOptions.cache_max_bytes


class Executor:
    """One executor process: its sockets and IO thread, and the parts that do the work.

    How the parts talk (each is given what it needs when built here):
    a message -> Inputs.gather (-> Stages.rehost for a stage not built yet) -> Runner.dispatch
    -> Runner runs it -> Outputs.forward -> sockets, or Inputs.gather + Runner.dispatch for a
    consumer hosted here; a request that fails anywhere -> Outputs.fail. Races is read by
    all three (a race won drops its copies); Stages calls back ``_equip`` and ``_forget``."""

    def __init__(
        self,
        executor_id: str,
        address: str,
        kvs_url: str,
        device: str = "cpu",
        threads: int = 4,
        busy_poll_ms: float = DEFAULT_BUSY_POLL_MS,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        stuck_grace_s: float = DEFAULT_GRACE_S,
        blackbox: str | None = None,
    ):
        self.id = executor_id
        self.address = address
        self.device = device
        self.kvs_url = kvs_url
        self.store = _open_store(kvs_url, cache_bytes)
        set_store(self.store)  # operator code may read it (model weights in init)
        set_executor_class(device)  # warns once if a gpu executor has no GPU
        self.listener = listen(address)
        self.outbox = Outbox(f"executor {executor_id}")
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{executor_id}-worker")
        self._stopping = threading.Event()
        self._io_gen = 0  # the IO thread of generation _io_gen reads; older ones were handed off
        self._selector = None
        self._io: threading.Thread | None = None
        self.busy_poll = BusyPoll(busy_poll_ms)  # busypoll.py: why the IO thread polls after a message
        self.on_exit: list = []  # called before a recycle exits the process (deregistration)
        # the IO thread's quick work, filled by Runner.dispatch while it reads and run by
        # _run_inline after: one batch per batching stage, one run per request otherwise
        self._inline: dict = {}  # id(hosted) -> (hosted, ready items) to run after a drain
        self._inline_runs: deque = deque()  # (hosted, items): batches cut from _inline, next to run

        # The parts. One lock guards the tables that gathering reads and that workers, timers
        # and unloads change: Inputs' pending and done, Races' races won and copies running,
        # Stages' retired versions (and its stages, dropped on an unload with their inputs).
        lock = threading.Lock()
        self.races = Races(lock, self.send, address)
        self.races.executor = executor_id
        self.outputs = Outputs(executor_id, address, self.store, self.send, self.outbox, self.races)
        self.stages = Stages(
            executor_id, self.store, self.send, self.outputs.fail, lock, self._stopping, self._equip, self._forget
        )
        self.inputs = Inputs(lock, self.stages, self.races, self.outputs.fail, address)
        self.runner = Runner(
            executor_id,
            self.pool,
            self.store,
            self.send,
            self.races,
            self.outputs,
            self._inline,
            self._inline_runs,
            self._hand_off_io,
            self.on_exit,
            stuck_grace_s,
            blackbox,
        )
        self.outputs.hand_local(self.inputs.gather, self.runner.dispatch)
        self.runner.chain_with(self.stages.hosted, address)
        # what handle() and _run_inline call for each message, looked up once
        self._gather = self.inputs.gather
        self._gather_raw = self.inputs.gather_raw
        self._dispatch = self.runner.dispatch
        self._run_batch = self.runner.run_batch

    def _equip(self, hosted: HostedStage, ends) -> None:
        """What the running parts add to a stage Stages builds: a batcher for a stage that
        batches (it ends with ``ends``), and Clipper's pieces (hedging.py)."""
        if hosted.stage.batch is not None:
            hosted.batcher = self.runner.batcher(hosted, ends)
        hedging.equip(hosted, self.address, self.send, self.inputs, self.runner.run_one)

    def _forget(self, flow: str, version: int) -> None:
        """An unloaded version's pending inputs go with its stages (Stages holds the lock)."""
        self.inputs.forget(flow, version)

    # -- sockets ---------------------------------------------------------------------------

    def send(self, address: str, frames: list) -> None:
        if not self.outbox.send(address, frames):
            log.warning("executor %s: %s cannot be reached; a message to it was dropped", self.id, address)

    # -- main loop --------------------------------------------------------------------------

    def serve(self) -> None:
        """Run until stopped. The main thread only waits (and takes signals): reading is done
        by an IO thread, which the watchdog replaces if a cheap stage holds it too long."""
        log.info("executor %s listening on %s (%s)", self.id, self.address, self.device)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.listener, selectors.EVENT_READ, None)
        self.runner.watchdog.start()
        self._start_io_thread()
        while not self._stopping.wait(1.0):
            now = time.time()
            self.inputs.expire(now)
            self.races.expire(now)
        io = self._io
        if io is not None:
            io.join(5.0)
        self.runner.watchdog.stop()
        self.pool.shutdown(wait=True)  # graceful: in-flight work finishes
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self.outbox.close()

    def _start_io_thread(self) -> None:
        self._io_gen += 1
        self._io = threading.Thread(
            target=self._io_loop, args=(self._io_gen,), name=f"{self.id}-io{self._io_gen}", daemon=True
        )
        self._io.start()

    def _io_loop(self, gen: int) -> None:
        self.runner.io_thread = threading.get_ident()
        selector = self._selector
        while not self._stopping.is_set() and gen == self._io_gen:
            hot = self.busy_poll.hot()
            events = selector.select(0 if hot else 0.2)
            if gen != self._io_gen:
                break  # handed off while selecting: the new IO thread reads these
            if events:
                with self.outbox.corked():  # what reading sends (pongs, errors): one write per peer
                    for key, _ in events:
                        self._read(selector, key)
            elif hot:
                self.busy_poll.pause()
            # cheap ready work gathered while reading runs here, as batches
            self._run_inline(gen)
            if events:
                self.busy_poll.touch()  # from the end of the work: the next message is often the reply to what it sent

    def _hand_off_io(self, run: Run) -> None:
        """Watchdog: a run has held the IO thread too long. A new IO thread takes over reading;
        this one finishes its call as a plain thread. The stage runs on the pool from now on."""
        run.handed_off = True
        hosted = run.owner
        hosted.cheap = False
        hosted.ewma_ms = max(hosted.ewma_ms, COSTLY_MS * 10)
        log.warning(
            "executor %s: operator %r (flow %s) has held the IO thread for %.2f s; a new IO thread takes over",
            self.id,
            run.node,
            run.flow,
            time.monotonic() - run.started,
        )
        self._start_io_thread()

    def _read(self, selector, key) -> None:
        if key.data is None:  # a new connection
            while (conn := accept(self.listener)) is not None:
                selector.register(conn, selectors.EVENT_READ, Reader(conn))
            return
        try:
            messages, still_open = key.data.read()
        except WireError as e:
            log.warning("executor %s: closing a connection that broke the framing: %s", self.id, e)
            messages, still_open = [], False
        for frames in messages:
            self._handle_safely(frames)
        if not still_open:
            selector.unregister(key.fileobj)
            key.fileobj.close()

    def stop(self, *_):
        self._stopping.set()

    def _handle_safely(self, frames) -> None:
        try:
            self.handle(frames)
        except WireError as e:
            log.warning("dropped a malformed message: %s", e)
        except Exception as e:  # never let one message take the executor down
            log.exception("error handling a message")
            self._fail_message(frames, e)

    def _fail_message(self, frames, error: Exception) -> None:
        """Answer the request of a message that could not be handled (a bug, not a bad
        input: those fail where they are found), so it is not left to wait for its deadline."""
        try:
            msg = decode(frames)
            if type(msg) is RawInput:
                self.outputs.fail(msg.as_input(None), error)
            elif type(msg) is StageInput:
                self.outputs.fail(msg, error)
        except Exception:  # the message itself is unreadable: nothing names its request
            log.exception("could not answer the request of a message that failed")

    def _run_inline(self, gen: int) -> None:
        """Run the cheap work gathered while draining: one batch per batching stage, one
        run per request otherwise. Batches are taken one at a time from shared queues, so
        if this thread is handed off inside one, the new IO thread runs the rest."""
        while gen == self._io_gen:  # running a batch may make the next stage's batch ready here
            try:
                hosted, items = self._inline_runs.popleft()
            except IndexError:
                if not self._inline:
                    return
                try:
                    hosted, items = self._inline.pop(next(iter(self._inline)))
                except (KeyError, StopIteration, RuntimeError):  # the other IO thread took it
                    continue
                size = hosted.batcher.max_size if hosted.batcher is not None else 1
                self._inline_runs.extend((hosted, items[i : i + size]) for i in range(0, len(items), size))
                continue
            self._run_batch(hosted, items)

    def stats(self) -> dict:
        """What this executor counts for the gateway's /metrics, sent with each pong (once a
        second): its batching stages' queues and batch sizes, the work waiting for a worker
        thread, and its KVS cache. Counters are totals since this process started (a restart
        starts them again, which Prometheus' rate() takes as a reset)."""
        queues = [
            [flow, name, len(hosted.batcher)]
            for (flow, _version, name), hosted in list(self.stages.hosted.items())
            if hosted.batcher is not None
        ]
        out = {
            "queues": queues,
            "pool": self.pool._work_queue.qsize(),
            "batches": self.outputs.batch_counts(),
            "chained": self.runner.chained,
            "relayed": self.inputs.relayed,
        }
        cache = getattr(self.store, "stats", None)
        if cache is not None:
            c = cache()
            out["kvs"] = [c.hits, c.misses, c.evictions, c.nbytes]
        return out

    def handle(self, frames) -> None:
        msg = decode(frames)
        kind = type(msg)
        if kind is StageInput:
            for hosted, item in self._gather(msg):
                self._dispatch(hosted, item)
        elif kind is RawInput:
            for hosted, item in self._gather_raw(msg):
                self._dispatch(hosted, item)
        elif kind is Cancel:
            self.races.cancel((msg.gateway, msg.req, msg.attempt, msg.stage), None)
        elif kind is Revoke:
            self.inputs.revoke(msg.gateway, msg.reqs, self.races)
        elif kind is Load:
            self.pool.submit(self.stages.load, msg)
        elif kind is Unload:
            self.pool.submit(self.stages.unload, msg)  # on a worker: gc must not stall the IO thread
        elif kind is Ping:
            gpus = gpu_stats() if self.device == "gpu" else []
            try:
                stats = self.stats()
            except Exception:  # figures for /metrics must never cost the pong that says this executor lives
                log.exception("executor %s: its figures for /metrics failed", self.id)
                stats = None
            self.send(
                msg.reply, Pong(self.id, msg.token, self.device, gpus, relays=True, renders=True, stats=stats).encode()
            )
        else:
            log.warning("executor %s: dropped a %r message: executors do not take those", self.id, msg.TYPE)


class LossyStream:
    """A text stream whose writes never raise: what cannot be written (the disk is full or
    read-only) is dropped and counted, and the process goes on serving."""

    def __init__(self, stream):
        self._stream = stream
        self.dropped = 0

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            self.dropped += len(text)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            pass

    def __getattr__(self, name):  # fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def _open_store(url: str, cache_bytes: int):
    from executors.plans import cluster_key
    from kvs import CachedKVS

    # plans are checked against the cluster key before they are unpickled (kvs.serialization)
    return CachedKVS.from_url(url, cache_max_bytes=cache_bytes, signing_key=cluster_key())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m executors.worker.executor", description="Run one FlowServe executor.")
    p.add_argument("--id", required=True, help="executor id, unique in the cluster")
    p.add_argument("--address", required=True, help="address to listen on for messages: ipc:///path or tcp://host:port")
    p.add_argument(
        "--kvs",
        default=os.environ.get("FLOWSERVE_KVS_URL"),
        help="the store's URL: redis://, rediss://, redis+sentinel:// or redis+cluster:// (default: $FLOWSERVE_KVS_URL)",
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    p.add_argument("--threads", type=int, default=4)
    p.add_argument(
        "--busy-poll-ms",
        type=float,
        default=DEFAULT_BUSY_POLL_MS,
        help="after a message, poll for this long before sleeping (lower latency for CPU "
        f"that is otherwise idle; 0: off; default {DEFAULT_BUSY_POLL_MS:g})",
    )
    p.add_argument(
        "--cache-bytes",
        type=int,
        default=DEFAULT_CACHE_BYTES,
        help=f"byte budget of the local KVS cache (default {DEFAULT_CACHE_BYTES >> 20} MiB; 0: none)",
    )
    p.add_argument(
        "--stuck-grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        help="recycle this executor when abandoned work (past its deadline) has not come back "
        f"within this long (default {DEFAULT_GRACE_S:g})",
    )
    p.add_argument(
        "--blackbox",
        default=None,
        help="file recording what each thread runs, for the supervisor to read after a crash",
    )
    p.add_argument(
        "--heartbeat-s",
        type=float,
        default=HEARTBEAT_S,
        help="registration refresh period; the registration expires after 3 of them",
    )
    args = p.parse_args(argv)
    if not args.kvs:
        p.error("--kvs is required (or set FLOWSERVE_KVS_URL)")
    # output goes to a log file; on a full or read-only disk an operator's print() must not fail its request
    sys.stdout, sys.stderr = LossyStream(sys.stdout), LossyStream(sys.stderr)
    logging.basicConfig(
        level=os.environ.get("FLOWSERVE_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s executor {args.id} %(levelname)s %(message)s",
    )
    if not 0 <= args.busy_poll_ms <= BUSY_POLL_MAX_MS:
        p.error(f"--busy-poll-ms must be in 0..{BUSY_POLL_MAX_MS:g}, got {args.busy_poll_ms:g}")
    if args.cache_bytes < 0:
        p.error(f"--cache-bytes must be >= 0, got {args.cache_bytes}")
    if not args.stuck_grace_s > 0:
        p.error(f"--stuck-grace-s must be > 0, got {args.stuck_grace_s:g}")
    tracing.setup_from_env("flowserve-executor", args.id)  # FLOWSERVE_TRACING: executors/tracing.py
    ex = Executor(
        args.id,
        args.address,
        args.kvs,
        device=args.device,
        threads=args.threads,
        busy_poll_ms=args.busy_poll_ms,
        cache_bytes=args.cache_bytes,
        stuck_grace_s=args.stuck_grace_s,
        blackbox=args.blackbox,
    )
    # announce it only once it listens: gateways that find it can send at once
    heartbeat = Heartbeat(
        ex.store.redis, Member(args.id, args.address, args.device, args.threads), args.heartbeat_s
    ).start()
    ex.on_exit.append(heartbeat.stop)  # a recycling executor leaves the membership at once

    def stop(*_):
        # leave the membership at once so gateways stop routing here, then finish in-flight work
        threading.Thread(target=heartbeat.stop, daemon=True).start()
        ex.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        ex.serve()
    finally:
        heartbeat.stop()


if __name__ == "__main__":
    main()
