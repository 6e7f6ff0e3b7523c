"""Processes of this host: whether one still exists (a lease or a harness asks before it trusts a pid),
and a free loopback port for one to listen on."""

from __future__ import annotations

import os
import socket

__all__ = ["free_port", "pid_alive"]


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
