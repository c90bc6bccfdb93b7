"""Messages between the gateway and the executors: framed byte streams over Unix-domain
sockets (``ipc:///path``) or TCP (``tcp://host:port``).

Why not ZeroMQ: libzmq moves every message through an I/O thread
on each side, so one message between two processes that sleep between requests wakes
three threads. Measured on this project's machine with two processes that idle between
messages: a round trip costs 105 us over ZeroMQ IPC and 17 us over a Unix socket
(benchmarks/README.md). Serving latency is made of such hops.

A message is a list of frames (the wire format's header and buffers, see wire.py; which
messages there are: messages.py). On
the stream it is ``u32 frame count, u64 length per frame, the frames``. Limits on the
count and the total size keep a hostile or broken peer from making a receiver allocate
without bound; a peer that breaks them is disconnected (``WireError``, logged).

Sending (``Outbox``) never blocks the caller: a message goes straight into the socket
when it fits in the kernel's buffer (the common case: no thread hop); what does not fit
waits in a per-destination backlog that a writer thread drains in order. Two executors
sending large Tables to each other therefore cannot deadlock, and the gateway's event
loop never waits for a slow reader. A destination that cannot be reached (not started
yet, or dead) loses the message, as a ZeroMQ PUSH socket with no peer would keep it
forever: callers ping before they rely on a peer, and requests sent to an executor that
died are re-run by the dispatcher.

Corking (``Outbox.corked``) coalesces: inside the block, a thread's messages to one peer
leave together as one write when the block ends. An executor corks each batch and each
pass of its read loop, so the answers of a batch of N requests cost one system call and
one wake-up of the gateway instead of N; the gateway corks each turn of its event loop.
On a virtual machine a wake-up of a sleeping peer is among the dearest things a hop does.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import socket
import struct
import threading
from array import array
from collections import deque

from executors.wire import shm
from executors.wire.frames import WireError
from flow.errors import FlowValueError

log = logging.getLogger("flowserve.transport")

MAX_FRAMES = 4096
MAX_MESSAGE_BYTES = 2 << 30
_COUNT = struct.Struct("<I")
_LEN = struct.Struct("<Q")
_MSG_CTRUNC = int(socket.MSG_CTRUNC)  # an int: the enum's ``&`` is a Python call per read
_SMALL_HEADS = ["<I" + "Q" * k for k in range(17)]  # a message of k frames' head, in one pack
_ANC_SPACE = socket.CMSG_SPACE(shm.MAX_FDS * array("i").itemsize)


def parse_address(address: str):
    """``ipc:///path`` -> (AF_UNIX, path); ``tcp://host:port`` -> (AF_INET/6, (host, port))."""
    if address.startswith("ipc://"):
        return socket.AF_UNIX, address[len("ipc://") :]
    if address.startswith("tcp://"):
        host, sep, port = address[len("tcp://") :].rpartition(":")
        if not sep or not port.isdigit():
            raise FlowValueError(f"address {address!r}: expected tcp://host:port")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return family, (host, int(port))
    raise FlowValueError(f"address {address!r}: expected ipc:///path or tcp://host:port")


