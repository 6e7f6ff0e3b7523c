"""A Gym server keeps an idle connection longer than clients do, so a client never reuses one the
server is closing. (With uvicorn's 5 s against httpx's 5 s, an agent's model call between two
training steps met a reset, and its rollout had to be recovered.)"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI

from rollcut.gym import bind, serve_on


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"GET /ping HTTP/1.1\r\nHost: t\r\n\r\n")
    await writer.drain()
    return await asyncio.wait_for(reader.readuntil(b'"pong"'), timeout=10)


async def test_a_connection_idle_for_longer_than_a_clients_keep_alive_is_still_served() -> None:
    app = FastAPI()
    app.get("/ping")(lambda: "pong")
    sock = bind("127.0.0.1", 0)
    serving = asyncio.ensure_future(serve_on(app, [sock], "keepalive"))
    try:
        port = sock.getsockname()[1]
        for _ in range(500):  # until it accepts: bounded, and it is accepting in milliseconds
            with contextlib.suppress(OSError):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            await asyncio.sleep(0.01)
        assert (await _get(reader, writer)).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(6)  # the condition under test: idle past httpx's 5 s expiry
        assert (await _get(reader, writer)).startswith(b"HTTP/1.1 200")  # the same connection
        writer.close()
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        sock.close()
