"""Big frames over local sockets travel as shared memory (executors/wire/shm.py): the bytes
arrive intact, a frame already shared is sent on without a copy, and no segment outlives
the processes that hold it, kill -9 included. Real sockets, real processes."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import numpy as np
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from executors.wire import shm
from executors.wire.frames import WireError
from executors.wire.messages import StageInput, decode
from executors.wire.transport import Outbox, Reader, accept, listen
from flow import ColumnType, Flow
from flow.table import Table
from tests.executors.processes import wait_until
from tests.executors.test_runtime_paths import _executor_pids
from tests.executors.test_transport import receive

MB = 1 << 20


def segments(pid: int | str = "self") -> int:
    """Descriptors and mappings of flowserve segments the process holds; in this process,
    once the keeper thread is done, the fresh ones in stock (shm._Stock) left out."""
    stocked = 0
    if pid == "self":
        shm.settle()
        stocked = shm._STOCK.stocked()
    fds = -stocked
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            fds += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:flowserve")
        except OSError:
            pass
    with open(f"/proc/{pid}/maps") as f:
        maps = sum("memfd:flowserve" in line for line in f)
    return fds + maps


def test_a_big_frame_travels_as_shared_memory_and_arrives_intact(tmp_path):
    assert segments() == 0
    address = f"ipc://{tmp_path}/s.sock"
    listener, out = listen(address), Outbox("test")
    try:
        big = np.random.default_rng(0).integers(0, 255, 3 * MB, dtype=np.uint8)
        small = b"x" * (shm.SHM_MIN_BYTES - 1)
        assert out.send(address, [b"head", memoryview(big), small])
        (got,) = receive(listener, 1)
        assert bytes(got[0]) == b"head" and bytes(got[2]) == small
        assert isinstance(got[1].obj, shm.SharedMap)  # mapped, not read from the socket
        assert got[1].readonly
        assert np.array_equal(np.frombuffer(got[1], dtype=np.uint8), big)
        assert segments() > 0
        del got
        gc.collect()
        assert segments() == 0  # the mapping gone, its descriptor closed with it
    finally:
        out.close()
        listener.close()


def test_a_big_frame_over_tcp_is_sent_inline(tmp_path):
    from kvs.server import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    listener, out = listen(address), Outbox("test")
    try:
        big = np.arange(MB, dtype=np.float32)
        assert out.send(address, [b"h", memoryview(big).cast("B")])
        (got,) = receive(listener, 1)
        assert not isinstance(getattr(got[1], "obj", None), shm.SharedMap)
        assert bytes(got[1]) == big.tobytes()
        assert segments() == 0
    finally:
        out.close()
        listener.close()


def test_a_shared_column_is_sent_on_without_a_copy(tmp_path):
    """A Table decoded from a shared frame and sent on names the same segment: the
    stage that passes its input on (or the gateway's answer) copies nothing."""
    a, b = f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock"
    la, lb, out = listen(a), listen(b), Outbox("test")
    try:
        table = Table.from_dict({"x": np.ones((1, 2 * MB), dtype=np.uint8)})
        msg = StageInput(
            req=1, attempt=0, flow="f", version=1, stage="s0", source="gw", routes={}, gateway="ipc://gw", table=table
        )
        assert out.send(a, msg.encode())
        (frames,) = receive(la, 1)
        first = decode(frames)
        (col,) = [f for f in frames if isinstance(getattr(f, "obj", None), shm.SharedMap)]
        assert out.send(b, first.encode())  # forwarded: the same column, now in shared memory
        (frames2,) = receive(lb, 1)
        second = decode(frames2)
        (col2,) = [f for f in frames2 if isinstance(getattr(f, "obj", None), shm.SharedMap)]
        assert os.fstat(col.obj.fd).st_ino == os.fstat(col2.obj.fd).st_ino  # one segment, two mappings
        assert np.array_equal(second.table["x"], table["x"])
    finally:
        out.close()
        la.close()
        lb.close()


def test_a_broken_descriptor_frame_is_refused(tmp_path):
    """A shared frame whose segment never came (a hostile or broken local peer) breaks
    the framing: the connection is refused, nothing is mapped."""
    import socket
    import struct

    address = f"ipc://{tmp_path}/s.sock"
    listener = listen(address)
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(address[len("ipc://") :])
        s.sendall(struct.pack("<IQ", 1, (1 << 63) | 16) + struct.pack("<QQ", 0, MB))
        conn = None
        while conn is None:
            conn = accept(listener)
        conn.setblocking(True)
        with pytest.raises(WireError, match="without its segment"):
            Reader(conn).read()
        s.close()
        conn.close()
    finally:
        listener.close()


_SENDER = textwrap.dedent(
    """
    import sys, numpy as np
    from executors.wire.transport import Outbox
    out = Outbox("child")
    big = np.full(4 << 20, 7, dtype=np.uint8)
    while True:  # until killed
        if not out.send(sys.argv[1], [b"h", memoryview(big)]):
            break
    """
)

_HOLDER = textwrap.dedent(
    """
    import selectors, sys, time
    from executors.wire.transport import Reader, accept, listen
    listener = listen(sys.argv[1])
    held = []
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    print("up", flush=True)
    while True:  # hold every frame until killed
        for key, _ in sel.select():
            if key.data is None:
                conn = accept(listener)
                if conn is not None:
                    sel.register(conn, selectors.EVENT_READ, Reader(conn))
                continue
            messages, _open = key.data.read()
            held += messages
            if messages:
                print("holding", len(held), flush=True)
    """
)


def _child(code: str, arg: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    return subprocess.Popen([sys.executable, "-c", code, arg], env=env, stdout=subprocess.PIPE, text=True)


def test_kill_9_of_a_sender_leaves_no_segment_behind(tmp_path):
    """A sender killed mid-stream: what arrived is whole, and once this process drops it
    nothing holds a segment (the killed one's are the kernel's to free)."""
    address = f"ipc://{tmp_path}/s.sock"
    listener = listen(address)
    child = _child(_SENDER, address)
    try:
        got = receive(listener, 5)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert all(np.all(np.frombuffer(m[1], dtype=np.uint8) == 7) for m in got)
        del got
        gc.collect()
        shm.settle()  # 4 MiB frames: let go of on the reaper thread
        assert segments() == 0
    finally:
        child.kill()
        listener.close()


def test_kill_9_of_a_receiver_holding_segments_leaves_none_behind(tmp_path):
    """This process sends big frames to a process that maps and holds them; killed with
    SIGKILL, it takes them with it: the sender holds none (it closed its descriptors
    once sent), so no process does."""
    address = f"ipc://{tmp_path}/h.sock"
    child = _child(_HOLDER, address)
    out = Outbox("test")
    try:
        assert child.stdout.readline().strip() == "up"
        big = np.full(2 * MB, 3, dtype=np.uint8)
        for _ in range(5):
            assert out.send(address, [b"h", memoryview(big)])
        wait_until("the holder to map 5 frames", lambda: child.stdout.readline().strip() == "holding 5")
        assert segments(child.pid) >= 5
        assert segments() == 0
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert not os.path.exists(f"/proc/{child.pid}/maps") or segments(child.pid) == 0
    finally:
        child.kill()
        out.close()


def _noop(table):
    return table["x"]


def test_a_cluster_serves_big_tensors_over_shared_memory_and_kill_9_leaks_nothing(monkeypatch):
    """10-stage chains of big tensors over HTTP (unfused and spread: every stage a hop):
    the answers are flow.run's; an executor killed with SIGKILL under that load loses no
    request, and once the cluster is idle no process of it holds a segment (big enough
    that every process lets go of them on its keeper thread, and fills stocked ones:
    the stock is let go of once idle, here after half a second)."""
    monkeypatch.setenv("FLOWSERVE_SHM_STOCK_IDLE_S", "0.5")
    n = shm.REAP_MIN_BYTES
    f = Flow("big", schema={"x": ColumnType.tensor(np.uint8, (n,))})
    node = f
    for _ in range(4):
        node = node.map(_noop, names=["x"], batching=True)
    x = np.arange(n, dtype=np.uint8)
    import pyarrow as pa

    t = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x), n)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    body = sink.getvalue().to_pybytes()
    arrow = "application/vnd.apache.arrow.stream"
    with LocalCluster(ClusterConfig(executors=2, colocate=False, request_timeout_s=30, max_retries=3)) as c:
        d = c.deploy(f, optimize=False)
        expected = f.run([{"x": x}])["x"][0]
        results, errors = [], []
        go = threading.Event()

        def client():
            with httpx.Client(timeout=60) as http:
                for i in range(12):
                    r = http.post(d.url, content=body, headers={"Content-Type": arrow, "Accept": arrow})
                    if r.status_code != 200:
                        errors.append(r.text)
                        continue
                    got = pa.ipc.open_stream(r.content).read_all().column("x").combine_chunks().to_numpy_ndarray()[0]
                    results.append(np.array_equal(got, expected))
                    if i == 2:
                        go.set()

        threads = [threading.Thread(target=client) for _ in range(3)]
        for th in threads:
            th.start()
        assert go.wait(60)
        os.kill(_executor_pids(c)[0], signal.SIGKILL)
        for th in threads:
            th.join(120)
        assert not errors, errors[:2]
        assert len(results) == 36 and all(results)
        gateway = int(
            subprocess.run(
                ["pgrep", "-f", f"executors.hosts.local_gateway --dir {c.dir}"], capture_output=True, text=True
            ).stdout.split()[0]
        )

        def idle():
            pids = [gateway, *_executor_pids(c)]
            return all(segments(p) == 0 for p in pids)

        try:
            wait_until("no process of the cluster to hold a segment", idle, timeout=30)
        except AssertionError as e:
            held = {p: segments(p) for p in [gateway, *_executor_pids(c)]}
            raise AssertionError(f"{e}: segments held by pid (gateway {gateway}): {held}") from None


