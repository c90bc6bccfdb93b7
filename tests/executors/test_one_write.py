"""The gateway's connections send an answer's head and body as one write (serving.OneWrite)."""

from __future__ import annotations

import asyncio
import socket

from executors.gateway.http_server import OneWrite


class Recorder:
    """A transport that records what reaches it (asyncio's, not ours)."""

    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


def test_writes_in_one_turn_leave_as_one_write_in_order():
    async def main():
        inner = Recorder()
        t = OneWrite(inner, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        t.write(b"{}")
        assert inner.writes == [] and t.get_write_buffer_size() == 40
        await asyncio.sleep(0)
        t.write(b"next")
        await asyncio.sleep(0)
        return inner.writes

    assert asyncio.run(main()) == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", b"next"]


def test_big_pieces_are_not_copied_into_one():
    async def main():
        inner = Recorder()
        t = OneWrite(inner, asyncio.get_running_loop())
        big = b"x" * (OneWrite.JOIN_MAX + 1)
        t.write(b"head")
        t.write(big)
        await asyncio.sleep(0)
        return inner.writes

    assert asyncio.run(main()) == [b"head", b"x" * (OneWrite.JOIN_MAX + 1)]


def test_close_sends_what_was_written_first_and_later_writes_are_dropped():
    async def main():
        inner = Recorder()
        t = OneWrite(inner, asyncio.get_running_loop())
        t.write(b"bye")
        t.close()
        t.write(b"late")
        await asyncio.sleep(0)
        return inner.writes, inner.closed

    assert asyncio.run(main()) == ([b"bye"], True)


def test_a_gateway_answer_arrives_in_one_segment(cluster):
    # over a real connection: the head and the body reach the client together
    from flow import ColumnType, Flow
    from tests.executors.conftest import unique

    f = Flow(unique("onewrite"), schema={"x": ColumnType("int")})
    f.map(lambda row: row.x + 1, names=["y"])
    d = cluster.deploy(f)
    host, port = d.url.split("//", 1)[1].split("/", 1)[0].split(":")
    path = "/" + d.url.split("//", 1)[1].split("/", 1)[1]
    body = b'{"x": 1}'
    request = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection((host, int(port))) as s:
        for _ in range(20):  # every answer: one segment holding head and body
            s.sendall(request)
            first = s.recv(65536)
            head, _, rest = first.partition(b"\r\n\r\n")
            length = int(
                next(
                    v for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k.lower() == b"content-length"
                )
            )
            assert head.startswith(b"HTTP/1.1 200") and len(rest) == length, first
