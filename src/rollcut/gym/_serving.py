"""Serving a Gym app: one listening socket, uvicorn, readiness lines on stdout."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from typing import Any

import uvicorn

__all__ = ["bind", "run_servers", "say", "serve_on"]


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


def run_servers(
    *,
    host: str,
    port: int,
    workers: int,
    child_argv: list[str],
    serve_one: Any,
    worker_index: int | None = None,
    listen_fd: int | None = None,
) -> None:
    """Blocking: bind once, then serve in this process (1 worker) or in ``workers`` children.

    ``serve_one(sock, index)`` is the coroutine one worker runs; ``child_argv`` is
    the command line that starts a worker of the same server (``--worker-index``
    and ``--listen-fd`` are appended).
    """
    import contextlib
    import signal
    import subprocess

    if worker_index is not None:
        if listen_fd is None:
            raise ValueError("a worker needs --listen-fd")
        asyncio.run(serve_one(socket.socket(fileno=listen_fd), worker_index))
        return
    sock = bind(host, port)
    url = f"http://{host}:{sock.getsockname()[1]}"
    say(f"LISTENING {url}")
    if workers == 1:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_one(sock, 0))
        return
    children = [
        subprocess.Popen(
            [*child_argv, "--worker-index", str(i), "--listen-fd", str(sock.fileno())],
            pass_fds=[sock.fileno()],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(workers)
    ]
    for child in children:
        line = child.stdout.readline().strip() if child.stdout else ""
        if not line.startswith("READY"):
            for c in children:
                c.kill()
            raise RuntimeError(f"a worker failed to start: {line!r}")
        say(line)
    say(f"READY {url}")

    def stop(*_: object) -> None:
        for c in children:
            if c.poll() is None:
                c.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for c in children:
        c.wait()
