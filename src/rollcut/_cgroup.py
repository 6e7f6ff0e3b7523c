"""A control group per sandboxed command: its memory and its processes bounded, and every process it
started killed when it ends, however it detached itself.

rlimits cannot do either for a command run as root: ``RLIMIT_NPROC`` counts every process of the
user and root's are exempt, and ``RLIMIT_AS`` bounds address space, not memory. A cgroup bounds what
the kernel charges, whoever runs. Where the machine lets this process make cgroups (cgroup v1's
``memory`` and ``pids`` controllers, or v2 with both enabled for its group) each command gets one
below this process's own; where it does not, :class:`Confinement` falls back to rlimits and says so
(``cgroup`` is None). Nothing here trusts the command: the group is made before it starts, it
enters the group before it execs, and the group is emptied and removed after it ends.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CommandGroup", "Confinement"]

_ROOT = Path("/sys/fs/cgroup")


def _own_paths() -> dict[str, str]:
    """This process's group in each hierarchy: controller (``""`` for v2) -> path."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


@functools.cache
def _parents() -> list[tuple[Path, dict[str, str]]] | None:
    """Where a command's groups go and what each limit file is called there, or None: read once (a
    process's own group does not move), not at every command."""
    own = _own_paths()
    v1 = [_ROOT / c for c in ("memory", "pids")]
    if all((d / "cgroup.procs").is_file() for d in v1) and "memory" in own and "pids" in own:
        return [
            (_ROOT / "memory" / own["memory"].lstrip("/"), {"memory": "memory.limit_in_bytes"}),
            (_ROOT / "pids" / own["pids"].lstrip("/"), {"pids": "pids.max"}),
        ]
    parent = _ROOT / own.get("", "/").lstrip("/")
    with contextlib.suppress(OSError):
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        if {"memory", "pids"} <= set(enabled):
            return [(parent, {"memory": "memory.max", "pids": "pids.max"})]
    return None


@dataclass(frozen=True)
class Confinement:
    """What a sandboxed command may use: bytes of memory and processes at once."""

    memory_bytes: int = 1 << 30
    processes: int = 128

    def group(self) -> CommandGroup | None:
        """A new group with these limits for one command, or None where none can be made here."""
        parents = _parents()
        if parents is None:
            return None
        name = f"rollcut-{uuid.uuid4().hex[:16]}"
        made: list[Path] = []
        try:
            for parent, files in parents:
                d = parent / name
                d.mkdir()
                made.append(d)
                for kind, file in files.items():
                    value = self.memory_bytes if kind == "memory" else self.processes
                    (d / file).write_text(str(value))
        except OSError:
            CommandGroup(tuple(made)).remove()
            return None
        return CommandGroup(tuple(made))

    def rlimits(self) -> None:
        """In the child, where no group could be made: address space, the nearest an rlimit comes to
        memory. Processes stay unbounded there: ``RLIMIT_NPROC`` counts every process of the user
        (a desktop's would stop every command) and does not bind root (docs/security.md)."""
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes * 2, self.memory_bytes * 2))


@dataclass(frozen=True)
class CommandGroup:
    """One command's group, in each hierarchy it needs."""

    dirs: tuple[Path, ...]

    def enter(self) -> None:
        """In the child, before exec: this process and all it starts are in the group."""
        pid = str(os.getpid())
        for d in self.dirs:
            (d / "cgroup.procs").write_text(pid)

    def kill(self) -> None:
        """Every process still in the group, killed (a command's detached children among them);
        blocking for as long as they take to go (at most a few seconds: call it off the loop)."""
        for _ in range(500):
            pids = self._pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def _pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                out |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
        return out

    def close(self) -> None:
        """:meth:`kill`, then :meth:`remove` (one call: one hop off the event loop)."""
        self.kill()
        self.remove()

    def remove(self) -> None:
        """The group itself, once empty (a group that still holds a process stays, harmless)."""
        for d in self.dirs:
            with contextlib.suppress(OSError):
                d.rmdir()