# -- the gateway's side: a request body written into a segment, an answer sent from one --


def _address(view) -> int:
    return np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]


def test_a_body_segment_holds_the_pieces_written_and_is_live_for_the_transport():
    data = np.random.default_rng(1).integers(0, 255, 3 * MB + 5, dtype=np.uint8).tobytes()
    writer = shm.SegmentWriter()
    for i in range(0, len(data), 65536):
        writer.write(data[i : i + 65536])
    view = writer.mapped()
    assert view.readonly and bytes(view) == data
    found = shm.find_shared(view[MB:])  # a column built on the body is found in its segment
    assert found is not None and found[1] == MB
    del view, found, writer
    gc.collect()
    assert segments() == 0


def test_a_big_mapping_is_let_go_of_on_the_reaper_thread_and_a_small_one_at_once():
    """Freeing a big segment's pages costs milliseconds: the caller (an event loop, an IO
    thread) only hands the mapping over; the reaper unmaps it and closes the descriptor."""
    before = shm._KEEPER.reaped
    small = shm.SegmentWriter()
    small.write(b"s" * MB)
    view = small.mapped()
    del small, view
    gc.collect()
    assert segments() == 0 and shm._KEEPER.reaped == before  # inline: gone at once

    big = shm.SegmentWriter()
    data = np.random.default_rng(2).integers(0, 255, shm.REAP_MIN_BYTES, dtype=np.uint8).tobytes()
    big.write(data)
    view = big.mapped()
    del big
    assert bytes(view[-MB:]) == data[-MB:] and segments() > 0
    del view
    gc.collect()
    shm.settle()
    assert shm._KEEPER.reaped == before + 1 and segments() == 0


