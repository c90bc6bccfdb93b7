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
import weakref

import numpy as np

log = logging.getLogger("flowserve.shm")

# below this a socket copy is cheaper than a segment (syscalls, page faults); the
# environment may move it (benchmarks turn shared memory off with a size out of reach)
SHM_MIN_BYTES = int(os.environ.get("FLOWSERVE_SHM_MIN_BYTES", 1 << 20))
MAX_FDS = 64  # descriptors one read may bring (the ancillary buffer's room)
# from this size a mapping is let go of on the reaper thread: freeing 4 MiB costs ~0.5 ms,
# the hand-over tens of us
REAP_MIN_BYTES = 4 << 20


class SharedMap(mmap.mmap):
    """A read-only mapping of a received (or created) segment, with the descriptor that
    can send it on; the descriptor is closed when the mapping is collected (a big one's
    on the reaper thread, after its unmapping, so that the pages are freed there)."""

    fd: int
    addr: int
    nbytes: int

    def __del__(self):
        fd = self.__dict__.get("fd", -1)
        if fd < 0:  # never owned (_own failed before), or the reaper has let go of it
            return
        try:
            if len(self) >= REAP_MIN_BYTES and _REAPER.take(self):
                return  # kept alive by the reaper's queue until it unmaps and closes it
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
    except BaseException:
        os.close(fd)
        raise
    return _own(m, fd)


def new_segment(data: memoryview) -> tuple[int, int]:
    """A fresh segment holding a copy of ``data``: (descriptor for the caller to send and
    close, size). One copy, by the kernel (``pwrite``), no page faults in this process."""
    fd = os.memfd_create("flowserve", os.MFD_CLOEXEC)
    try:
        size = data.nbytes
        os.ftruncate(fd, size)
        done = 0
        while done < size:
            done += os.pwrite(fd, data[done:], done)
    except BaseException:
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
        # a copy taken just before the reaper let go of one may still name it: it is never
        # the one a live view lies in, and its addr and nbytes are plain numbers
        if segment.addr <= start and end <= segment.addr + segment.nbytes:
            return segment, start - segment.addr
    return None


class SegmentWriter:
    """A fresh segment filled as the pieces of a body arrive, by the kernel (``pwrite``):
    each page is allocated as it is written, with no page fault in this process (filling
    a writable mapping instead faulted every 4 KiB page: 10.5 ms for 10 MiB against 3.2 ms
    here, measured side by side; a ``bytes`` join of the same pieces 1.5 ms). ``mapped()``
    then maps it read-only and hands the descriptor to the mapping; a writer dropped
    before that (a client gone mid-body, an error) closes its descriptor."""

    def __init__(self):
        self.fd = os.memfd_create("flowserve", os.MFD_CLOEXEC)
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
        return memoryview(map_segment(self.fd, self.size))

    def close(self) -> None:
        self._close()  # once; nothing after mapped()


def _own(m: SharedMap, fd: int) -> SharedMap:
    m.fd = fd  # closed by SharedMap.__del__
    _REAPER.start()  # here, where starting a thread is safe; it lets go of m if m is big
    m.addr = np.frombuffer(m, dtype=np.uint8).__array_interface__["data"][0]
    m.nbytes = len(m)  # len() of a mapping the reaper has closed would raise: find_shared reads this
    with _LIVE_LOCK:
        _LIVE.add(m)
    return m


class _Reaper:
    """One thread per process that lets go of big mappings: unmaps each (outside the GIL)
    and then closes its descriptor, which frees the segment's pages if no other process
    holds it. A mapping comes here from ``SharedMap.__del__``, kept alive by the queue;
    it leaves ``_LIVE`` before it is unmapped, so a new mapping at the same address is
    never taken for it. Finalizers may run anywhere (inside a lock, mid-``put``, during
    a collection): so the queue is a ``SimpleQueue`` (its ``put`` is reentrant) and the
    thread is started from ``_own``, never from a finalizer. With a backlog, or before
    the thread runs in this process (a forked child), the caller frees inline: what
    waits here is memory still held."""

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
                threading.Thread(target=self._run, args=(self._queue,), name="shm-reaper", daemon=True).start()
                self._pid = os.getpid()

    def take(self, m: SharedMap) -> bool:
        if self._pid != os.getpid() or self._queue.qsize() >= self.BACKLOG:
            return False
        self._queue.put(m)
        return True

    def _run(self, q: queue.SimpleQueue) -> None:
        while True:
            m = q.get()
            if isinstance(m, threading.Event):  # settle(): everything before it is done
                m.set()
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
        """Wait until every mapping handed over so far is let go of (tests count segments)."""
        if self._pid == os.getpid():
            done = threading.Event()
            self._queue.put(done)
            done.wait()


_REAPER = _Reaper()
settle = _REAPER.settle

_LIVE: weakref.WeakSet = weakref.WeakSet()  # this process's mapped segments
# adds and discards come from several threads; find_shared's copy of the set must not see
# it change size mid-iteration (the weak references' own removals are deferred by WeakSet)
_LIVE_LOCK = threading.Lock()
