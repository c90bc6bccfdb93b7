"""The message transport: framed streams over Unix and TCP sockets (real sockets)."""

from __future__ import annotations

import selectors
import socket
import struct
import threading
import time

import numpy as np
import pytest

from executors.wire.frames import WireError
from executors.wire.transport import (
    MAX_FRAMES,
    Outbox,
    Reader,
    accept,
    encode,
    listen,
    parse_address,
)
from flow.errors import FlowValueError
from kvs.server import free_port


def receive(listener, n: int, timeout: float = 20.0) -> list:
    """The next ``n`` messages arriving at ``listener`` (any connections)."""
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} messages arrived"
        for key, _ in sel.select(0.1):
            if key.data is None:
                while (conn := accept(listener)) is not None:
                    sel.register(conn, selectors.EVENT_READ, Reader(conn))
                continue
            messages, still_open = key.data.read()
            got += messages
            if not still_open:
                sel.unregister(key.fileobj)
                key.fileobj.close()
    for key in list(sel.get_map().values()):
        if key.data is not None:
            key.fileobj.close()
    return got


@pytest.fixture(params=["ipc", "tcp"])
def address(request, tmp_path):
    return f"ipc://{tmp_path}/t.sock" if request.param == "ipc" else f"tcp://127.0.0.1:{free_port()}"


def test_messages_arrive_whole_and_in_order(address):
    listener = listen(address)
    out = Outbox("test")
    try:
        big = np.arange(5_000_000, dtype=np.float32)  # 20 MB: more than a socket buffer holds
        sent = [[b"header-%d" % i, b"", bytes([i % 256]) * (i * 100)] for i in range(50)]
        for frames in sent[:25]:
            assert out.send(address, frames)
        assert out.send(address, [b"big", memoryview(big).cast("B")])
        for frames in sent[25:]:
            assert out.send(address, frames)  # queued behind the big one, never before it
        got = receive(listener, 51)
        expected = sent[:25] + [[b"big", big.tobytes()]] + sent[25:]
        assert [[bytes(f) for f in m] for m in got] == expected
        arr = np.frombuffer(got[25][1], dtype=np.float32)
        assert not arr.flags.writeable  # received buffers are read-only, like the sender's data
    finally:
        out.close()
        listener.close()


def test_two_peers_sending_large_messages_to_each_other_do_not_deadlock(tmp_path):
    a_addr, b_addr = f"ipc://{tmp_path}/a", f"ipc://{tmp_path}/b"
    a, b = listen(a_addr), listen(b_addr)
    out_a, out_b = Outbox("a"), Outbox("b")
    payload = b"x" * (30 << 20)
    try:
        # neither side reads until both sends returned: a blocking send would hang here
        t0 = time.monotonic()
        assert out_a.send(b_addr, [payload]) and out_b.send(a_addr, [payload])
        assert time.monotonic() - t0 < 5
        assert [bytes(m[0]) == payload for m in receive(a, 1) + receive(b, 1)] == [True, True]
    finally:
        out_a.close(), out_b.close(), a.close(), b.close()


def test_an_unreachable_peer_is_reported_and_a_restarted_one_is_reconnected(address):
    out = Outbox("test")
    try:
        assert out.send(address, [b"nobody"]) is False
        listener = listen(address)
        assert out.send(address, [b"one"])
        assert [bytes(m[0]) for m in receive(listener, 1)] == [b"one"]
        listener.close()  # the peer dies; a new one listens on the same address
        listener = listen(address)
        # the very first message after the restart arrives: over TCP a write into the dead
        # connection would be accepted by the kernel and lost
        assert out.send(address, [b"two"])
        assert [bytes(m[0]) for m in receive(listener, 1, timeout=5)] == [b"two"]
        listener.close()
    finally:
        out.close()


