"""Big buffers between processes on one host without copies: memfd segments whose file
descriptors travel over the Unix socket (SCM_RIGHTS) beside the message that names them.

Over a local (``ipc://``) connection, a frame of at least ``SHM_MIN_BYTES`` does not go
through the socket: the transport (transport.py) sends a 16-byte descriptor (offset,
length) in its place and the segment's descriptor in the same ``sendmsg``; the receiver
maps the segment read-only and hands the frame on as a memoryview of the mapping, so
``np.frombuffer`` in wire.py builds the column on it without a copy.

A frame that already lies in a segment (a stage passing its input on, a Table the
gateway got back from an executor, an Arrow request body the gateway read into one) is
sent as a reference to that same segment: no
copy at all. Any other frame is copied once into a fresh segment (over the socket it was
copied four times: into the kernel and out of it, there and back).

Lifetimes cannot leak, by construction: a memfd has no name in any file system (nothing
in /dev/shm to clean up), and the kernel frees it when its last descriptor and its last
mapping are gone, including those of a process killed with SIGKILL and those still in
flight in a socket whose reader died. A process holds a descriptor only while a mapping
of it is alive (``SharedMap``: closed when the mapping is collected).
"""

from __future__ import annotations

import logging
import mmap
import os
import queue
import threading
import time
import weakref

import numpy as np

log = logging.getLogger("flowserve.shm")

# below this a socket copy is cheaper than a segment (syscalls, page faults); the
# environment may move it (benchmarks turn shared memory off with a size out of reach)
SHM_MIN_BYTES = int(os.environ.get("FLOWSERVE_SHM_MIN_BYTES", 1 << 20))
MAX_FDS = 64  # descriptors one read may bring (the ancillary buffer's room)
# from this size a mapping is let go of on the keeper thread: freeing 4 MiB costs ~0.5 ms,
# the hand-over tens of us
REAP_MIN_BYTES = 4 << 20
# the most memory a process holds in fresh segments made ahead of need (_Stock; 0: none),
# STOCK_DEPTH of each size asked for lately, let go of after STOCK_IDLE_S without an ask
# (the environment may move both: tests make the stock go quickly once a cluster is idle)
STOCK_BYTES = int(os.environ.get("FLOWSERVE_SHM_STOCK_BYTES", 64 << 20))
STOCK_DEPTH = 2
KEEPER_NICE = 19  # the keeper thread's priority: the lowest
MAKE_PIECE = 256 << 10  # the keeper allocates a stocked segment's pages this many at a time
STOCK_IDLE_S = float(os.environ.get("FLOWSERVE_SHM_STOCK_IDLE_S", 30.0))
ASKED_MAX = 1024  # sizes the stock remembers being asked for (each is stocked from its second ask)


class SharedMap(mmap.mmap):
    """A read-only mapping of a received (or created) segment, with the descriptor that
    can send it on; the descriptor is closed when the mapping is collected (a big one's
    on the keeper thread, after its unmapping, so that the pages are freed there)."""

    fd: int
    addr: int
    nbytes: int

    def __del__(self):
        fd = self.__dict__.get("fd", -1)
        if fd < 0:  # never owned (_own failed before), or the keeper has let go of it
            return
        try:
            if len(self) >= REAP_MIN_BYTES and _KEEPER.take(self):
                return  # kept alive by the keeper's queue until it unmaps and closes it
        except Exception:  # interpreter shutdown: the module's globals may be gone
            pass
        os.close(fd)  # the mapping goes right after, in mmap's own deallocation


def map_segment(fd: int, size: int) -> SharedMap:
    """Map ``fd`` (now owned by the mapping) read-only; ValueError if it is not a segment
    of at least ``size`` bytes (a hostile peer cannot make us read past its end)."""
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000) == 0o100000:  # a regular file (memfd): not a pipe or device
            raise ValueError("the descriptor is not a shared-memory segment")
        if st.st_size < size or size <= 0:
            raise ValueError(f"segment of {st.st_size} bytes, frame needs {size}")
        m = SharedMap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ)
    except BaseException:  # not kept: close the descriptor, whatever went wrong, and re-raise
        os.close(fd)
        raise
    return _own(m, fd)


