"""A bare HTTP echo on the gateway's server stack (uvicorn, httptools, uvloop): the body
comes back as sent. What moving a payload over HTTP costs with no serving at all.

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
    body = b"".join(chunks)
    ctype = dict(scope["headers"]).get(b"content-type", b"application/octet-stream")
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", ctype), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