def listen(address: str) -> socket.socket:
    """A non-blocking listening socket bound to ``address`` (a stale socket file is removed)."""
    family, where = parse_address(address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    if family == socket.AF_UNIX:
        try:
            os.unlink(where)  # left by a process that died: binding would fail
        except FileNotFoundError:
            pass
    else:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(where)
    sock.listen(512)
    sock.setblocking(False)
    return sock


def accept(listener: socket.socket) -> socket.socket | None:
    try:
        conn, _ = listener.accept()
    except (BlockingIOError, InterruptedError):
        return None
    conn.setblocking(False)
    _tune(conn)
    return conn


def _tune(sock: socket.socket) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def encode(frames, local: bool = False) -> list:
    """The buffers that put ``frames`` on a stream (the frames themselves are not copied).

    ``local`` (a Unix socket): frames of at least ``shm.SHM_MIN_BYTES`` travel as shared
    memory (shm.py): their length has the top bit set, the stream carries a 16-byte
    (offset, length) descriptor instead of the bytes, and an ``_Fds`` marker ahead of the
    message's head makes the segments' descriptors leave with its first byte."""
    if len(frames) < len(_SMALL_HEADS) and all(type(f) is bytes and len(f) < shm.SHM_MIN_BYTES for f in frames):
        # the usual message (a header and a small body or table): lengths without views
        return [struct.pack(_SMALL_HEADS[len(frames)], len(frames), *map(len, frames)), *frames]
    head = bytearray(_COUNT.pack(len(frames)))
    if not local or not any(memoryview(f).nbytes >= shm.SHM_MIN_BYTES for f in frames):
        for f in frames:
            head += _LEN.pack(memoryview(f).nbytes)
        return [bytes(head), *frames]
    marker = _Fds()
    out: list = []
    for f in frames:
        view = memoryview(f)
        if view.nbytes < shm.SHM_MIN_BYTES:
            head += _LEN.pack(view.nbytes)
            out.append(f)
            continue
        view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        found = shm.find_shared(view)
        if found is not None:  # already in a segment: a reference to it, no copy
            segment, offset = found
            marker.add(segment.fd, segment)
        else:
            fd, _size = shm.new_segment(view)
            marker.add(fd, None)
            offset = 0
        head += _LEN.pack(_SHARED | _SHM_DESC.size)
        out.append(_SHM_DESC.pack(offset, view.nbytes))
    return [marker, bytes(head), *out]


_SHARED = 1 << 63  # a frame length with this bit: the frame is in shared memory (encode)
_SHM_DESC = struct.Struct("<QQ")  # offset, length in the segment


class _Fds:
    """Descriptors that must leave with the next bytes sent (SCM_RIGHTS). Owns the ones
    it created (closed when the marker is dropped: sent or not); holds the mappings of
    the ones it borrows open until then."""

    __slots__ = ("fds", "_own", "_keep", "__weakref__")

    def __init__(self):
        self.fds: list[int] = []
        self._own: list[int] = []
        self._keep: list = []

    def add(self, fd: int, keep) -> None:
        self.fds.append(fd)
        if keep is None:
            self._own.append(fd)
        else:
            self._keep.append(keep)

    def __del__(self):
        for fd in self._own:
            try:
                os.close(fd)
            except OSError:
                pass
        self._own = []


def _rights(markers: list) -> list:
    fds = [fd for m in markers for fd in m.fds]
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array("i", fds))] if fds else []


