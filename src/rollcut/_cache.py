"""What rollcut builds once per machine and keeps: where its cache is, one builder at a time, and a
child server's readiness.

The engines, the models and NeMo Gym's environment are each made once into the user's cache
directory (``ROLLCUT_CACHE``, else ``XDG_CACHE_HOME``, else ``~/.cache``, then ``rollcut``) under a
file lock, so concurrent test workers build each once; the servers rollcut starts from them are
ready when they answer ``/health``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from ._errors import RollcutError

__all__ = ["cache_root", "locked", "wait_healthy"]


def cache_root() -> Path:
    """rollcut's directory in the user's cache."""
    base = os.environ.get("ROLLCUT_CACHE") or os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rollcut"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold ``path``'s exclusive lock (made, in a private directory, if absent)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def wait_healthy(
    what: str,
    proc: subprocess.Popen[bytes],
    url: str,
    log: Path,
    timeout_s: float,
    kill: Callable[[], None],
    poll_s: float = 0.05,
    *,
    error: type[RollcutError],
) -> None:
    """Wait until a server started as ``proc`` answers ``/health``; it exiting first, or not
    answering in time (then ``kill``), is an ``error`` with its log's tail."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise error(f"{what} exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        time.sleep(poll_s)  # polling a child's readiness: it has no other way to say so
    kill()
    raise error(f"{what} not healthy within {timeout_s} s (log {log})")
