"""Secrets nobody else can read, a permission matrix per instance identity, and a checkpoint that a
lost token store cannot fool (issue 29: one credential per instance)."""

from __future__ import annotations

import os
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
    secrets = [*creds.signing.values(), creds.operator, creds.account, creds.system]
    assert all(seed and seed not in text for seed in secrets)  # JWTs and public keys only
    assert creds.account_key in text  # the account, its role keys inside its signed JWT


def test_the_ledger_and_token_store_are_owner_only(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger"), LocalTokenStore(tmp_path / "tokens") as tokens:
        tokens.put("c1", TokenRecord(prompt_ids=[1], output_ids=[2], logprobs=[-0.1]))
    for d in (tmp_path / "ledger", tmp_path / "tokens"):
        assert _mode(d) == 0o700
        assert _mode(d / "data.mdb") == 0o600


# (role, identity name) -> (subject, may publish?) over the namespace's subjects
PUBLISH = {
    ("model", "model-w0"): [
        ("ev.r.1.model.model-w0", True),  # an attempt's events, on its own subject
        ("ev.r.1.model.model-w1", False),  # not as a sibling (issue 54)
        ("ev.r.1.model", False),  # nor on the shape written before, which names no writer
        ("ev.r.1.agent.model-w0", False),
        ("ev.r.1.agent", False),
        ("fence.r", False),
        ("mark.checkpoint", False),
        ("mark.model-w0", True),  # its own lane
        ("mark.model-w1", False),  # a sibling's
        ("mark.agent-w0", False),  # another component's (finding 5)
        ("ctl.model.model-w0", False),
        ("hello.model.model-w0", True),  # answers a ping as itself
        ("hello.model.model-w1", False),  # not as a sibling
        ("hello.agent.ghost-w0", False),  # nor as a made-up instance (finding 6)
        ("ping", False),
    ],
    ("resources", "counter-w0"): [
        ("ev.r.1.resources.counter-w0", True),
        ("ev.r.1.resources.counter-w1", False),
        ("ev.r.1.model.counter-w0", False),
        ("ev.r.1.model", False),
        ("ev.r.1.collector", False),
        ("fence.r", False),
        ("hello.resources.counter-w0", True),
        ("hello.resources.counter-w1", False),
    ],
    ("agent", "agent-w1"): [
        ("ev.r.1.agent.agent-w1", True),
        ("ev.r.1.agent.agent-w0", False),
        ("ev.r.1.environment.agent-w1", False),
        ("mark.checkpoint", False),
        ("mark.collector", False),
        ("mark.agent-w1", True),
        ("mark.agent-w0", False),
        ("hello.agent.agent-w0", False),
    ],
    ("collector", None): [
        ("ev.r.1.collector", True),
        ("fence.r", True),
        ("ev.r.1.model", False),
        ("ev.r.1.model.model-w0", False),
        ("mark.checkpoint", False),
        ("mark.collector", True),
        ("hello.model.model-w0", False),
    ],
    ("coordinator", None): [
        ("mark.checkpoint", True),
        ("fence.r", True),
        ("ctl.model.model-w0", True),
        ("ping", True),
        ("ev.r.1.model", False),
        ("hello.model.model-w0", False),
    ],
}
SUBSCRIBE = {
    ("model", "model-w0"): [
        ("ctl.model.model-w0", True),
        ("ctl.model.model-w1", False),  # a sibling's control requests
        ("ctl.resources.counter-w0", False),
        ("ctl.agent.agent-w0", False),
        ("ping", True),
        ("hello.*.*", False),
    ],
    ("resources", "counter-w0"): [("ctl.resources.counter-w0", True), ("ctl.model.model-w0", False)],
    ("agent", "agent-w1"): [("ctl.agent.agent-w1", True), ("ctl.agent.agent-w0", False)],
    ("collector", None): [("ctl.model.model-w0", False), ("hello.*.*", False)],
    ("coordinator", None): [("ctl.model.model-w0", False), ("hello.*.*", True)],
}


@pytest.mark.parametrize("who", sorted(PUBLISH, key=str), ids=lambda w: f"{w[0]}-{w[1] or 'tool'}")
async def test_the_permission_matrix_of_each_instance(
    server: EmbeddedServer, creds: Credentials, raw_as: Any, who: tuple[str, str | None], admin: EventLog
) -> None:
    role, name = who
    nc = await raw_as(server, creds, role, name, error_cb=_ignore)
    prefix = admin.subjects.prefix

    async def denied(what: str, subject: str) -> bool:
        # the server answers in order: by the PONG of a PING sent after our command, nats-py has read
        # any -ERR for it (two round trips: the first flush may be answered by an earlier PONG)
        await nc.flush()
        await nc.flush()
        last = str(nc.last_error or "").lower()
        return f'permissions violation for {what} to "{subject}"' in last

    for suffix, allowed in PUBLISH[who]:
        subject = f"{prefix}.{suffix}"
        await nc.publish(subject, b"x")
        assert await denied("publish", subject) is (not allowed), (who, "publish", suffix)
    for suffix, allowed in SUBSCRIBE[who]:
        subject = f"{prefix}.{suffix}"
        sub = await nc.subscribe(subject)
        assert await denied("subscription", subject) is (not allowed), (who, "subscribe", suffix)
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
        assert set(creds.signing) == {role} and creds.signing[role] == full.signing[role], role
        assert not (creds.seeds or creds.operator or creds.account or creds.system), role


@pytest.mark.parametrize("schema", [1, 2])
async def test_credentials_of_an_earlier_schema_still_run_with_one_identity_per_role(
    tmp_path: Path, schema: int
) -> None:
    """A deployment's credentials.json of schema 2 (per-role nkey users) or 1 (passwords) still
    loads, starts its server and logs in; its roles are still fenced from each other's subjects."""
    import secrets as pysecrets

    import nkeys

    from rollcut import PermissionDeniedError
    from rollcut.bus import ROLES, ParticipantLeaseExpired, load_credentials

    if schema == 2:
        seeds = {r: nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode() for r in ROLES}
        old = Credentials(schema_version=2, namespace="old", seeds=seeds)
    else:
        old = Credentials(
            schema_version=1, namespace="old", passwords={r: pysecrets.token_hex(8) for r in ROLES}
        )
    old.save(tmp_path / "credentials.json")
    creds = load_credentials(tmp_path / "credentials.json")
    with EmbeddedServer(tmp_path / "nats", credentials=creds) as srv:
        admin = await EventLog.connect(BusConfig(url=srv.url).as_role(creds, "admin"))
        model = await EventLog.connect(BusConfig(url=srv.url, request_timeout_s=5).as_role(creds, "model"))
        try:
            forged = ParticipantLeaseExpired(
                component="coordinator", instance="m", checkpoint_id="ck", participant="m"
            )
            with pytest.raises(PermissionDeniedError, match=r"mark\.checkpoint"):
                await model.append(forged)
            assert await admin.last_seq() == 0
        finally:
            await model.close()
            await admin.close()
