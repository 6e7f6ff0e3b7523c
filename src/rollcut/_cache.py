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
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar, Self

import httpx

from ._errors import RollcutError
from ._process import kill_group, lifeline

__all__ = ["ChildServer", "cache_root", "locked", "wait_healthy"]


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


class ChildServer:
    """A server rollcut runs beside it: a child process in a session of its own (killed with every
    process it started), on a free loopback port, dying with its parent (``lifeline``)."""

    what: ClassVar[str] = "a server"
    unavailable: ClassVar[type[RollcutError]] = RollcutError

    def __init__(self, *, log: Path | None = None) -> None:
        # no log path: a file already unlinked, read while it is open; a SIGKILL leaves nothing
        self._unnamed = None if log is not None else tempfile.TemporaryFile()  # noqa: SIM115
        self.log_path = log or Path(f"/proc/self/fd/{self._unnamed.fileno()}")  # type: ignore[union-attr]
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, argv: list[str], env: dict[str, str], timeout_s: float, poll_s: float = 0.05) -> None:
        """Start ``argv`` on :attr:`port` (a free one the first time) and wait until it is healthy."""
        named = self._unnamed is None
        with open(self.log_path, "ab") if named else contextlib.nullcontext(self._unnamed) as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=lifeline(),
            )
        proc, error = self.proc, self.unavailable
        wait_healthy(self.what, proc, self.url, self.log_path, timeout_s, self.kill, poll_s, error=error)

    def start(self) -> Self:
        raise NotImplementedError

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL it and every process it started, and reap it."""
        if self.alive():
            assert self.proc is not None
            kill_group(self.proc.pid)
            self.proc.wait()

    def __enter__(self) -> Self:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.kill()
