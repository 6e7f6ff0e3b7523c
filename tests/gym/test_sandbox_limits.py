"""The sandbox holds what it promises (issue 49), tried as an attacker's tool calls would try it, on
the real bus with its commands under bubblewrap: what a session may hold, what a command may use,
what a call leaves behind, and what it may read of the host."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollcut.bus import BusConfig, EventLog
from rollcut.gym import ResourcesServe
from rollcut.gym.resources import ResourcesService, Sandbox
from rollcut.gym.wire import GymError, Identity, status_of
from rollcut.sandbox import scan
from rollcut.testing import ServerProcess


async def _session(
    log: EventLog, rid: str, seed: dict[str, Any] | None = None
) -> tuple[ResourcesService, Identity]:
    service = ResourcesService(log, Sandbox(), instance="sandbox-0")
    seed = seed or {"task": "hello_file"}
    await log.dispatch(rid, seed, instance="collector")
    ident = Identity(rid, 1)
    await service.seed(ident, seed)
    return service, ident


async def _run(service: ResourcesService, ident: Identity, command: str, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = (await service.tool(ident, "run", {"command": command, **extra}))["result"]
    return out


@pytest.fixture(autouse=True)
def _own_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's own temporary directory: what it finds there is what its sessions left."""
    mine = tmp_path / "tmp"
    mine.mkdir()
    monkeypatch.setenv("TMPDIR", str(mine))
    monkeypatch.setattr(tempfile, "tempdir", None)  # computed again from TMPDIR on next use


def _drafts() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("rollcut-sandbox-*")}


async def _refused(service: ResourcesService, ident: Identity, tool: str, args: dict[str, Any]) -> str:
    with pytest.raises(GymError) as err:
        await service.tool(ident, tool, args)
    assert status_of(err.value.kind) == 400, err.value
    return str(err.value)


async def test_a_fifo_is_refused_at_the_call_that_makes_it_and_the_session_goes_on(log: EventLog) -> None:
    service, ident = await _session(log, "fifo")
    for command in ("mkfifo f", "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('s')\""):
        why = await _refused(service, ident, "run", {"command": command})
        assert "a named pipe at 'f'" in why or "a socket at 's'" in why, why
    # before: every later call on the session was a 500 (shutil.Error: 'f' is a named pipe)
    assert (await _run(service, ident, "echo 'hello sandbox' > out.txt"))["exit_code"] == 0
    assert (await service.verify(ident, {}))["passed"]
    assert service.sessions[ident].revision == 1  # the refused calls wrote nothing
    assert _drafts() == {service.sessions[ident].state.root.name}  # and left no draft behind


async def test_sparse_files_count_at_their_size_so_a_copy_cannot_amplify_them(log: EventLog) -> None:
    service, ident = await _session(log, "sparse")
    # nothing on disk, 1.2 GB in the next call's copy (before: four of 60 MB made the next copy write 241 MB)
    why = await _refused(
        service, ident, "run", {"command": "for i in $(seq 20); do truncate -s 60M s$i; done"}
    )
    assert "sparse files count at their full size" in why, why
    root = service.sessions[ident].state.root
    assert not any(root.glob("s*")) and service.sessions[ident].revision == 0


async def test_memory_and_processes_are_bounded_for_a_command_run_as_root(log: EventLog) -> None:
    service, ident = await _session(log, "greedy")
    runner = service.env._runner()  # type: ignore[attr-defined]
    assert runner.confinement.group() is not None, "this machine lets rollcut make control groups"
    hog = await _run(service, ident, "python3 -c \"b = bytearray(3 << 30); print('allocated')\"")
    assert hog["exit_code"] != 0 and "allocated" not in hog["stdout"], hog
    forks = await _run(
        service, ident, "n=0; for i in $(seq 300); do sleep 5 & n=$((n+1)); done; echo $n", timeout_s=20
    )
    assert forks["exit_code"] != 0 or "fork" in forks["stderr"].lower(), forks  # 300 at once: refused
    assert "Cannot fork" in forks["stderr"] or "Resource temporarily unavailable" in forks["stderr"], forks


async def test_the_hosts_secrets_in_etc_are_not_readable_in_the_sandbox(log: EventLog) -> None:
    service, ident = await _session(log, "reader")
    shadow = await _run(service, ident, "cat /etc/shadow /etc/ssl/private/* /etc/ssh/*key*; ls /etc")
    assert "root:" not in shadow["stdout"] and "PRIVATE KEY" not in shadow["stdout"], shadow
    assert {"shadow", "gshadow", "ssh"}.isdisjoint(shadow["stdout"].split()), shadow
    works = await _run(
        service, ident, "python3 -c 'import json, ssl; print(1)' && id -u && awk 'BEGIN{print 2}'"
    )
    assert works["exit_code"] == 0 and works["stdout"].split() == ["1", "0", "2"], works
    wrote = await _run(service, ident, "echo owned > /etc/owned")  # the sandbox's root is read-only too
    assert wrote["exit_code"] != 0, wrote


