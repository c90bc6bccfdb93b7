"""Big buffers between processes on one host without copies: memfd segments whose file
descriptors travel over the Unix socket (SCM_RIGHTS) beside the message that names them.

Over a local (``ipc://``) connection, a frame of at least ``SHM_MIN_BYTES`` does not go
through the socket: the transport (transport.py) sends a 16-byte descriptor (offset,
length) in its place and the segment's descriptor in the same ``sendmsg``; the receiver
maps the segment read-only and hands the frame on as a memoryview of the mapping, so
``np.frombuffer`` in wire.py builds the column on it without a copy.

A frame that already lies in a received segment (a stage passing its input on, a Table
the gateway got back from an executor) is sent as a reference to that same segment: no
copy at all. Any other frame is copied once into a fresh segment (over the socket it was
copied four times: into the kernel and out of it, there and back).

Lifetimes cannot leak, by construction: a memfd has no name in any file system (nothing
in /dev/shm to clean up), and the kernel frees it when its last descriptor and its last
mapping are gone, including those of a process killed with SIGKILL and those still in
flight in a socket whose reader died. A process holds a descriptor only while a mapping
of it is alive (``SharedMap``: closed when the mapping is collected).
"""

from __future__ import annotations

import mmap
import os
import weakref

import numpy as np

SHM_MIN_BYTES = 1 << 20  # below this a socket copy is cheaper than a segment (syscalls, page faults)
MAX_FDS = 64  # descriptors one read may bring (the ancillary buffer's room)


class SharedMap(mmap.mmap):
    """A read-only mapping of a received (or created) segment, with the descriptor that
    can send it on; the descriptor is closed when the mapping is collected."""

    fd: int
    addr: int


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
    m.fd = fd
    m.addr = np.frombuffer(m, dtype=np.uint8).__array_interface__["data"][0]
    weakref.finalize(m, os.close, fd)
    return m


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
    """The segment ``view``'s bytes already lie in and their offset there, or None.

    Follows what the buffer was made from (memoryview -> numpy array -> ... -> mapping),
    as wire.py builds columns on received frames."""
    obj = view.obj
    for _ in range(16):
        if isinstance(obj, SharedMap):
            try:
                start = np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]
            except (ValueError, TypeError):
                return None
            offset = start - obj.addr
            if 0 <= offset and offset + view.nbytes <= len(obj):
                return obj, offset
            return None
        if isinstance(obj, np.ndarray):
            obj = obj.base
        elif isinstance(obj, memoryview):
            obj = obj.obj
        else:
            return None
    return None