def test_the_reaper_lets_go_of_a_mapping_whose_views_are_still_alive_and_lives_on():
    """A collected cycle's finalizers run before the cycle is cleared, so a mapping can
    reach the reaper while a view of it is still alive: it closes the descriptor, leaves
    the mapping (and the view's bytes) to go with the view, and serves the next one."""
    reaper = shm._Keeper()
    reaper.start()
    w = shm.SegmentWriter()
    w.write(b"v" * shm.REAP_MIN_BYTES)
    view = w.mapped()
    del w
    held = view.obj
    assert reaper.take(held)
    reaper.settle()
    assert reaper.reaped == 1 and held.fd == -1
    assert bytes(view[:2]) == b"vv"  # the mapping is intact under its view
    del held, view
    gc.collect()
    assert segments() == 0  # the mapping went with its last view, the descriptor before it
    w = shm.SegmentWriter()
    w.write(b"n" * shm.REAP_MIN_BYTES)
    second = w.mapped().obj
    del w
    assert reaper.take(second)
    reaper.settle()
    assert reaper.reaped == 2


def test_many_big_mappings_dropped_at_once_all_end_up_freed():
    """More mappings than the reaper's queue holds, dropped together: the overflow is freed
    inline, the rest by the reaper; none is left behind and none is closed twice."""
    before = shm._KEEPER.reaped
    views = []
    for i in range(40):
        w = shm.SegmentWriter()
        w.write(bytes([i]) * shm.REAP_MIN_BYTES)
        views.append(w.mapped())
    assert [v[0] for v in views] == list(range(40))
    views.clear()
    gc.collect()
    shm.settle()
    assert segments() == 0
    assert 0 < shm._KEEPER.reaped - before <= 40


def test_a_body_segment_dropped_unfinished_or_empty_holds_nothing():
    writer = shm.SegmentWriter()
    writer.write(b"x" * MB)
    assert segments() == 1
    del writer  # a client gone mid-body, an error while reading: no descriptor left
    gc.collect()
    assert segments() == 0
    empty = shm.SegmentWriter()
    assert bytes(empty.mapped()) == b"" and segments() == 0


