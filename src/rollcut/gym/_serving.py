"""Serving a Gym app: one listening socket, uvicorn, readiness lines on stdout."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import uvicorn

from .._errors import ServerStartError
from .._metrics import multiproc_env, worker_gone
from .._process import BUS_LOST_EXIT, http_url, inherited_listener, lifeline, sweep_dead_dirs
from .._process import listener as bind  # the listening socket a server's workers share
from ..bus import WorkerIdentities
from ._peers import Peers, bind_peer_sockets

__all__ = ["ServeOne", "Supervisor", "bind", "run_servers", "run_worker", "say", "serve_on", "worker_parser"]


def say(line: str) -> None:
    """One readiness line on stdout, flushed (the harness waits on ``LISTENING``/``READY``)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


KEEP_ALIVE_S = 75
"""How long a server keeps an idle connection. uvicorn's default, 5 s, is httpx's default idle
expiry too: a client that reused a connection just as the server closed it got a reset (an
agent's model call failed this way between two training steps, and a rollout had to be
recovered). Longer on the server than any client keeps an idle connection, the client always
lets go first, as behind a load balancer."""


def _stopped(sig: int, _frame: object) -> None:
    raise SystemExit(128 + sig)


async def serve_on(
    app: Any, sockets: list[socket.socket], instance: str, lost: asyncio.Future[str] | None = None
) -> None:
    """Serve on ``sockets`` until stopped; print ``READY <instance> pid=<pid>`` once accepting.

    A SIGTERM stops uvicorn gracefully, which then raises the signal again under the handler it
    found: this one, which unwinds the worker (its ``finally`` blocks run: a sandbox's sessions are
    removed, issue 49) and exits 143, where the default handler ended the process on the spot.
    ``lost``: resolves, with the reason, when the server's bus connection is gone for good; the
    server then says so (``BUS_LOST <instance>: <reason>``), stops as for a SIGTERM and exits
    :data:`BUS_LOST_EXIT`, where it would otherwise answer ``/healthz`` while storing nothing."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stopped)
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_keep_alive=KEEP_ALIVE_S)
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve(sockets=sockets))
    while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
        await asyncio.sleep(0.01)
    say(f"READY {instance} pid={os.getpid()}")
    if lost is None:
        await serving
        return

    def stop_serving(done: asyncio.Future[str]) -> None:  # uvicorn's own graceful stop, as on SIGTERM
        if not done.cancelled():
            say(f"BUS_LOST {instance}: {done.result()}; exiting {BUS_LOST_EXIT}")
            server.should_exit = True

    lost.add_done_callback(stop_serving)
    try:
        await serving  # the one awaiter of uvicorn's task: a SIGTERM's SystemExit comes out here
    finally:
        lost.remove_done_callback(stop_serving)
    if lost.done() and not lost.cancelled():
        raise SystemExit(BUS_LOST_EXIT)
    lost.cancel()


ServeOne = Callable[[socket.socket, int, Peers | None], Coroutine[Any, Any, None]]
"""The coroutine one worker runs: its listening socket, its index, and its peers (None: alone)."""


def worker_parser(prog: str, *, worker: bool = True) -> argparse.ArgumentParser:
    """A worker's command line: the server's options as JSON (``--spec``), then the flags
    :meth:`Supervisor._launch` appends (both ends of them here). ``worker`` False: the program also
    runs as the parent, without them. Not typer: a worker takes nothing a user types, and typer,
    click and rich were a sixth of its start."""
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    parser.add_argument("--spec", required=True, help="the server's options as JSON")
    parser.add_argument("--worker-index", type=int, required=worker)
    parser.add_argument("--listen-fd", type=int, required=worker, help="the listening socket, inherited")
    parser.add_argument("--peer-fd", type=int, help="this worker's private socket, inherited")
    parser.add_argument("--peers-dir", default="", help="where every worker's private socket is")
    parser.add_argument("--identity", default="", help="fd:N, the worker's own bus identity, read once")
    return parser


def run_worker(serve_one: ServeOne, args: argparse.Namespace, count: int) -> None:
    """Blocking: the body of the worker ``args`` names (:func:`worker_parser`), one of ``count``
    started by :func:`run_servers`."""
    sock = socket.socket(fileno=args.listen_fd)
    if args.peer_fd is None:
        asyncio.run(serve_one(sock, args.worker_index, None))
        return
    peer = socket.socket(fileno=args.peer_fd)
    peers = Peers(index=args.worker_index, count=count, directory=args.peers_dir, listener=peer)
    asyncio.run(serve_one(sock, args.worker_index, peers))


def run_servers(
    *,
    host: str,
    port: int,
    workers: int,
    child_argv: list[str],
    serve_one: ServeOne,
    identities: WorkerIdentities | None = None,
    fd: int | None = None,
) -> None:
    """Blocking: bind once (or take the listening socket ``fd`` handed down), then serve in this
    process (1 worker) or in ``workers`` children.

    With several workers the parent binds, besides the port, one private unix
    socket per worker (how workers hand each other a rollout's requests, see
    :mod:`rollcut.gym._peers`) and supervises: a worker that dies is started
    again with the same index, hence the same participant name and the same
    rollouts, and its line ``RESTARTED <instance> pid=<pid>`` is printed.
    ``child_argv`` starts a worker (``--worker-index``, ``--listen-fd``,
    ``--peer-fd`` and ``--peers-dir`` are appended, and ``--identity fd:N``: the worker's own bus
    identity, made afresh by ``identities`` for each start and written into a pipe, so no file
    holds it; the same pipe carries its renewals while it lives). The private directory is named
    for this process: the next server to start removes one whose process is gone (a SIGKILLed
    parent runs no cleanup).
    """
    try:
        sock = bind(host, port) if fd is None else inherited_listener(fd)
    except OSError as exc:
        raise ServerStartError(f"cannot listen: {exc}") from exc
    address, bound = sock.getsockname()[:2]
    url = http_url(address, bound)
    say(f"LISTENING {url}")
    sweep_dead_dirs("rollcut-peers-")  # what a SIGKILLed server of several workers left, at any start
    if workers == 1:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_one(sock, 0, None))
        return
    with tempfile.TemporaryDirectory(prefix=f"rollcut-peers-{os.getpid()}-") as peers_dir:  # 0700
        peer_socks = bind_peer_sockets(peers_dir, workers)
        supervisor = Supervisor(sock, peer_socks, peers_dir, child_argv, identities)
        try:
            supervisor.run(url)
        finally:
            if identities is not None:
                identities.close()
    if supervisor.lost:
        raise SystemExit(BUS_LOST_EXIT)


class Supervisor:
    """The parent of several workers: starts them, relays their readiness, restarts the dead."""

    def __init__(
        self,
        sock: socket.socket,
        peer_socks: list[socket.socket],
        peers_dir: str,
        child_argv: list[str],
        identities: WorkerIdentities | None = None,
    ) -> None:
        self.sock, self.peer_socks, self.peers_dir, self.child_argv = sock, peer_socks, peers_dir, child_argv
        self.identities = identities
        self.env = multiproc_env(peers_dir)  # every worker's metrics in one place, summed on /metrics
        self.children: dict[int, subprocess.Popen[str]] = {}
        self.stopping = False
        self.lost = False  # a worker lost its identity: the server exits BUS_LOST_EXIT

    def _start(self, i: int) -> str:
        self._launch(i)
        return self._ready(i)

    def _launch(self, i: int) -> None:
        fds = [self.sock.fileno(), self.peer_socks[i].fileno()]
        given: list[str] = []
        if self.identities is not None:
            read, write = os.pipe()
            self.identities.give(i, open(write, "wb"))  # noqa: SIM115 (kept open for its renewals)
            fds.append(read)
            given = ["--identity", f"fd:{read}"]
        try:
            self.children[i] = subprocess.Popen(
                [
                    *self.child_argv,
                    *("--worker-index", str(i), "--listen-fd", str(fds[0])),
                    *("--peer-fd", str(fds[1]), "--peers-dir", self.peers_dir),
                    *given,
                ],
                pass_fds=fds,
                env=self.env,
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=lifeline(),  # a worker dies with its parent, never left serving alone
            )
        finally:
            if given:
                os.close(fds[2])  # the worker's copy is the only one left

    def _ready(self, i: int) -> str:
        child = self.children[i]
        line = child.stdout.readline().strip() if child.stdout else ""
        if not line.startswith("READY"):
            child.kill()
            child.wait()
            raise ServerStartError(f"worker {i} failed to start: {line!r}")
        # whatever it prints later is relayed, so a full pipe never blocks it
        threading.Thread(target=_relay, args=(child,), daemon=True).start()
        return line

    def run(self, url: str) -> None:
        try:
            for i in range(len(self.peer_socks)):  # started together: each imports for a second or so
                self._launch(i)
            for i in range(len(self.peer_socks)):
                say(self._ready(i))
        except ServerStartError:
            self.stop()
            raise
        say(f"READY {url}")
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        failures = dict.fromkeys(self.children, 0)
        while self.children:
            pid, code = _wait_any()
            if pid == 0:
                return
            index = next((i for i, c in self.children.items() if c.pid == pid), None)
            if index is None:
                continue
            worker_gone(self.env, pid)
            if self.stopping:
                del self.children[index]
                continue
            if code == BUS_LOST_EXIT:  # its name is another process's now
                say(f"BUS_LOST worker {index}: its identity was revoked; not started again, stopping")
                self.stop()
                del self.children[index]
                self.lost = True
                continue
            try:  # the same index: the same participant name and the same rollouts
                say(self._start(index).replace("READY", "RESTARTED", 1))
                failures[index] = 0
            except ServerStartError:
                failures[index] += 1
                if failures[index] >= _MAX_RESTART_FAILURES:
                    self.stop()
                    raise

    def stop(self, *_: object) -> None:
        self.stopping = True
        for c in self.children.values():
            if c.poll() is None:
                c.terminate()


_MAX_RESTART_FAILURES = 3


def _relay(child: subprocess.Popen[str]) -> None:
    for line in child.stdout or ():
        say(line.rstrip("\n"))


def _wait_any() -> tuple[int, int]:
    """The pid of the next child to exit and its exit code (``-N``: killed by signal N); pid 0 once
    there are none."""
    try:
        pid, status = os.wait()
    except ChildProcessError:
        return 0, 0
    return pid, os.waitstatus_to_exitcode(status)
