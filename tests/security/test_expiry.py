"""Identities expire, and a live process renews its own (issue 54: a copy of a worker's identity
logged in for as long as its name did not connect again; the JWT had no expiry)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import msgspec
import nats
import nats.errors
import pytest

from rollcut.bus import BusConfig, Credentials, EmbeddedServer, EventLog, login_options, role_file
from rollcut.bus._jwt import decode_claims
from rollcut.testing import ServerProcess

from ..helpers import until
from .conftest import NS

TTL = 3


@pytest.fixture
def creds() -> Credentials:
    """The namespace's credentials, its identities good for ``TTL`` seconds after issue."""
    return msgspec.structs.replace(Credentials.generate(NS), identity_ttl_s=TTL)


async def test_an_identity_expires_its_unrenewed_connection_is_closed_and_a_copy_is_refused(
    server: EmbeddedServer,
    creds: Credentials,
    admin: EventLog,  # the stream, made
) -> None:
    copy = creds.issue("model", "model-w0")  # what a left file or a captured pipe holds: no key to renew
    assert copy.identity is not None
    claims = decode_claims(copy.identity.jwt)
    assert claims["exp"] - claims["iat"] == TTL
    log = await EventLog.connect(BusConfig(url=server.url).as_role(copy, "model", "model-w0"))
    try:
        why = await asyncio.wait_for(log.wait_lost(), TTL + 30)
    finally:
        await log.close()
    assert "user authentication expired" in why.lower()
    assert time.time() >= claims["exp"]
    # the server refuses an identity once its expiry's second is over (in that second it lets one
    # in and closes it at once)
    await until(lambda: time.time() >= claims["exp"] + 1, timeout=5, what="the expiry's second over")
    login = login_options(BusConfig(url=server.url).as_role(copy, "model"))
    with pytest.raises((nats.errors.NoServersError, nats.errors.Error)):
        nc = await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, **login)
        await nc.close()


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_live_server_renews_its_identity_and_goes_on_past_its_expiry(
    workers: int, data_dir: Path, server: EmbeddedServer, creds: Credentials, admin: EventLog, tmp_path: Path
) -> None:
    """One worker renews its identity with its role's key; each of two is renewed by its parent,
    through the pipe it was given its identity by. Past the first identities' expiry, every worker
    answers and stores."""
    role = role_file(data_dir / "credentials.json", "model")
    argv = ["model", "--tokens", str(tmp_path / "tokens"), "--url", server.url, "--namespace", NS]
    argv += ["--credentials", str(role), "--workers", str(workers)]
    srv = ServerProcess(argv, workers=workers, logs=tmp_path / "logs")
    await asyncio.to_thread(srv.start)  # the admin log's own renewals run meanwhile
    ready = time.time()  # every worker's first identity was issued before: it expires by ready + TTL
    try:
        past = ready + TTL + 0.5
        await until(lambda: time.time() > past, timeout=TTL * 10, what="the first identities' expiry")
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            for i in range(2 * workers):  # rollouts of every worker
                rid = f"r{i}"
                await admin.dispatch(rid, {}, instance="collector")
                answer = await client.post(
                    "/v1/chat/completions",
                    headers={"x-rollout-id": rid, "x-rollout-attempt": "1"},
                    json={"messages": [{"role": "user", "content": "still here?"}]},
                )
                assert answer.status_code == 200, answer.text
            stats = (await client.get("/rollcut/stats")).json()
        each = stats["workers"] if workers > 1 else [stats]
        assert [w["identity_renewals"] >= 1 for w in each] == [True] * workers
        assert srv.p is not None and srv.p.poll() is None  # not lost, not exited 77
        kinds = [type(s.event).__name__ async for s in admin.read(rollout_id="r0")]
        assert "ModelCallCompleted" in kinds
    finally:
        srv.close()