def test_a_message_split_into_single_bytes_is_reassembled(tmp_path):
    address = f"ipc://{tmp_path}/s"
    listener = listen(address)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(parse_address(address)[1])
    try:
        stream = b"".join(bytes(b) for b in encode([b"abc", b"", b"z" * 70_000])) * 2

        def trickle():  # every boundary falls mid-read
            for i in range(0, len(stream), 97):
                client.sendall(stream[i : i + 97])

        sender = threading.Thread(target=trickle)
        sender.start()
        got = receive(listener, 2)
        sender.join()
        assert [[bytes(f) for f in m] for m in got] == [[b"abc", b"", b"z" * 70_000]] * 2
    finally:
        client.close()
        listener.close()


@pytest.mark.parametrize(
    "head",
    [
        struct.pack("<I", 0),
        struct.pack("<I", MAX_FRAMES + 1),
        struct.pack("<IQ", 1, 1 << 40),
    ],
)
def test_a_peer_that_breaks_the_framing_is_refused(tmp_path, head):
    address = f"ipc://{tmp_path}/h"
    listener = listen(address)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(parse_address(address)[1])
    try:
        client.sendall(head)
        deadline = time.monotonic() + 10
        while (conn := accept(listener)) is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        reader = Reader(conn)
        with pytest.raises(WireError):
            while time.monotonic() < deadline:
                reader.read()
        conn.close()
    finally:
        client.close()
        listener.close()


@pytest.mark.parametrize("bad", ["zmq://x", "tcp://host", "tcp://host:port", "/tmp/x"])
def test_malformed_addresses_are_named(bad):
    with pytest.raises(FlowValueError, match="address"):
        parse_address(bad)


def test_corked_sends_leave_together_when_the_block_ends(tmp_path, caplog):
    address = f"ipc://{tmp_path}/c.sock"
    listener = listen(address)
    out = Outbox("test")
    try:
        with out.corked():
            assert out.send(address, [b"one"])
            with out.corked():  # nested: only the outermost block sends
                assert out.send(address, [b"two", b"2"])
            assert accept(listener) is None  # nothing has left yet, not even a connection
            # corking is per thread: another thread's message goes out at once
            other = threading.Thread(target=out.send, args=(address, [b"other"]))
            other.start()
            other.join()
            assert [bytes(m[0]) for m in receive(listener, 1)] == [b"other"]
        got = receive(listener, 2)
        assert [[bytes(f) for f in m] for m in got] == [[b"one"], [b"two", b"2"]]
        # a peer that cannot be reached when the block ends: dropped, logged, no exception
        with out.corked():
            assert out.send(f"ipc://{tmp_path}/nobody.sock", [b"lost"])
        assert "nobody.sock cannot be reached" in caplog.text
    finally:
        out.close()
        listener.close()


def test_send_many_delivers_every_message_in_order(address):
    listener = listen(address)
    out = Outbox("test")
    try:
        messages = [[b"m%d" % i, bytes(i)] for i in range(20)]
        assert out.send_many(address, messages)
        assert [[bytes(f) for f in m] for m in receive(listener, 20)] == messages
    finally:
        out.close()
        listener.close()


def test_a_closed_outbox_sends_nothing_and_connects_nowhere(tmp_path):
    address = f"ipc://{tmp_path}/closed.sock"
    listener = listen(address)
    out = Outbox("test")
    try:
        with out.corked():
            assert out.send(address, [b"late"])  # held until the block ends
            out.close()  # the process is stopping meanwhile
        assert out.send(address, [b"later"]) is False
        assert accept(listener) is None
    finally:
        listener.close()


def test_a_write_the_kernel_takes_in_part_leaves_the_rest_in_order():
    # plain bytes take the short way through _send_now; what the socket buffer cannot take
    # comes back as views of the rest, which the peer's backlog sends later
    from executors.wire.transport import _send_now

    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    buffers = [bytes([k]) * 100_000 for k in range(3)] + [b"", b"tail"]
    rest = _send_now(a, buffers)
    assert rest and sum(len(r) for r in rest) < sum(map(len, buffers))
    got = bytearray()
    while rest:
        try:
            got += b.recv(1 << 20)
        except BlockingIOError:
            pass
        rest = _send_now(a, [bytes(r) for r in rest])
    a.close()
    b.setblocking(True)
    while chunk := b.recv(1 << 20):
        got += chunk
    assert bytes(got) == b"".join(buffers)