class Reader:
    """Reassembles messages from one connection's bytes, reading straight into each
    frame's own buffer (a 10 MB frame is received once, into its final place)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._head = bytearray()
        self._lengths: list[int] | None = None
        self._frames: list = []
        self._current: memoryview | None = None
        self._filled = 0
        self._shared: set = set()  # indexes of the current message's shared frames
        # a Unix socket may bring segments' descriptors (shm.py): read with recvmsg and
        # keep them, in order, until the frames that name them are parsed
        self._local = sock.family == socket.AF_UNIX
        self._fds: deque = deque()

    def _recv(self, size: int) -> bytes:
        if not self._local:
            return self.sock.recv(size)
        data, anc, flags, _ = self.sock.recvmsg(size, _ANC_SPACE)
        self._take_fds(anc, flags)
        return data

    def _recv_into(self, view: memoryview) -> int:
        if not self._local:
            return self.sock.recv_into(view)
        n, anc, flags, _ = self.sock.recvmsg_into([view], _ANC_SPACE)
        self._take_fds(anc, flags)
        return n

    def _take_fds(self, anc: list, flags: int) -> None:
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self._fds.extend(fds)
        if flags & _MSG_CTRUNC:
            raise WireError(f"a peer sent more than {shm.MAX_FDS} descriptors in one message")

    def close(self) -> None:
        """Close the descriptors received for frames not yet parsed."""
        while self._fds:
            try:
                os.close(self._fds.popleft())
            except OSError:
                pass

    def __del__(self):
        self.close()

    def read(self) -> tuple[list, bool]:
        """Messages completed by what the socket has now, and whether it is still open."""
        out = []
        while True:
            try:
                if self._current is not None:
                    n = self._recv_into(self._current[self._filled :])
                else:
                    chunk = self._recv(65536)
                    n = len(chunk)
            except (BlockingIOError, InterruptedError):
                return out, True
            except OSError:
                return out, False
            if n == 0:
                return out, False
            if self._current is not None:
                wanted = len(self._current) - self._filled
                self._filled += n
                if self._filled == len(self._current):
                    self._frame_done(out)
            else:
                wanted = 65536
                self._head += chunk
                self._parse_head(out)
            if n < wanted:
                # the socket is drained for now: the selector (level-triggered) reports it
                # again when more comes, so no read just to see EAGAIN
                return out, True

    def _parse_head(self, out: list) -> None:
        while True:
            if self._lengths is None:
                if len(self._head) < 4:
                    return
                (count,) = _COUNT.unpack_from(self._head)
                if not 0 < count <= MAX_FRAMES:
                    raise WireError(f"message with {count} frames (at most {MAX_FRAMES})")
                need = 4 + 8 * count
                if len(self._head) < need:
                    return
                lengths = list(_lengths_struct(count).unpack_from(self._head, 4))
                self._shared = {i for i, length in enumerate(lengths) if length & _SHARED}
                for i in self._shared:
                    if lengths[i] != _SHARED | _SHM_DESC.size:
                        raise WireError(f"shared frame with a {lengths[i] & ~_SHARED}-byte descriptor")
                    lengths[i] = _SHM_DESC.size
                if sum(lengths) > MAX_MESSAGE_BYTES:
                    raise WireError(f"message of {sum(lengths)} bytes (at most {MAX_MESSAGE_BYTES})")
                del self._head[:need]
                self._lengths, self._frames = lengths, []
            # frames: take what the head buffer already holds, then read the rest in place
            while len(self._frames) < len(self._lengths):
                size = self._lengths[len(self._frames)]
                if len(self._head) >= size:
                    frame = bytes(self._head[:size])
                    del self._head[:size]
                    if self._shared and len(self._frames) in self._shared:
                        frame = self._map(frame)
                    self._frames.append(frame)
                    continue
                buf = bytearray(size)
                have = len(self._head)
                buf[:have] = self._head
                self._head.clear()
                self._current, self._filled = memoryview(buf), have
                return
            out.append(self._frames)
            self._lengths, self._frames = None, []

    def _map(self, desc: bytes) -> memoryview:
        """A shared frame: its segment's descriptor (received, in order) mapped read-only."""
        offset, length = _SHM_DESC.unpack(desc)
        if not self._fds:
            raise WireError("a shared frame came without its segment's descriptor")
        if length > MAX_MESSAGE_BYTES:
            raise WireError(f"shared frame of {length} bytes (at most {MAX_MESSAGE_BYTES})")
        try:
            segment = shm.map_segment(self._fds.popleft(), offset + length)
        except (OSError, ValueError) as e:
            raise WireError(f"shared frame: {e}") from None
        return memoryview(segment)[offset : offset + length]

    def _frame_done(self, out: list) -> None:
        # read-only, like a received ZeroMQ frame: arrays built on it must not be written
        frame = self._current.toreadonly()
        if self._shared and len(self._frames) in self._shared:  # its descriptor came in pieces
            frame = self._map(bytes(frame))
        self._frames.append(frame)
        self._current, self._filled = None, 0
        if len(self._frames) == len(self._lengths):
            out.append(self._frames)
            self._lengths, self._frames = None, []
        self._parse_head(out)