def new_segment(data: memoryview) -> tuple[int, int]:
    """A fresh segment holding a copy of ``data``: (descriptor for the caller to send and
    close, size). One copy, by the kernel (``pwrite``), no page faults in this process;
    into a stocked segment's pages if there is one of its size (it may be bigger than
    ``data``: a frame names its offset and length in it)."""
    size = data.nbytes
    stocked = _STOCK.take(size)
    fd = stocked[0] if stocked is not None else os.memfd_create("flowserve", os.MFD_CLOEXEC)
    try:
        if stocked is None:
            os.ftruncate(fd, size)
        done = 0
        while done < size:
            done += os.pwrite(fd, data[done:], done)
    except BaseException:  # not kept: close the descriptor, whatever went wrong, and re-raise
        os.close(fd)
        raise
    return fd, size


def find_shared(view: memoryview) -> tuple[SharedMap, int] | None:
    """The live segment of this process that ``view``'s bytes lie in, and their offset
    there; None if they are in private memory.

    By address, among the mappings alive in this process (a few: the big payloads in
    flight), so it finds them whatever the buffer was made from: a numpy column built on
    a received frame, an Arrow buffer of a request body read into a segment, a slice."""
    if not _LIVE:
        return None
    try:
        start = np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]
    except (ValueError, TypeError):
        return None
    end = start + view.nbytes
    with _LIVE_LOCK:
        live = list(_LIVE)
    for segment in live:
        # a copy taken just before the keeper let go of one may still name it: it is never
        # the one a live view lies in, and its addr and nbytes are plain numbers
        if segment.addr <= start and end <= segment.addr + segment.nbytes:
            return segment, start - segment.addr
    return None


class SegmentWriter:
    """A fresh segment filled as the pieces of a body arrive, by the kernel (``pwrite``):
    each page is allocated as it is written, with no page fault in this process (filling
    a writable mapping instead faulted every 4 KiB page: 10.5 ms for 10 MiB against 3.2 ms
    here, measured side by side; a ``bytes`` join of the same pieces 1.5 ms). Given the
    body's declared ``size``, a stocked segment (_Stock) is filled instead if there is one:
    its pages exist, so the writes only copy. ``mapped()`` then maps it read-only and
    hands the descriptor to the mapping; a writer dropped before that (a client gone
    mid-body, an error) closes its descriptor."""

    def __init__(self, size: int | None = None):
        stocked = _STOCK.take(size) if size else None
        self.fd = stocked[0] if stocked is not None else os.memfd_create("flowserve", os.MFD_CLOEXEC)
        self.size = 0
        self._close = weakref.finalize(self, os.close, self.fd)

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        done = 0
        while done < view.nbytes:
            done += os.pwrite(self.fd, view[done:], self.size + done)
        self.size += done

    def mapped(self) -> memoryview:
        """The bytes written, as a read-only view of the segment (live in this process, so
        the transport sends what lies in it on as a reference); the writer is spent."""
        if self.size == 0:
            self.close()
            return memoryview(b"")
        self._close.detach()  # the mapping owns the descriptor now (map_segment closes it on error)
        view = memoryview(map_segment(self.fd, self.size))
        return view if view.nbytes == self.size else view[: self.size]  # a stocked segment may be bigger

    def close(self) -> None:
        self._close()  # once; nothing after mapped()


def _own(m: SharedMap, fd: int) -> SharedMap:
    m.fd = fd  # closed by SharedMap.__del__
    _KEEPER.start()  # here, where starting a thread is safe; it lets go of m if m is big
    m.addr = np.frombuffer(m, dtype=np.uint8).__array_interface__["data"][0]
    m.nbytes = len(m)  # len() of a mapping the keeper has closed would raise: find_shared reads this
    with _LIVE_LOCK:
        _LIVE.add(m)
    return m


