"""The ``sandbox`` environment: a working tree where the agent runs commands, reads, writes and
patches files, and a check command that verifies it (``docs/sandboxes.md``).

Each session owns a directory (0700) seeded from its task: one of the bundled tasks (``task``),
or files given inline (``files``, with their ``check``). Every command runs isolated
(:mod:`._sandbox_exec`). A tool call runs on a draft, a copy of the session's directory, and the
draft becomes the session's only once the call's event is durable: a call refused or lost with
its event leaves the directory as it was, as every environment's draft does.

The state crosses a checkpoint as a manifest over content-addressed blobs in JetStream's object
store (:mod:`rollcut.sandbox`): exported at the aligned prepare (blobs the bucket lacks are put,
the manifest too), logged as a small record naming the manifest's digest with the session's
revision. A continued attempt gets the tree made again in a new directory, every blob checked; a
missing or altered one fails the continuation closed (the rollout starts over, said why).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from ...sandbox import BlobStore, LazyBlobStore, SnapshotError, scan
from ._env import Environment, ToolResult
from ._sandbox_exec import MAX_TIMEOUT_S, OUTPUT_CAP, Runner
from ._sandbox_tasks import MAX_TASK_BYTES, TASKS, Task, task_of
from ._sandbox_tree import check_tree, copy_tree

__all__ = ["Sandbox", "SandboxState"]

_MAX_SNAPSHOT_RECORD = MAX_TASK_BYTES + 4096
"""A snapshot record: the task (inline ones at their documented bound) and a few numbers."""


@dataclass
class SandboxState:
    """A session: its directory and its task; ``pristine`` while it is its task's tree as seeded
    (no tool has changed it), which a snapshot records without storing a blob."""

    root: Path
    task: Task
    pristine: bool = False


class _Snapshot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the log records for a session's tree (its blobs and manifest are in the object store)."""

    manifest: str  # the manifest's SHA-256, its name in the bucket
    task: Task
    files: int
    bytes: int
    schema: int = 1
    pristine: bool = False  # the task's tree as seeded: made again from the task, no blob stored


def _timeout(value: Any) -> float:
    """A command's time limit: seconds above 0 and at most 600 (a number, or a model's "20"); absent
    or 0, the default 30. Anything else (``"nan"``, ``inf``, ``-1``, ``true``) is refused."""
    if value in (None, 0, ""):
        return 30.0
    try:
        seconds = (
            float(value) if isinstance(value, int | float | str) and not isinstance(value, bool) else -1.0
        )
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_TIMEOUT_S:  # False for NaN too
        raise ValueError(f"timeout_s must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}")
    return seconds