class Outbox:
    """Connections to other processes, one per destination, shared by every thread."""

    def __init__(self, name: str = "outbox"):
        self.name = name
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer] = {}
        self._local = threading.local()  # .pending: address -> buffers, while corked
        self._closed = False

    def send(self, address: str, frames) -> bool:
        """Queue ``frames`` for ``address``; False if the peer cannot be reached now (while
        corked: True, and a peer found unreachable at the end of the block is logged)."""
        pending = getattr(self._local, "pending", None)
        local = address.startswith("ipc://")
        if pending is not None:
            pending.setdefault(address, []).extend(encode(frames, local))
            return True
        return self._send_buffers(address, encode(frames, local))

    def send_many(self, address: str, messages: list) -> bool:
        """Send several messages to one peer with one write."""
        local = address.startswith("ipc://")
        return self._send_buffers(address, [b for frames in messages for b in encode(frames, local)])

    def corked(self) -> _Cork:
        """This thread's sends inside the block leave at its end, one write per peer."""
        return _Cork(self)

    def _send_buffers(self, address: str, buffers: list) -> bool:
        with self._lock:
            if self._closed:  # e.g. a worker's corked answers after shutdown: no new connection
                return False
            peer = self._peers.get(address)
            if peer is None:
                peer = self._peers[address] = _Peer(address, self.name)
        return peer.send(buffers)

    def forget(self, address: str) -> None:
        with self._lock:
            peer = self._peers.pop(address, None)
        if peer is not None:
            peer.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            peers, self._peers = list(self._peers.values()), {}
        for p in peers:
            p.close()


class _Cork:
    """``Outbox.corked``'s block: a class rather than a generator context, as an executor
    enters one per stage run (a generator's context costs several times more)."""

    __slots__ = ("outbox", "outer")

    def __init__(self, outbox: Outbox):
        self.outbox = outbox
        self.outer = False

    def __enter__(self) -> None:
        local = self.outbox._local
        if getattr(local, "pending", None) is not None:  # nested: the outer block sends
            self.outer = True
        else:
            local.pending = {}

    def __exit__(self, *exc) -> None:
        if self.outer:
            return
        outbox = self.outbox
        pending, outbox._local.pending = outbox._local.pending, None
        for address, buffers in pending.items():
            if not outbox._send_buffers(address, buffers):
                log.warning("%s: %s cannot be reached; messages to it were dropped", outbox.name, address)