class _Keeper:
    """One thread per process for the slow kernel work on segments, off the request path.

    It lets go of big mappings: unmaps each (outside the GIL) and then closes its
    descriptor, which frees the segment's pages if no other process holds it. A mapping
    comes here from ``SharedMap.__del__``, kept alive by the queue; it leaves ``_LIVE``
    before it is unmapped, so a new mapping at the same address is never taken for it.
    Finalizers may run anywhere (inside a lock, mid-``put``, during a collection): so the
    queue is a ``SimpleQueue`` (its ``put`` is reentrant) and the thread is started from
    ``_own`` or ``_Stock.take``, never from a finalizer. With a backlog, or before the
    thread runs in this process (a forked child), the caller frees inline: what waits here
    is memory still held.

    It also makes the stock's segments (``_Stock``: a size to make is put on the same
    queue) and, when none is asked for a while, lets the stock go."""

    BACKLOG = 8

    def __init__(self):
        self._pid = -1
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._start_lock = threading.Lock()
        self.reaped = 0  # mappings let go of here (this process, since it started)

    def start(self) -> None:
        if self._pid == os.getpid():
            return
        with self._start_lock:
            if self._pid != os.getpid():
                self._queue = queue.SimpleQueue()  # before the pid: take() reads them in the other order
                threading.Thread(target=self._run, args=(self._queue,), name="shm-keeper", daemon=True).start()
                self._pid = os.getpid()

    def take(self, m: SharedMap) -> bool:
        if self._pid != os.getpid() or self._queue.qsize() >= self.BACKLOG:
            return False
        self._queue.put(m)
        return True

    def make(self, size: int) -> None:
        """Make a segment of ``size`` bytes for the stock (the caller started this thread)."""
        self._queue.put(size)

    def _run(self, q: queue.SimpleQueue) -> None:
        try:
            # background work: on a busy machine the request path runs first (Linux sets a
            # nice value per thread; a thread may always lower its own priority)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), KEEPER_NICE)
        except (OSError, AttributeError):
            pass
        check = time.monotonic() + STOCK_IDLE_S  # when to look for stock nobody asks for
        while True:
            try:
                m = q.get(timeout=max(check - time.monotonic(), 0.0) if _STOCK.held else None)
            except queue.Empty:
                m = None
            if time.monotonic() >= check:
                _STOCK.let_go_idle(time.monotonic())
                check = time.monotonic() + STOCK_IDLE_S
            if m is None:
                continue
            if isinstance(m, threading.Event):  # settle(): everything before it is done
                m.set()
                continue
            if type(m) is int:
                _STOCK.make(m)
                continue
            try:
                with _LIVE_LOCK:
                    _LIVE.discard(m)
                fd, m.fd = m.fd, -1  # nothing may close fd twice
                try:
                    m.close()  # unmap, and close mmap's own duplicate of the descriptor
                except BufferError:
                    # a collected cycle still holds views of it (finalizers run before the
                    # cycle is cleared): it is unmapped when they go, wherever that is
                    pass
                os.close(fd)
                self.reaped += 1
            except Exception:  # the thread must live on: what waits behind holds memory
                log.exception("could not let go of a shared-memory mapping")
            m = None

    def settle(self) -> None:
        """Wait until everything handed over so far is done (tests count segments)."""
        if self._pid == os.getpid():
            done = threading.Event()
            self._queue.put(done)
            done.wait()


