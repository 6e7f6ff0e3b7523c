"""One credential per instance (issue 29): membership trusts an answer only from the instance whose
identity it names (finding 6), and a replaced worker's old identity is revoked."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest

from rollcut.bus import (
    BusConfig,
    Credentials,
    EmbeddedServer,
    EventLog,
    login_options,
    role_file,
)
from rollcut.gym._http import gym_app
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, Participant
from rollcut.testing import ServerProcess
from rollcut.tokens import LocalTokenStore

from ..helpers import until

PROGRAMS = Path(__file__).parent / "programs"


async def _refused(url: str, creds: Credentials, *, deadline_s: float = 20.0) -> bool:
    """Whether a connection with identity file ``creds`` is refused, polled until ``deadline_s``: the
    authority revokes asynchronously (it hears the new identity's connect advisory, then re-signs)."""
    login = login_options(BusConfig(url=url).as_role(creds, creds.identity.role))  # type: ignore[union-attr]
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            nc = await nats.connect(url, allow_reconnect=False, max_reconnect_attempts=0, **login)
        except (nats.errors.NoServersError, nats.errors.Error, OSError):
            return True
        await nc.close()
        await asyncio.sleep(0.1)  # polling an outcome with a deadline, not waiting for one
    return False


async def test_a_participant_role_cannot_answer_a_ping_as_another_instance_or_a_made_up_one(
    server: EmbeddedServer, creds: Credentials, admin: EventLog, data_dir: Path, tmp_path: Path
) -> None:
    """Finding 6: the attacker holds the model role's file (what a model server is given) and runs
    as its own process: it answers every ping as a made-up agent ``ghost-w0`` and as the real
    ``agent-w0``, with every identity it can make. Neither answer reaches the coordinator, the
    checkpoint names exactly the live instance, and it publishes."""
    model_file = role_file(data_dir / "credentials.json", "model")
    agent_log = await EventLog.connect(BusConfig(url=server.url).as_role(creds, "agent", "agent-w0"))
    coord = await EventLog.connect(BusConfig(url=server.url).as_role(creds, "coordinator"))
    agent = await Participant(agent_log, component="agent", instance="agent-w0", mode="exported").start()
    report = tmp_path / "attack.json"
    attacker = subprocess.Popen(
        [sys.executable, str(PROGRAMS / "ping_impostor.py"), server.url, str(model_file), str(report)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert attacker.stdout is not None and attacker.stdout.readline().strip() == "LISTENING"
        with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tmp_path / "tokens") as tokens:
            result = await Coordinator(coord, led, tokens).checkpoint(deadline_s=5)
            assert result.participants == ["agent-w0"]
            assert led.checkpoint(result.record.checkpoint_id) is not None
    finally:
        attacker.terminate()
        attacker.wait(timeout=30)
        await agent.stop()
        await agent_log.close()
        await coord.close()
    seen = json.loads(report.read_text())
    assert seen["pings"] >= 1  # it did hear the ping, and answered it
    assert set(seen["denied"]) >= {"hello.agent.ghost-w0", "hello.agent.agent-w0", "hello.model.model-w1"}


async def test_a_second_identity_of_a_name_revokes_the_first(
    server: EmbeddedServer, creds: Credentials, admin: EventLog
) -> None:
    """The newest identity of an instance name is the only one accepted: the older's live connection
    is closed and it is refused from then on, also after the server restarts."""
    old = creds.issue("model", "model-w0")
    old_log = await EventLog.connect(BusConfig(url=server.url).as_role(old, "model", "model-w0"))
    new = creds.issue("model", "model-w0")
    new_log = await EventLog.connect(BusConfig(url=server.url).as_role(new, "model", "model-w0"))
    try:
        assert await _refused(server.url, old)
        # its live connection was closed by the server (the client learns it when the socket closes)
        await until(lambda: not old_log.nc.is_connected, timeout=10, what="the old connection closed")
        assert not old_log.nc.is_connected
        assert not await _refused(server.url, new, deadline_s=0.5)
        server.stop()
        server.start()
        assert await _refused(server.url, old, deadline_s=5)  # the revocation is on the server's disk
        assert not await _refused(server.url, new, deadline_s=0.5)
    finally:
        await new_log.close()
        await old_log.close()


_SEED = re.compile(rb"S[UAON][A-Z2-7]{50,}")  # an nkey seed: what makes or signs as an identity


def _keys_in(root: Path) -> list[str]:
    """Every file under ``root`` that holds a key (an nkey seed), by its path."""
    return sorted(str(f) for f in root.rglob("*") if f.is_file() and _SEED.search(f.read_bytes()))


def _identity_given(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return args[args.index(b"--identity") + 1].decode()


_KINDS = {
    "model": ["model", "--tokens", "{tmp}/tokens"],
    "resources": ["resources", "counter"],
    "agent": [
        "agent",
        "simple",
        "--model",
        "http://127.0.0.1:9",
        "--resources",
        "counter=http://127.0.0.1:9",
    ],
    "environment": ["environment", "--agent", "http://127.0.0.1:9"],
}


@pytest.mark.slow
async def test_a_restarted_worker_gets_a_new_identity_through_its_parents_pipe(
    data_dir: Path, server: EmbeddedServer, creds: Credentials, admin: EventLog, tmp_path: Path
) -> None:
    """A real server with two workers: each worker is given its own identity (not the role's key)
    through a pipe its parent wrote, never a file; SIGKILL worker 1 and its parent starts it again
    with a new identity, as itself (issue 54: a file outlived its SIGKILLed server and still logged
    in)."""
    role = role_file(data_dir / "credentials.json", "resources")
    argv = ["resources", "counter", "--url", server.url, "--namespace", creds.namespace]
    srv = ServerProcess(
        [*argv, "--credentials", str(role), "--workers", "2"], workers=2, logs=tmp_path
    ).start()
    try:
        assert _identity_given(srv.instances["counter-w1"]).startswith("fd:")
        srv.kill_worker("counter-w1")
        assert _identity_given(srv.instances["counter-w1"]).startswith("fd:")
        coordinator = Coordinator(admin, Ledger(tmp_path / "ledger"), LocalTokenStore(tmp_path / "tokens"))
        found = await coordinator.membership.discover(expect=frozenset({"counter-w0", "counter-w1"}))
        assert {i.instance for i in found} == {"counter-w0", "counter-w1"}  # logged in as itself again
    finally:
        srv.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(_KINDS))
async def test_a_sigkilled_server_of_several_workers_leaves_no_key_behind_and_the_next_reaps_its_directory(
    kind: str,
    data_dir: Path,
    server: EmbeddedServer,
    creds: Credentials,
    admin: EventLog,  # the stream, made
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the servers' temporary files, and nobody else's; a short path: a unix socket's is at most 107 bytes
    temp = tmp_path_factory.mktemp("k")
    monkeypatch.setenv("TMPDIR", str(temp))
    role = role_file(data_dir / "credentials.json", kind)
    argv = [a.format(tmp=tmp_path) for a in _KINDS[kind]]
    argv += [
        "--url",
        server.url,
        "--namespace",
        creds.namespace,
        "--credentials",
        str(role),
        "--workers",
        "2",
    ]
    first = ServerProcess(argv, workers=2, logs=tmp_path / "first").start()
    try:
        assert all(_identity_given(pid).startswith("fd:") for pid in first.instances.values())
        assert _keys_in(temp) == []  # running: no file holds a worker's key
    finally:
        first.kill()  # SIGKILL, the parent and both workers at once: no cleanup runs
    left = sorted(temp.glob("rollcut-peers-*"))
    assert left and _keys_in(temp) == []  # what it left holds no key
    second = ServerProcess(argv, workers=2, logs=tmp_path / "second").start()
    try:
        assert not any(d.exists() for d in left)  # the dead parent's directory, reaped at the next start
    finally:
        second.close()
    assert sorted(temp.glob("rollcut-*")) == []  # closed (a teardown), a server leaves nothing behind


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_server_whose_identity_is_revoked_says_so_exits_77_and_is_not_started_again(
    workers: int, data_dir: Path, server: EmbeddedServer, creds: Credentials, admin: EventLog, tmp_path: Path
) -> None:
    """A second process takes ``model-w0`` (as a second ``rollcut serve model`` under the default name
    does): the authority revokes the first's identity, and the first stops storing, says why and
    exits 77 (the exit code table's BUS_LOST), where it used to answer ``/healthz`` 200 while every
    call failed; its supervisor does not start it again under the name that is the other's now."""
    role = role_file(data_dir / "credentials.json", "model")
    argv = ["model", "--tokens", str(tmp_path / "tokens"), "--url", server.url]
    argv += ["--namespace", creds.namespace, "--credentials", str(role), "--workers", str(workers)]
    first = ServerProcess(argv, workers=workers, logs=tmp_path / "logs").start()
    try:
        taker = await EventLog.connect(
            BusConfig(url=server.url).as_role(creds.issue("model", "model-w0"), "model", "model-w0")
        )
        try:
            assert first.p is not None
            rest, _ = await asyncio.to_thread(first.p.communicate, timeout=120)
        finally:
            await taker.close()
        assert first.p.returncode == 77, rest
        assert "BUS_LOST model-w0: the bus closed this connection for good" in rest
        assert "RESTARTED" not in rest
    finally:
        first.close()


async def test_healthz_says_the_bus_is_lost_in_the_error_shape() -> None:
    app = gym_app("t")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.get("/healthz")).status_code == 200
        app.state.bus_lost = lambda: "the bus closed this connection for good (AuthorizationError())"
        lost = await http.get("/healthz")
    assert lost.status_code == 503
    assert (
        lost.json()["error"]["code"] == "bus_lost" and "AuthorizationError" in lost.json()["error"]["message"]
    )
