"""No process outlives the test run: every process the suite starts carries a mark, and the run
fails if a marked process is still alive once it has ended.

Why a mark in the environment and not the process tree: a process whose parent was SIGKILLed is
re-parented to init and leaves the tree, and that is exactly the leftover to catch (two model
workers once lived on for an hour after a test killed their parent). Every child inherits the
environment unless it is given one of its own; those the suite starts that way (an agent program,
a sandboxed command) run under bubblewrap's ``--die-with-parent``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

__all__ = ["MARK", "leftovers", "mark_run", "running", "sweep"]

MARK = "ROLLCUT_TEST_RUN"
GRACE_S = 20.0
"""How long processes ending as the run ends (pytest's own workers, children signalled by their
parent's death) have to be gone."""


def mark_run() -> str | None:
    """Mark this run, in the first pytest process: returns the mark there, None in every process that
    inherited it (pytest's workers, a pytest started by a test), which must not sweep the run."""
    if MARK in os.environ:
        return None
    os.environ[MARK] = uuid.uuid4().hex
    return os.environ[MARK]


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie has ended: only its exit status is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def leftovers(mark: str) -> dict[int, str]:
    """Live processes carrying ``mark``, other than this one: pid -> command line."""
    needle = f"{MARK}={mark}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if needle in env.split(b"\0") and running(int(entry.name)):
            found[int(entry.name)] = cmd
    return found


def sweep(mark: str, grace_s: float = GRACE_S) -> dict[int, str]:
    """Wait up to ``grace_s`` for marked processes to end; SIGKILL those that do not and return
    them (the run then fails, and leaves nothing behind either way)."""
    deadline = time.monotonic() + grace_s
    while (left := leftovers(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling /proc: there is nothing to wait on for processes not our own
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left