def stock_size(n: int) -> int:
    """The size of segment stocked for ``n`` bytes: ``n`` rounded up to a 1/16 to 1/32 of
    its power of two (64 KiB at least), so bodies of about one size share their stock."""
    step = 1 << max(16, n.bit_length() - 5)
    return -(-n // step) * step


class _Stock:
    """Fresh segments made ahead of need, so that filling one on the request path only
    copies: a new segment's pages are allocated (and zeroed) as it is first written, ~1.9
    ms of the ~4 ms it takes to write 10 MiB into one on this project's VM, against ~2.1
    ms into one made before (``posix_fallocate``, on the keeper thread, outside the GIL).

    ``STOCK_DEPTH`` segments of each size asked for more than once (``stock_size``), up
    to ``STOCK_BYTES`` in all; a size not asked for within ``STOCK_IDLE_S`` is let go of,
    so an idle process holds none. A stocked segment has never been sent anywhere: handing
    it out is as safe as making a new one. A forked child never uses its parent's stock
    (the two would fill the same segments): it closes its copies and starts its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._spare: dict[int, list[int]] = {}  # size -> descriptors of fresh segments
        self._making: dict[int, int] = {}  # size -> segments asked of the keeper, not made yet
        self._asked: dict[int, float] = {}  # size -> when one was last asked for
        self.held = 0  # bytes in _spare and _making
        self.hits = self.misses = 0  # takes served from the stock, and not (this process)

    def take(self, n: int) -> tuple[int, int] | None:
        """A fresh segment of at least ``n`` bytes, its pages allocated, for the caller to
        fill and own: (descriptor, size); None if the stock has none (if this size was
        asked for before, some are made for the next asks). Sizes under ``SHM_MIN_BYTES``,
        or too big to stock, are never stocked."""
        size = stock_size(n)
        if n < SHM_MIN_BYTES or size * STOCK_DEPTH > STOCK_BYTES:
            return None
        _KEEPER.start()
        with self._lock:
            if self._pid != os.getpid():
                self._forget_inherited()
            again = size in self._asked
            if not again and len(self._asked) >= ASKED_MAX:  # ever new sizes: forget those never stocked
                self._asked = {k: t for k, t in self._asked.items() if self._spare.get(k) or self._making.get(k)}
            self._asked[size] = time.monotonic()
            spare = self._spare.get(size)
            fd = spare.pop() if spare else None
            if fd is not None:
                self.held -= size
                self.hits += 1
            else:
                self.misses += 1
            # a size is stocked from its second ask on: bodies of ever new sizes make nothing
            make = STOCK_DEPTH - len(spare or ()) - self._making.get(size, 0) if again else 0
            make = max(0, min(make, (STOCK_BYTES - self.held) // size))
            if make:
                self._making[size] = self._making.get(size, 0) + make
                self.held += size * make
        for _ in range(make):
            _KEEPER.make(size)
        return None if fd is None else (fd, size)

    def make(self, size: int) -> None:
        """On the keeper thread: make one segment of ``size`` bytes and stock it."""
        fd = -1
        try:
            fd = os.memfd_create("flowserve", os.MFD_CLOEXEC)
            for at in range(0, size, MAKE_PIECE):
                # allocates and zeroes the pages, outside the GIL; a piece at a time, with
                # the CPU offered between pieces: a busy-polling gateway or executor that
                # yielded it to this thread gets it back within ~50 us, not a time slice
                os.posix_fallocate(fd, at, min(MAKE_PIECE, size - at))
                os.sched_yield()
        except OSError as e:  # out of memory: the request path makes its own, as without a stock
            log.debug("could not make a %d-byte segment for the stock: %s", size, e)
            if fd >= 0:
                os.close(fd)
            fd = -1
        with self._lock:
            self._making[size] -= 1
            if fd >= 0 and self._pid == os.getpid() and size in self._asked:
                self._spare.setdefault(size, []).append(fd)
                return
            self.held -= size
        if fd >= 0:
            os.close(fd)

    def let_go_idle(self, now: float) -> None:
        """Close the stocked segments of every size not asked for within STOCK_IDLE_S."""
        closing = []
        with self._lock:
            for size, when in list(self._asked.items()):
                if now - when >= STOCK_IDLE_S:
                    del self._asked[size]
                    spare = self._spare.pop(size, [])
                    self.held -= size * len(spare)
                    closing += spare
        for fd in closing:
            os.close(fd)

    def stocked(self) -> int:
        """Segments in stock now (tests count this process's segments without them)."""
        with self._lock:
            return sum(len(fds) for fds in self._spare.values()) if self._pid == os.getpid() else 0

    def _forget_inherited(self) -> None:
        for fds in self._spare.values():
            for fd in fds:
                os.close(fd)
        self._spare, self._making, self._asked, self.held = {}, {}, {}, 0
        self._pid = os.getpid()


_KEEPER = _Keeper()
_STOCK = _Stock()
settle = _KEEPER.settle

_LIVE: weakref.WeakSet = weakref.WeakSet()  # this process's mapped segments
# adds and discards come from several threads; find_shared's copy of the set must not see
# it change size mid-iteration (the weak references' own removals are deferred by WeakSet)
_LIVE_LOCK = threading.Lock()
