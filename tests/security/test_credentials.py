"""Findings 4, 5 and 6: secrets nobody else can read, a permission matrix per role, and a checkpoint
that a lost token store cannot fool."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from rollcut import CheckpointFailedError
from rollcut.bus import BusConfig, Credentials, EmbeddedServer, EventLog
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator
from rollcut.tokens import LocalTokenStore, TokenRecord

from ..helpers import model_event


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secrets_and_user_data_are_owner_only(
    server: EmbeddedServer, creds: Credentials, data_dir: Path
) -> None:
    assert _mode(data_dir) == 0o700
    assert _mode(data_dir / "credentials.json") == 0o600
    conf = data_dir / "nats-server.conf"
    assert _mode(conf) == 0o600
    text = conf.read_text()
    assert all(seed not in text for seed in creds.seeds.values())  # public keys only
    assert all(creds.public_key(role) in text for role in creds.seeds)


def test_the_ledger_and_token_store_are_owner_only(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger"), LocalTokenStore(tmp_path / "tokens") as tokens:
        tokens.put("c1", TokenRecord(prompt_ids=[1], output_ids=[2], logprobs=[-0.1]))
    for d in (tmp_path / "ledger", tmp_path / "tokens"):
        assert _mode(d) == 0o700
        assert _mode(d / "data.mdb") == 0o600


# role -> (subject, may publish?) over the namespace's subjects
PUBLISH = {
    "model": [
        ("ev.r.1.model", True),
        ("ev.r.1.agent", False),
        ("fence.r", False),
        ("mark.checkpoint", False),
        ("ctl.model.model-w0", False),
        ("hello.model", True),  # announces itself, as its own component only
        ("hello.agent", False),
    ],
    "resources": [
        ("ev.r.1.resources", True),
        ("ev.r.1.model", False),
        ("ev.r.1.collector", False),
        ("fence.r", False),
    ],
    "agent": [
        ("ev.r.1.agent", True),
        ("ev.r.1.environment", False),
        ("mark.checkpoint", False),
        ("mark.collector", False),
        ("mark.agent-w0", True),
    ],
    "collector": [
        ("ev.r.1.collector", True),
        ("fence.r", True),
        ("ev.r.1.model", False),
        ("mark.checkpoint", False),
        ("mark.collector", True),
    ],
    "coordinator": [
        ("mark.checkpoint", True),
        ("fence.r", True),
        ("ctl.model.model-w0", True),
        ("ev.r.1.model", False),
    ],
}
SUBSCRIBE = {
    "model": [
        ("ctl.model.model-w0", True),
        ("ctl.resources.counter-w0", False),
        ("ctl.agent.agent-w0", False),
    ],
    "resources": [("ctl.resources.counter-w0", True), ("ctl.model.model-w0", False)],
    "agent": [("ctl.agent.agent-w0", True), ("ctl.model.model-w0", False)],
    "collector": [("ctl.model.model-w0", False), ("hello.*", False)],
    "coordinator": [("ctl.model.model-w0", False), ("hello.*", True)],
}


@pytest.mark.parametrize("role", sorted(PUBLISH))
async def test_the_permission_matrix_of_each_role(
    server: EmbeddedServer, creds: Credentials, raw_as: Any, role: str, admin: EventLog
) -> None:
    nc = await raw_as(server, creds, role, error_cb=_ignore)
    prefix = admin.subjects.prefix

    async def denied(what: str, subject: str) -> bool:
        # the server answers in order: by the PONG of a PING sent after our command, nats-py has read
        # any -ERR for it (two round trips: the first flush may be answered by an earlier PONG)
        await nc.flush()
        await nc.flush()
        last = str(nc.last_error or "").lower()
        return f'permissions violation for {what} to "{subject}"' in last

    for suffix, allowed in PUBLISH[role]:
        subject = f"{prefix}.{suffix}"
        await nc.publish(subject, b"x")
        assert await denied("publish", subject) is (not allowed), (role, "publish", suffix)
    for suffix, allowed in SUBSCRIBE[role]:
        subject = f"{prefix}.{suffix}"
        sub = await nc.subscribe(subject)
        assert await denied("subscription", subject) is (not allowed), (role, "subscribe", suffix)
        await sub.unsubscribe()


async def _ignore(exc: Exception) -> None:
    return None


async def test_a_wiped_token_store_fails_the_next_checkpoint_naming_the_store(
    server: EmbeddedServer, creds: Credentials, admin: EventLog, tmp_path: Path
) -> None:
    coord_log = await EventLog.connect(BusConfig(url=server.url).as_role(creds, "coordinator"))
    try:
        with Ledger(tmp_path / "ledger") as led:
            with LocalTokenStore(tmp_path / "tokens") as tokens:
                receipt = tokens.put(
                    "c1", TokenRecord(prompt_ids=[1], output_ids=[2, 3], logprobs=[-0.1, -0.2])
                )
                assert receipt.count == 2
                await admin.dispatch("r-w", {}, instance="collector-0")
                await admin.append(model_event("r-w", call_id="c1"))
                await Coordinator(coord_log, led, tokens).checkpoint(deadline_s=5)
            wiped = tmp_path / "wiped-tokens"  # the store is lost; an empty one takes its place
            with LocalTokenStore(wiped) as empty:
                with pytest.raises(CheckpointFailedError, match=rf"token store {wiped}.*wiped, rolled back"):
                    await Coordinator(coord_log, led, empty).checkpoint(deadline_s=5)
                assert len(led.checkpoints()) == 1  # nothing more was published
    finally:
        await coord_log.close()


def test_each_gym_server_is_given_its_own_roles_credentials_and_no_others(tmp_path: Path) -> None:
    """Least privilege on disk (issue 29): the harness (the demo's, the suite's) hands each server
    a file with its own role's seed alone; none of them holds the admin seed or another role's."""
    from rollcut.bus import load_credentials

    from ..e2e.conftest import deploy

    with deploy(tmp_path, envs=("counter",)) as dep:
        given = {}
        for proc in dep.stack:
            argv = proc.argv
            path = Path(argv[argv.index("--credentials") + 1])
            given[argv[0]] = load_credentials(path)
        full = load_credentials(dep.creds)
    assert set(given) == {"model", "resources", "agent", "environment"}
    for role, creds in given.items():
        assert set(creds.seeds) == {role} and creds.seeds[role] == full.seeds[role], role
        assert "admin" not in creds.seeds
