"""A sandbox's commands, run isolated: bubblewrap, the session's directory the only place to write.

Each command runs as ``/bin/sh -c COMMAND`` in its own pid, mount, IPC, UTS, user and network
namespaces (``bwrap --unshare-all``): it sees no other process, its only network is its own
loopback, the system's directories and this Python are read-only, ``/tmp`` is fresh, and the
session directory is bound at ``/work``, the one place it can write. Limits: a wall-clock time
limit (the process group is killed at it), CPU seconds, the size of a file it writes, open
files; stdout and stderr are each cut at ``OUTPUT_CAP`` bytes with a marker saying how much
more there was. When the command ends, its pid namespace ends with it: no background process
outlives a tool call (a call is atomic; docs/sandboxes.md). Memory and processes are bounded by a
control group per command (:mod:`rollcut._cgroup`), which is emptied when the command ends.

Where bubblewrap is missing or cannot make its namespaces, the sandbox refuses to start unless
told ``--unisolated``; then commands run with the same limits in the session directory, in a
process group of their own that is killed when the command ends, and can read and write what the
server's user can.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._cgroup import CommandGroup, Confinement
from ..._process import kill_group
from ...sandbox._isolation import READ_ONLY_ROOT, Isolation

__all__ = ["OUTPUT_CAP", "Runner"]

OUTPUT_CAP = 16 * 1024
"""Bytes of stdout (and of stderr) a tool call answers with."""
FILE_LIMIT = 64 << 20
"""The largest file a command may write."""
MAX_TIMEOUT_S = 600.0
WORKDIR = "/work"


def _limits(cpu_s: int, group: CommandGroup | None, confinement: Confinement) -> None:  # in the child
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    if group is not None:
        group.enter()
    else:
        confinement.rlimits()


async def _capped(stream: asyncio.StreamReader | None, cap: int) -> str:
    """The stream's text, cut at ``cap`` bytes with a marker; read to its end either way."""
    if stream is None:
        return ""
    kept, more = bytearray(), 0
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        kept += chunk[:room]
        more += max(0, len(chunk) - room)
    text = kept.decode("utf-8", "replace")
    return text + (f"\n[rollcut: output cut at {cap} bytes; {more} more not shown]\n" if more else "")


@dataclass(frozen=True)
class Runner:
    """How this server runs a session's commands: bubblewrap (found and probed at start), or None
    (``--unisolated``), each command in a control group of its own with ``confinement``'s limits
    (rlimits where the machine makes no cgroups: ``docs/sandboxes.md``)."""

    isolation: Isolation | None
    confinement: Confinement = field(default_factory=Confinement)

    @classmethod
    def find(cls, *, unisolated: bool) -> Runner:
        if unisolated:
            return cls(None)
        return cls(Isolation.find("the sandbox environment runs its commands sandboxed"))

    @property
    def isolated(self) -> bool:
        return self.isolation is not None

    def argv(self, command: str, workdir: Path) -> list[str]:
        shell = ["/bin/sh", "-c", command]
        if self.isolation is None:
            return shell
        python = [sys.base_prefix] if sys.base_prefix not in ("/", "/usr") else []
        path = ":".join([*(f"{p}/bin" for p in python), "/usr/local/bin", "/usr/bin", "/bin"])
        return [
            *self.isolation.confined(python),
            "--bind",
            str(workdir),
            WORKDIR,
            "--chdir",
            WORKDIR,
            "--clearenv",
            "--setenv",
            "HOME",
            WORKDIR,
            "--setenv",
            "PATH",
            path,
            "--setenv",
            "LANG",
            "C.UTF-8",
            # no bytecode cache in the tree: a file rewritten within the second at the same size
            # would run its stale .pyc, and the cache is not the agent's work to snapshot
            "--setenv",
            "PYTHONDONTWRITEBYTECODE",
            "1",
            *READ_ONLY_ROOT,
            "--",
            *shell,
        ]

    async def run(
        self, command: str, workdir: Path, *, timeout_s: float = 30.0, stdin: bytes | None = None
    ) -> dict[str, Any]:
        """Run ``command`` in ``workdir``: its exit code (-9 when the time limit killed it), its
        capped stdout and stderr, and whether it timed out."""
        timeout_s = min(max(timeout_s, 0.1), MAX_TIMEOUT_S)
        group = await asyncio.to_thread(self.confinement.group)
        try:
            return await self._run(command, workdir, timeout_s, stdin, group)
        finally:
            if group is not None:  # whatever it left, however it detached, goes with the group
                await asyncio.to_thread(group.close)

    async def _run(
        self, command: str, workdir: Path, timeout_s: float, stdin: bytes | None, group: CommandGroup | None
    ) -> dict[str, Any]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(workdir),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        proc = await asyncio.create_subprocess_exec(
            *self.argv(command, workdir),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=env,
            start_new_session=True,
            preexec_fn=lambda: _limits(int(timeout_s) + 1, group, self.confinement),
        )
        if stdin is not None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            proc.stdin.close()
        out = asyncio.ensure_future(_capped(proc.stdout, OUTPUT_CAP))
        err = asyncio.ensure_future(_capped(proc.stderr, OUTPUT_CAP))
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
        finally:
            kill_group(proc.pid)  # whatever it left running goes with it
            await proc.wait()
        stdout, stderr = await asyncio.gather(out, err)
        return {
            "exit_code": -signal.SIGKILL if timed_out else proc.returncode,
            "stdout": stdout,
            "stderr": stderr,
            "timed_out": timed_out,
        }