@pytest.mark.parametrize(
    ("tool", "args", "said"),
    [
        ("run", {"command": "true", "timeout_s": "nan"}, "timeout_s must be a number"),
        ("run", {"command": "true", "timeout_s": float("inf")}, "timeout_s must be a number"),
        ("run", {"command": "true", "timeout_s": -1}, "timeout_s must be a number"),
        ("run", {"command": "true", "timeout_s": True}, "timeout_s must be a number"),
    ],
)
async def test_bad_tool_arguments_are_400s_that_change_nothing(
    log: EventLog, tool: str, args: dict[str, Any], said: str
) -> None:
    service, ident = await _session(log, f"bad-{abs(hash(str(args))) % 10_000}")
    assert said in await _refused(service, ident, tool, args)
    assert service.sessions[ident].revision == 0
    ok = await _run(service, ident, "echo fine", timeout_s="5")  # a number a model wrote as text is one
    assert ok["exit_code"] == 0 and service.sessions[ident].revision == 1


@pytest.mark.parametrize(
    ("seed", "said"),
    [
        ({"task": {}}, "no bundled task"),
        ({"files": {".": "x"}, "check": "true"}, "not a text file inside the tree"),
        ({"files": {"a": "x", "a/b": "y"}, "check": "true"}, "both as a file and as a directory"),
        ({"files": {"big.txt": "x" * (300 << 10)}, "check": "true"}, "at most 262144 bytes"),
    ],
)
async def test_bad_seeds_are_400s_that_leave_nothing(log: EventLog, seed: dict[str, Any], said: str) -> None:
    service = ResourcesService(log, Sandbox(), instance="sandbox-0")
    rid = f"seed-{abs(hash(str(seed)[:200])) % 10_000}"
    await log.dispatch(rid, {}, instance="collector")
    before = _drafts()
    with pytest.raises(GymError) as err:
        await service.seed(Identity(rid, 1), seed)
    assert status_of(err.value.kind) == 400 and said in str(err.value), err.value
    assert _drafts() == before and service.sessions == {}


async def test_an_inline_task_at_the_documented_bound_restores(log: EventLog) -> None:
    """Before: a task of 5 KB or more could never be restored (its snapshot record was capped at
    4,096 bytes), and one of 600 KB was a 500 at seeding."""
    files = {f"f{i:03d}.txt": "y" * 2400 for i in range(100)}  # about 245 KB
    seed = {"files": files, "check": "test -f f000.txt", "prompt": "p"}
    service, ident = await _session(log, "inline", seed)
    await service.tool(ident, "write_file", {"path": "notes.txt", "content": "mine\n"})
    env = service.env
    assert isinstance(env, Sandbox)
    state = service.sessions[ident].state
    blob = await env.export_state(state)
    again = await env.import_state(blob, env.codec_version)
    try:
        assert scan(again.root).manifest == scan(state.root).manifest and again.task.files == files
    finally:
        env.close(again)


async def test_a_seed_over_what_one_record_holds_is_a_413_for_every_environment(log: EventLog) -> None:
    from rollcut.gym.resources import ENVIRONMENTS

    await log.dispatch("huge", {}, instance="collector")
    for name in ("counter", "sandbox"):
        service = ResourcesService(log, ENVIRONMENTS[name](), instance=f"{name}-0")
        with pytest.raises(GymError) as err:  # before: a 500 (EventTooLargeError)
            await service.seed(Identity("huge", 1), {"start": 0, "junk": "z" * (2 << 20)})
        assert status_of(err.value.kind) == 413, err.value
        assert service.sessions == {}


async def test_a_clean_stop_leaves_no_session_directory(
    log: EventLog, bus_config: BusConfig, tmp_path: Path
) -> None:
    """``rollcut serve resources sandbox`` stopped with SIGTERM removes what its sessions held
    (before: every session directory stayed in the temporary directory)."""
    tmp = tmp_path / "tmp"  # this test's own TMPDIR, which the server inherits
    opts = ResourcesServe(url=bus_config.url, namespace=bus_config.namespace, env="sandbox")
    server = ServerProcess.serving(opts, logs=tmp_path / "logs").start()
    try:
        await log.dispatch("stops", {}, instance="collector")
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            seeded = await client.post(
                "/seed_session",
                json={"task": "hello_file"},
                headers={"x-rollout-id": "stops", "x-rollout-attempt": "1"},
            )
        assert seeded.status_code == 200, seeded.text
        assert len(list(tmp.glob("rollcut-sandbox-*"))) == 1
    finally:
        assert server.p is not None
        server.p.send_signal(signal.SIGTERM)
        code = server.p.wait(timeout=60)
    assert code == 128 + signal.SIGTERM, server.tail()  # stopped by it, after its own clean-up
    assert list(tmp.glob("rollcut-sandbox-*")) == []