def test_a_big_arrow_answer_is_pieces_that_share_the_columns_memory():
    """arrow_answer: the same bytes as arrow_bytes, but the big buffer is a view of the
    column itself (no copy on the way to the socket); a small answer stays one bytes."""
    import pyarrow as pa

    from executors.codec.bodies import arrow_answer, arrow_bytes

    x = np.random.default_rng(2).standard_normal((2, MB // 4)).astype(np.float32)
    table = Table.from_dict({"x": x, "k": np.array([1, 2])})
    pieces = arrow_answer(table)
    assert isinstance(pieces, list)
    assert b"".join(bytes(p) for p in pieces) == arrow_bytes(table)
    (big,) = [p for p in pieces if memoryview(p).nbytes >= 64 * 1024]
    assert _address(big) == _address(memoryview(table["x"]).cast("B"))
    got = pa.ipc.open_stream(b"".join(bytes(p) for p in pieces)).read_all()
    assert np.array_equal(got.column("x").combine_chunks().to_numpy_ndarray(), x)
    small = Table.from_dict({"k": np.array([1, 2])})
    assert arrow_answer(small) == arrow_bytes(small)


def test_a_client_gone_mid_body_leaves_no_segment_in_the_gateway(monkeypatch):
    """A big Arrow body is written into a segment as it arrives; the client closing the
    connection halfway leaves the gateway holding none (once its stock, made for the next
    body of that size, is let go of: here after half a second idle)."""
    monkeypatch.setenv("FLOWSERVE_SHM_STOCK_IDLE_S", "0.5")
    import socket
    from urllib.parse import urlsplit

    f = Flow("sink", schema={"x": ColumnType.tensor(np.uint8, (4 * MB,))})
    f.map(_noop, names=["x"], batching=True)
    with LocalCluster(ClusterConfig(executors=1)) as c:
        d = c.deploy(f)
        gateway = int(
            subprocess.run(
                ["pgrep", "-f", f"executors.hosts.local_gateway --dir {c.dir}"], capture_output=True, text=True
            ).stdout.split()[0]
        )
        url = urlsplit(d.url)
        s = socket.create_connection((url.hostname, url.port))
        head = (
            f"POST {url.path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/vnd.apache.arrow.stream\r\n"
            f"Content-Length: {4 * MB}\r\n\r\n"
        )
        s.sendall(head.encode() + b"\0" * (2 * MB))
        wait_until("the gateway to read the body into a segment", lambda: segments(gateway) > 0)
        s.close()
        wait_until("the gateway to drop the segment", lambda: segments(gateway) == 0)


# -- the stock: fresh segments made ahead of need (shm._Stock) --------------------------------


def test_a_body_of_a_size_seen_before_is_written_into_a_stocked_segment_and_reads_back_exactly():
    """The first body of a size is a miss (a segment made as it is written) and stocks
    nothing; the second is a miss too, and asks the keeper for STOCK_DEPTH of that size;
    the next ones are written into those, whose pages exist. A stocked segment is rounded
    up (stock_size): the view is the body, no more."""
    n = 3 * MB + 12345
    assert shm.stock_size(n) > n
    _empty_stock()
    hits, misses = shm._STOCK.hits, shm._STOCK.misses
    bodies = [np.random.default_rng(i).integers(0, 255, n, dtype=np.uint8).tobytes() for i in range(4)]
    views = []
    for i, data in enumerate(bodies):
        writer = shm.SegmentWriter(n)
        for at in range(0, n, 65536):
            writer.write(data[at : at + 65536])
        views.append(writer.mapped())
        shm.settle()  # the keeper has made what this one asked for
        assert shm._STOCK.stocked() == (0 if i == 0 else shm.STOCK_DEPTH)
    assert (shm._STOCK.hits - hits, shm._STOCK.misses - misses) == (2, 2)
    for view, data in zip(views, bodies):
        assert view.readonly and view.nbytes == n and bytes(view) == data
        found = shm.find_shared(view[MB:])
        assert found is not None and found[1] == MB
    assert len({_address(v) for v in views}) == 4  # four segments, none handed out twice
    del views, view, found
    gc.collect()
    assert segments() == 0  # used ones gone; the stock (refilled) is left out of the count
    assert shm._STOCK.stocked() == shm.STOCK_DEPTH


def test_a_frame_copied_into_a_stocked_segment_arrives_intact(tmp_path):
    """new_segment (a frame not yet in shared memory) fills a stocked segment bigger than
    the frame; the receiver maps the whole segment and reads the frame's bytes only."""
    address = f"ipc://{tmp_path}/s.sock"
    listener, out = listen(address), Outbox("test")
    n = 2 * MB + 7
    _empty_stock()
    try:
        got_all = []
        for seed in range(4):
            big = np.random.default_rng(seed).integers(0, 255, n, dtype=np.uint8)
            hits = shm._STOCK.hits
            assert out.send(address, [b"head", memoryview(big)])
            (got,) = receive(listener, 1)
            assert got[1].nbytes == n and np.array_equal(np.frombuffer(got[1], dtype=np.uint8), big)
            if seed >= 2:  # stocked from the second frame of this size on
                assert shm._STOCK.hits == hits + 1
                assert len(got[1].obj) == shm.stock_size(n)  # the whole stocked segment is mapped
            got_all.append(got)
            shm.settle()
        del got_all, got
    finally:
        out.close()
        listener.close()
    gc.collect()
    assert segments() == 0


def test_bodies_of_ever_new_sizes_stock_nothing_and_are_not_remembered_without_bound(monkeypatch):
    _empty_stock()
    monkeypatch.setattr(shm, "ASKED_MAX", 4)
    for k in range(10):
        shm.SegmentWriter(MB + k * MB // 2).close()  # each its own stock_size
    shm.settle()
    assert shm._STOCK.stocked() == 0 and shm._STOCK.held == 0
    assert len(shm._STOCK._asked) <= 4


def test_the_stock_of_a_size_nobody_asks_for_is_let_go_of():
    n = 5 * MB
    _empty_stock()
    for _ in range(2):
        shm.SegmentWriter(n).close()
    shm.settle()
    size = shm.stock_size(n)
    assert shm._STOCK.stocked() >= shm.STOCK_DEPTH and shm._STOCK.held >= size * shm.STOCK_DEPTH
    shm._STOCK.let_go_idle(time.monotonic() + shm.STOCK_IDLE_S)  # as the keeper does once idle
    assert shm._STOCK.stocked() == 0 and shm._STOCK.held == 0
    fds = [fd for fd in os.listdir("/proc/self/fd") if _is_segment(fd)]
    assert fds == []


def test_the_stock_stays_within_its_budget(monkeypatch):
    """Sizes too big to stock STOCK_DEPTH of are never stocked; the sum stays under
    STOCK_BYTES whatever sizes are asked for."""
    _empty_stock()
    monkeypatch.setattr(shm, "STOCK_BYTES", 8 * MB)
    assert shm._STOCK.take(5 * MB) is None  # 2 x 5 MiB > 8 MiB: not stocked at all
    shm.settle()
    assert shm._STOCK.stocked() == 0 and shm._STOCK.held == 0
    for n in (MB, MB, 2 * MB, 2 * MB, 3 * MB, 3 * MB, 3 * MB):
        got = shm._STOCK.take(n)
        if got is not None:
            os.close(got[0])
        shm.settle()
        assert shm._STOCK.held <= 8 * MB
    held = sum(shm.stock_size(int(os.fstat(int(fd)).st_size)) for fd in _segment_fds())
    assert held == shm._STOCK.held <= 8 * MB
    shm._STOCK.let_go_idle(time.monotonic() + shm.STOCK_IDLE_S)


def test_a_forked_child_never_hands_out_its_parents_stock():
    """Parent and child would fill the same segments: the child closes its copies of the
    parent's stocked descriptors and makes its own."""
    n = 3 * MB
    _empty_stock()
    for _ in range(2):
        shm.SegmentWriter(n).close()
    shm.settle()
    parents = _segment_inodes()
    assert len(parents) >= shm.STOCK_DEPTH
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it got, then leave without cleanup
        try:
            got = shm._STOCK.take(n)
            still = parents & _segment_inodes()  # descriptor numbers are reused: segments are inodes
            ok = got is None and not still
            os.write(w, b"1" if ok else f"0 got={got} still={still}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert said == b"1", said
    assert _segment_inodes() == parents  # the parent's stock is untouched
    shm._STOCK.let_go_idle(time.monotonic() + shm.STOCK_IDLE_S)


def _empty_stock() -> None:
    """Let go of what earlier tests left in this process's stock (as the keeper does once idle)."""
    shm.settle()
    shm._STOCK.let_go_idle(time.monotonic() + shm.STOCK_IDLE_S)


def _is_segment(fd: str) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:flowserve")
    except OSError:
        return False


def _segment_fds() -> list[str]:
    return sorted(fd for fd in os.listdir("/proc/self/fd") if _is_segment(fd))


def _segment_inodes() -> set[int]:
    out = set()
    for fd in _segment_fds():
        try:
            out.add(os.fstat(int(fd)).st_ino)
        except OSError:  # closed meanwhile
            pass
    return out
