"""A synthetic environment server that finishes every rollout at once: ``bench collector``'s workload.

``POST /run`` answers a result at once (reward 1, one turn) and ``GET /healthz`` says it is up, so a
collection through it measures the collector alone: its dispatch, its row hand-off, its
acknowledgements, its checkpoints and compaction. It writes nothing on the log (no participant), as
an environment whose episodes are instant would have nothing to checkpoint.

Run as ``python -m rollcut.bench.instant_env``; it prints ``LISTENING <url>`` and ``READY instant
pid=<pid>`` as rollcut's servers do, so :class:`rollcut.testing.ServerProcess` starts it.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

__all__ = ["app", "main"]

_RESULT = b'{"reward": 1.0, "turns": 1, "answer": "instant"}'
_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


async def app(scope: MutableMapping[str, Any], receive: _Receive, send: _Send) -> None:
    """The ASGI app: ``/run`` (after reading its body) and ``/healthz``; 404 for anything else."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):  # the request's body, read and dropped
        pass
    path = scope["path"]
    status, body = (200, _RESULT) if path in ("/run", "/healthz") else (404, b'{"detail": "Not Found"}')
    await send(
        {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    """Serve on a free port of 127.0.0.1 until killed."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)  # listening before READY: a connection that comes first waits in the backlog
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    print(f"LISTENING http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    print(f"READY instant pid={os.getpid()}", flush=True)
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
