"""The ``sandbox`` environment on the real bus and object store, its commands under bubblewrap:
a session's tools change only its own tree, its tree crosses a snapshot exactly, a tampered
blob fails the restore, and a command can neither leave its directory nor reach the network."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rollcut import ConfigError
from rollcut.bus import EventLog
from rollcut.gym.resources import ResourcesService, Sandbox
from rollcut.gym.wire import GymError, Identity, status_of
from rollcut.sandbox import SnapshotError, scan

FIX = "def add(a, b):\n    return a + b\n"


async def _session(log: EventLog, rid: str, task: str = "fix_add") -> tuple[ResourcesService, Identity]:
    service = ResourcesService(log, Sandbox(), instance="sandbox-0")
    await log.dispatch(rid, {"task": task}, instance="collector")
    ident = Identity(rid, 1)
    await service.seed(ident, {"task": task})
    return service, ident


async def _run(service: ResourcesService, ident: Identity, command: str, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = (await service.tool(ident, "run", {"command": command, **extra}))["result"]
    return out


async def test_a_task_is_fixed_with_its_tools_and_its_check_passes_only_then(log: EventLog) -> None:
    service, ident = await _session(log, "s1")
    failing = await _run(service, ident, "python3 -m unittest -q test_calc")
    assert failing["exit_code"] != 0 and "AssertionError" in failing["stderr"]
    assert not (await service.verify(ident, {}))["passed"]
    await service.tool(ident, "write_file", {"path": "calc/__init__.py", "content": FIX})
    read = (await service.tool(ident, "read_file", {"path": "calc/__init__.py"}))["result"]
    assert read["content"] == FIX
    verdict = await service.verify(ident, {})
    assert verdict["passed"] and verdict["reward"] == 1.0, verdict
    state = service.sessions[ident].state
    await service.close(ident)
    assert not state.root.exists()  # a passed session's directory goes with it


async def test_a_patch_applies_and_a_path_out_of_the_tree_is_refused_changing_nothing(log: EventLog) -> None:
    service, ident = await _session(log, "s2")
    patch = (
        "--- a/calc/__init__.py\n+++ b/calc/__init__.py\n@@ -1,2 +1,2 @@\n"
        " def add(a, b):\n-    return a - b\n+    return a + b\n"
    )
    applied = (await service.tool(ident, "apply_patch", {"patch": patch}))["result"]
    assert applied["exit_code"] == 0, applied
    assert (await service.verify(ident, {}))["passed"]
    before = scan(service.sessions[ident].state.root).manifest
    for tool, args in [
        ("read_file", {"path": "../../etc/passwd"}),
        ("write_file", {"path": "/tmp/owned", "content": "x"}),
        ("write_file", {"path": "calc/../../x", "content": "x"}),
    ]:
        with pytest.raises(GymError, match="outside the sandbox") as err:
            await service.tool(ident, tool, args)
        assert status_of(err.value.kind) == 400
    assert scan(service.sessions[ident].state.root).manifest == before
    assert service.sessions[ident].revision == 1  # the refused calls wrote nothing


async def test_a_command_is_isolated_limited_and_leaves_nothing_running(
    log: EventLog, nats_url: str, tmp_path: Path
) -> None:
    service, ident = await _session(log, "s3", task="hello_file")
    outside = tmp_path / "outside.txt"
    port = nats_url.rsplit(":", 1)[1]
    wrote = await _run(service, ident, f"echo owned > {outside}; echo owned > /etc/owned")
    assert wrote["exit_code"] != 0 and not outside.exists() and not Path("/etc/owned").exists()
    net = await _run(
        service,
        ident,
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"",
    )
    assert net["exit_code"] != 0 and "ConnectionRefusedError" in net["stderr"]  # its loopback is its own
    big = await _run(service, ident, "head -c 100000 /dev/zero | tr '\\0' a")
    assert (
        big["stdout"].startswith("a" * 1000)
        and "[rollcut: output cut at 16384 bytes; 83616 more" in big["stdout"]
    )
    slow = await _run(service, ident, "sleep 30", timeout_s=0.5)
    assert slow["timed_out"] and slow["exit_code"] == -9
    left = await _run(service, ident, "(sleep 4242 &) ; echo started")
    assert left["exit_code"] == 0
    alive = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p) == b"sleep\x004242\x00"]
    assert alive == []  # its pid namespace ended with the command
    shell = await _run(service, ident, "echo 'hello sandbox' > out.txt")
    assert shell["exit_code"] == 0 and (await service.verify(ident, {}))["passed"]


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


async def test_a_sessions_tree_crosses_a_snapshot_exactly_and_a_tampered_blob_fails_it(
    log: EventLog, namespace: str
) -> None:
    service, ident = await _session(log, "s4")
    await service.tool(ident, "write_file", {"path": "calc/__init__.py", "content": FIX})
    await _run(
        service, ident, "mkdir -p notes && echo 'fixed the sign' > notes/log.txt && chmod 600 notes/log.txt"
    )
    state = service.sessions[ident].state
    env = service.env
    assert isinstance(env, Sandbox)
    record = await env.export_state(state)
    tree = scan(state.root).manifest

    fresh = Sandbox()
    fresh.bind(log)
    restored = await fresh.import_state(record, 1)
    try:
        assert restored.root != state.root
        assert scan(restored.root).manifest == tree
        assert (restored.root / "notes" / "log.txt").stat().st_mode & 0o777 == 0o600
    finally:
        fresh.close(restored)

    # a second snapshot after one more change stores one blob (and its manifest)
    blobs = await env.blobs()
    before = await blobs.names()
    await service.tool(ident, "write_file", {"path": "notes/log.txt", "content": "and tested it\n"})
    await env.export_state(service.sessions[ident].state)
    assert len(await blobs.names() - before) == 2

    # the snapshot's blob altered in the bucket: the restore fails naming the file, and makes nothing
    digest = next(e.digest for e in tree.entries if e.path == "calc/__init__.py")
    await blobs.store.put(digest, b"def add(a, b):\n    return 0\n")
    made = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("rollcut-sandbox-*"))
    with pytest.raises(SnapshotError, match=r"calc/__init__.py: its blob .* is not what its name says"):
        await fresh.import_state(record, 1)
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("rollcut-sandbox-*")) == made
    with pytest.raises(msgspec.ValidationError):
        await fresh.import_state(b'{"manifest": "x"}', 1)


async def test_a_seeded_tree_is_named_not_stored_and_made_again_from_its_task(log: EventLog) -> None:
    service, ident = await _session(log, "s5", task="hello_file")
    env = service.env
    assert isinstance(env, Sandbox)
    seeded = service.sessions[ident].state
    record = await env.export_state(seeded)
    assert msgspec.json.decode(record)["pristine"] is True
    assert await (await env.blobs()).names() == set()  # seeding put nothing in the bucket

    fresh = Sandbox()
    fresh.bind(log)
    made = await fresh.import_state(record, 1)
    try:
        assert made.root != seeded.root and scan(made.root).manifest == scan(seeded.root).manifest
    finally:
        fresh.close(made)
    # a task that no longer makes the tree it was seeded with (an upgrade changed it): refused
    changed = msgspec.json.decode(record)
    changed["task"]["files"]["README.md"] = "Write something else.\n"
    with pytest.raises(SnapshotError, match="no longer makes the tree it was seeded with"):
        await fresh.import_state(msgspec.json.encode(changed), 1)
    # once a tool changed it, the tree is stored
    await _run(service, ident, "echo hello sandbox > out.txt")
    stored = await env.export_state(service.sessions[ident].state)
    assert msgspec.json.decode(stored)["pristine"] is False
    assert msgspec.json.decode(stored)["manifest"] in await (await env.blobs()).names()


def test_without_bubblewrap_the_sandbox_refuses_to_start_unless_unisolated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(Sandbox, "runner", None)  # put back as it was when the test ends
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    assert shutil.which("bwrap") is None
    with pytest.raises(ConfigError, match=r"bubblewrap .* is not installed.*--unisolated"):
        Sandbox().open()
    Sandbox().open(unisolated=True)
    assert Sandbox.runner is not None and not Sandbox.runner.isolated
