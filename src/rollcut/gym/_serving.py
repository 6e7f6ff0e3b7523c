"""Serving a Gym app: one listening socket, uvicorn, readiness lines on stdout."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from typing import Any

import uvicorn

__all__ = ["bind", "say", "serve_on"]


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def bind(host: str, port: int) -> socket.socket:
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted connections only then, and without
    # it every keep-alive response waits ~40 ms for the client's delayed ACK (Nagle)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def serve_on(app: Any, sock: socket.socket, instance: str) -> None:
    """Serve until stopped; print ``READY <instance> pid=<pid>`` once accepting."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
        await asyncio.sleep(0.01)
    say(f"READY {instance} pid={os.getpid()}")
    await serving