class _Peer:
    def __init__(self, address: str, owner: str):
        self.address = address
        self.owner = owner
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        # TCP, where a restarted peer's dead connection must be checked before each write
        # (send): known from the address, not asked of the socket each time
        self.tcp = not address.startswith("ipc://")
        self.backlog: deque = deque()  # memoryviews still to send, in order
        self.wake = threading.Condition(self.lock)
        self.writer: threading.Thread | None = None
        self.closed = False

    def _connect(self) -> bool:
        family, where = parse_address(self.address)
        sock = socket.socket(family, socket.SOCK_STREAM)
        # bounded: the caller may be the gateway's event loop (local and in-cluster peers
        # answer or refuse within milliseconds; a blackholed address must not stall it long)
        sock.settimeout(1.0)
        try:
            sock.connect(where)
        except OSError as e:
            sock.close()
            log.debug("%s: cannot reach %s: %s", self.owner, self.address, e)
            return False
        _tune(sock)
        sock.setblocking(False)
        self.sock = sock
        return True

    def send(self, buffers: list) -> bool:
        with self.lock:
            if self.closed:
                return False
            if self.sock is None and not self._connect():
                return False
            if self.backlog:
                self.backlog.extend(b if isinstance(b, _Fds) else memoryview(b).cast("B") for b in buffers)
                return True
            if self.tcp and _peer_closed(self.sock):
                # the peer restarted since the last message (same address): over TCP the
                # first write to the dead connection would be accepted and then lost (over a
                # Unix socket that write fails at once, and is retried below)
                self._drop()
                if not self._connect():
                    return False
            try:
                rest = _send_now(self.sock, buffers)
            except OSError:
                # the peer went away (e.g. restarted): one fresh connection, then give up
                self._drop()
                if not self._connect():
                    return False
                try:
                    rest = _send_now(self.sock, buffers)
                except OSError as e:
                    log.warning("%s: sending to %s failed: %s", self.owner, self.address, e)
                    self._drop()
                    return False
            if rest:
                self.backlog.extend(rest)
                self._start_writer()
            return True

    def _start_writer(self) -> None:
        if self.writer is None:
            self.writer = threading.Thread(target=self._drain, name=f"send-{self.address}", daemon=True)
            self.writer.start()
        self.wake.notify()

    def _drain(self) -> None:
        """The writer thread: sends the backlog in order, blocking only itself. While the
        backlog is not empty senders only append to it, so this thread alone uses the socket."""
        while True:
            with self.lock:
                while not self.backlog and not self.closed:
                    self.wake.wait()
                if self.closed:
                    return
                markers = []  # descriptors that leave with the next bytes
                while self.backlog and isinstance(self.backlog[0], _Fds):
                    markers.append(self.backlog.popleft())
                if not self.backlog:
                    continue
                sock, head = self.sock, self.backlog[0]
                if sock is None:
                    self.backlog.clear()
                    continue
            try:
                sock.settimeout(None)
                n = sock.sendmsg([head], _rights(markers)) if markers else sock.send(head)
            except OSError as e:
                with self.lock:
                    log.warning("%s: sending to %s failed: %s", self.owner, self.address, e)
                    self.backlog.clear()
                    self._drop()
                continue
            with self.lock:
                if self.backlog and self.backlog[0] is head:
                    if n >= head.nbytes:
                        self.backlog.popleft()
                    else:
                        self.backlog[0] = head[n:]
                if not self.backlog and self.sock is sock:
                    sock.setblocking(False)  # direct sends again

    def _drop(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.backlog.clear()
            self._drop()
            self.wake.notify_all()


def _peer_closed(sock: socket.socket) -> bool:
    """True if the other end has closed this connection (we never read from it, so any
    readable state means end-of-stream or an error)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def _send_now(sock: socket.socket, buffers: list) -> list:
    """Send what the kernel takes now; the unsent rest as memoryviews (empty: all sent)."""
    if all(type(b) is bytes for b in buffers) and len(buffers) <= 512:
        # the usual write (no descriptors, a few buffers): sent as they are, if it all goes
        try:
            n = sock.sendmsg(buffers)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise
            n = 0
        if n == sum(map(len, buffers)):
            return []
        return _unsent(buffers, n)
    views = [b if isinstance(b, _Fds) else memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if isinstance(v, _Fds) or v.nbytes]
    while views:
        markers = None
        if any(isinstance(v, _Fds) for v in views[:512]):
            # descriptors leave with the first byte of this call: the markers in its range go now
            batch = views[:512]
            markers = [v for v in batch if isinstance(v, _Fds)]
            batch = [v for v in batch if not isinstance(v, _Fds)]
            if not batch:
                return []  # markers with no bytes after them: nothing names them
        try:
            if markers is None:
                n = sock.sendmsg(views[:512])  # IOV_MAX is 1024 on Linux
            else:
                n = sock.sendmsg(batch, _rights(markers))
        except (BlockingIOError, InterruptedError):
            return views
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return views
            raise
        if markers is not None:
            sent = set(map(id, markers))
            views = [v for v in views if id(v) not in sent]
        while n and views:
            if n >= views[0].nbytes:
                n -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][n:]
                n = 0
    return []


@functools.lru_cache(maxsize=64)
def _lengths_struct(count: int) -> struct.Struct:
    """The ``count`` frame lengths of a message's head, read in one call."""
    return struct.Struct("<" + "Q" * count)


def _unsent(buffers: list, n: int) -> list:
    """What is left of ``buffers`` (bytes) after the first ``n`` bytes went, as memoryviews."""
    rest = []
    for b in buffers:
        if n >= len(b):
            n -= len(b)
            continue
        rest.append(memoryview(b)[n:])
        n = 0
    return rest