def _inside(state: SandboxState, path: str) -> Path:
    """``path`` in the session's directory, refused if it leaves it (``..``, absolute, a symlink out)."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ValueError(f"not a path: {path!r}")
    root = state.root.resolve()
    target = (root / path).resolve()
    if target != root and root not in target.parents:
        raise ValueError(f"{path!r} is outside the sandbox")
    return target


class Sandbox(Environment):
    """See the module's docstring."""

    name = "sandbox"
    mode = "exported"
    codec_version = 1
    verification = "replayable"
    runner: ClassVar[Runner | None] = None

    def __init__(self) -> None:
        self._bucket = LazyBlobStore()

    def open(self, *, unisolated: bool = False) -> None:
        type(self).runner = Runner.find(unisolated=unisolated)

    def bind(self, log: Any) -> None:
        self._bucket.bind(log)

    def _runner(self) -> Runner:
        if self.runner is None:  # a service made without a server (a test): isolated or refused
            self.open()
        assert self.runner is not None
        return self.runner

    async def blobs(self) -> BlobStore:
        return await self._bucket.get()

    # --- sessions ------------------------------------------------------------------------

    def tools(self) -> dict[str, Any]:
        tools = {"run": self.run, "read_file": self.read_file, "write_file": self.write_file}
        if shutil.which("patch"):  # offered where it can run (Debian: the patch package)
            tools["apply_patch"] = self.apply_patch
        return tools

    def parameters(self) -> dict[str, dict[str, Any]]:
        return {
            "run": {
                "command": {"type": "string", "description": "a shell command, run in the working tree"},
                "timeout_s": {"type": "number", "description": "seconds before it is killed"},
            },
            "read_file": {"path": {"type": "string"}},
            "write_file": {"path": {"type": "string"}, "content": {"type": "string"}},
            "apply_patch": {"patch": {"type": "string", "description": "a unified diff, applied with -p1"}},
        }

    async def seed(self, args: dict[str, Any]) -> SandboxState:
        return await self.seed_task(task_of(args))

    @staticmethod
    async def seed_task(task: Task) -> SandboxState:
        root = Path(tempfile.mkdtemp(prefix="rollcut-sandbox-"))
        try:
            await asyncio.to_thread(task.write, root)
        except BaseException:  # a failed seed leaves no directory behind
            shutil.rmtree(root, ignore_errors=True)
            raise
        return SandboxState(root, task, pristine=True)

    @classmethod
    def demo_task(cls, rng: random.Random) -> dict[str, Any]:
        name = rng.choice(sorted(TASKS))
        return {"prompt": TASKS[name].prompt, "seed": {"task": name}, "verify": {}}

    async def copy(self, state: SandboxState) -> SandboxState:
        return SandboxState(await asyncio.to_thread(copy_tree, state.root), state.task)

    def close(self, state: Any) -> None:
        if isinstance(state, SandboxState):
            shutil.rmtree(state.root, ignore_errors=True)

    # --- tools ---------------------------------------------------------------------------

    async def run(self, state: SandboxState, args: dict[str, Any]) -> ToolResult:
        command = args["command"]
        if not isinstance(command, str) or not command.strip():
            raise ValueError("command must be a non-empty string")
        out = await self._runner().run(command, state.root, timeout_s=_timeout(args.get("timeout_s")))
        await asyncio.to_thread(check_tree, state.root)
        return out, None

    async def read_file(self, state: SandboxState, args: dict[str, Any]) -> ToolResult:
        target = _inside(state, args["path"])
        try:
            data = await asyncio.to_thread(target.read_bytes)
        except OSError as exc:  # no such file, a directory: the agent's to read about, not a fault
            return {"path": args["path"], "error": f"{type(exc).__name__}: {exc.strerror}"}, None
        text = data[:OUTPUT_CAP].decode("utf-8", "replace")
        if len(data) > OUTPUT_CAP:
            text += f"\n[rollcut: file cut at {OUTPUT_CAP} bytes; {len(data) - OUTPUT_CAP} more not shown]\n"
        return {"path": args["path"], "content": text, "bytes": len(data)}, None

    async def write_file(self, state: SandboxState, args: dict[str, Any]) -> ToolResult:
        target = _inside(state, args["path"])
        content = args["content"]
        if not isinstance(content, str):
            raise ValueError("content must be a string")

        def write() -> int:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                return f.write(content)

        try:
            written = await asyncio.to_thread(write)
        except OSError as exc:  # a directory in the way, a symlink at the path: the agent's to read
            return {"path": args["path"], "error": f"{type(exc).__name__}: {exc.strerror}"}, None
        await asyncio.to_thread(check_tree, state.root)
        return {"path": args["path"], "written": written}, None

    async def apply_patch(self, state: SandboxState, args: dict[str, Any]) -> ToolResult:
        patch = args["patch"]
        if not isinstance(patch, str) or not patch:
            raise ValueError("patch must be a unified diff")
        command = "patch -p1 --batch --forward --no-backup-if-mismatch"
        out = await self._runner().run(command, state.root, stdin=patch.encode())
        await asyncio.to_thread(check_tree, state.root)
        return out, None

    async def verify(self, state: SandboxState, args: dict[str, Any]) -> dict[str, Any]:
        out = await self._runner().run(state.task.check, state.root, timeout_s=state.task.check_timeout_s)
        passed = out["exit_code"] == 0
        return {"reward": 1.0 if passed else 0.0, "passed": passed, "check": out}

    # --- the codec -----------------------------------------------------------------------

    async def export_state(self, state: SandboxState) -> bytes:
        """The session's record. A pristine tree (exported at seeding) is named, not stored: it is
        made again from its task, so seeding puts nothing in the bucket, and blobs are put only at
        a checkpoint's prepare, which compaction never runs beside (docs/sandboxes.md)."""
        tree = await asyncio.to_thread(scan, state.root)
        manifest = tree.manifest
        if not state.pristine:
            await (await self.blobs()).put_snapshot(tree)
        record = _Snapshot(
            manifest.digest(), state.task, len(manifest.entries), manifest.size(), pristine=state.pristine
        )
        return msgspec.json.encode(record)

    async def import_state(self, blob: bytes, codec_version: int) -> SandboxState:
        if codec_version != self.codec_version or len(blob) > _MAX_SNAPSHOT_RECORD:
            raise SnapshotError(f"a sandbox snapshot of codec {codec_version}, {len(blob)} bytes")
        record = msgspec.json.decode(blob, type=_Snapshot)
        if record.pristine:
            return await self._reseeded(record)
        blobs = await self.blobs()
        root = Path(tempfile.mkdtemp(prefix="rollcut-sandbox-"))
        try:
            await blobs.make(record.manifest, root / "tree")
            await asyncio.to_thread(_adopt, root)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return SandboxState(root, record.task)

    async def _reseeded(self, record: _Snapshot) -> SandboxState:
        """A pristine tree made again from its task, and refused unless it is the tree recorded."""
        state = await self.seed_task(record.task)
        made = (await asyncio.to_thread(scan, state.root)).manifest.digest()
        if made != record.manifest:
            self.close(state)
            raise SnapshotError(
                f"the task {record.task.name!r} no longer makes the tree it was seeded with", digest=made
            )
        return state


def _adopt(root: Path) -> None:
    """The made tree becomes the session's directory itself (materialise makes a new one)."""
    tree = root / "tree"
    for child in tree.iterdir():
        os.replace(child, root / child.name)
    tree.rmdir()
