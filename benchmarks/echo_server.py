"""A bare HTTP echo on the gateway's server stack (uvicorn, httptools, uvloop): the body
comes back as sent. What moving a payload over HTTP costs with no serving at all.

``POST /echo`` joins the body's pieces into one ``bytes`` and sends that (one copy, as a
plain ASGI app would); ``POST /pieces`` sends the pieces back as they came, unjoined (no
copy at all in Python: the least an echo can do on this stack).

uvicorn benchmarks.echo_server:app --port 8002 --http httptools --loop uvloop
"""

from __future__ import annotations


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    if scope["path"].endswith("/pieces"):
        pieces = [c for c in chunks if c] or [b""]
    else:
        pieces = [b"".join(chunks)]
    ctype = dict(scope["headers"]).get(b"content-type", b"application/octet-stream")
    length = sum(len(c) for c in pieces)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", ctype), (b"content-length", str(length).encode())],
        }
    )
    for i, piece in enumerate(pieces):
        await send({"type": "http.response.body", "body": piece, "more_body": i < len(pieces) - 1})
