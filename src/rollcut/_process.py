"""Processes of this host: whether one still exists (a lease or a harness asks before it trusts a pid),
a free loopback port for one to listen on or a listening socket to hand it, and children that die
with their parent."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "BUS_LOST_EXIT",
    "DEAD_DIR_PREFIXES",
    "free_port",
    "http_url",
    "inherited_listener",
    "kill_group",
    "lifeline",
    "listener",
    "pid_alive",
    "sweep_all_dead_dirs",
    "sweep_dead_dirs",
]

_PR_SET_PDEATHSIG = 1

BUS_LOST_EXIT = 77
"""A server's exit status when the bus closed its connection for good (``EX_NOPERM``: its identity
was revoked because another process took its instance name). Its supervisor does not start it
again under that name: the name is the other process's now (``rollcut``'s exit code table). Here,
below every package, so the exit code table reads it without loading a server."""


def lifeline() -> Callable[[], None] | None:
    """A ``preexec_fn`` under which a child is SIGKILLed when this process dies; None where that
    cannot be promised.

    Why: a server's workers, an engine, a nats-server or an agent program left running by a
    parent that was SIGKILLed (a fault test, the OOM killer, a node's agent) lives on as an orphan
    with its ports, files and CPU; one such pair of workers ran for over an hour after a test. The
    kernel's parent-death signal (``PR_SET_PDEATHSIG``) survives ``exec``, so it covers children
    that are not Python too. It is cleared in a child's own children (a grandchild needs its own
    lifeline) and it fires when the *thread* that forked the child ends, so it is only armed from
    the main thread, whose end is the process's; elsewhere (and off Linux) this returns None and
    the child is the caller's to stop. A parent that dies between the fork and the ``prctl`` is
    caught by the child itself: its parent is no longer the one that forked it.
    """
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
    parent = os.getpid()

    def arm() -> None:  # pragma: no cover - runs in the child between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (a child started in a new session, and every process
    it started), if it is still there."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` names a process here (someone else's, which we may not signal, counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a child process told where to listen (a nats-server node,
    llama-server): the kernel picks it, the socket closes, the child binds it."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: the kernel picks), inheritable: what a server's
    workers share, bound once by their parent, or what a harness binds and hands a server it starts
    (``--fd``), so the server's address is known before it runs and whoever is started with it
    needs no wait (a connection made before the server accepts waits in the backlog)."""
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted connections only then, and without
    # it every keep-alive response waits ~40 ms for the client's delayed ACK (Nagle)
    family = socket.AF_INET6 if _ipv6(host) else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _ipv6(host: str) -> bool:
    """An IPv6 address (``::1``): a host name or an IPv4 address has no colon."""
    return ":" in host


def http_url(host: str, port: int) -> str:
    """The base URL a client reaches ``host:port`` at: an IPv6 address in brackets (RFC 3986)."""
    return f"http://[{host}]:{port}" if _ipv6(host) else f"http://{host}:{port}"


def inherited_listener(fd: int) -> socket.socket:
    """The listening TCP socket at ``fd``, handed down by whoever started this process (socket
    activation, as uvicorn's ``--fd``). Raises ``OSError`` naming what it is instead."""
    try:
        sock = socket.socket(fileno=fd)  # family, type and protocol read from the descriptor
    except OSError as exc:
        raise OSError(f"descriptor {fd} is not a TCP socket ({exc.strerror})") from exc
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"descriptor {fd} is not a TCP socket")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise OSError(f"descriptor {fd} is a TCP socket that is not listening")
    except OSError:
        sock.detach()  # not ours to close: whoever passed it learns from the error
        raise
    sock.set_inheritable(True)
    return sock


DEAD_DIR_PREFIXES = ("rollcut-peers-", "rollcut-relay-", "rollcut-agent-")
"""The temporary directories rollcut's servers name for their process (several workers' sockets and
metrics, an opaque agent's relay and runs): what :func:`sweep_dead_dirs` may remove."""


def sweep_all_dead_dirs(root: Path | None = None) -> int:
    """Every directory of :data:`DEAD_DIR_PREFIXES` under ``root`` whose process is gone; how many
    went."""
    return sum(sweep_dead_dirs(prefix, root) for prefix in DEAD_DIR_PREFIXES)


def temp_dir() -> Path:
    """The temporary directory a process started now uses: ``TMPDIR`` as it is now (Python's own
    ``gettempdir`` keeps the first answer it gave, so it misses a change since, a test's among them)."""
    return Path(os.environ.get("TMPDIR") or tempfile.gettempdir())


def sweep_dead_dirs(prefix: str, root: Path | None = None) -> int:
    """Remove this user's directories ``<root>/<prefix><pid>-…`` (default: this process's temporary
    directory) whose process is gone: what a SIGKILLed process left (it ran no cleanup). Named for
    their process by whoever makes them; how many went."""
    removed = 0
    for d in (root or Path(tempfile.gettempdir())).glob(f"{prefix}*-*"):
        pid = d.name[len(prefix) :].split("-", 1)[0]
        with contextlib.suppress(OSError, ValueError):
            if (
                d.is_dir()
                and not d.is_symlink()
                and d.stat().st_uid == os.getuid()
                and not pid_alive(int(pid))
            ):
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
    return removed
