"""A real nats-server with role credentials per test; attackers connect with a role's own credentials."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from rollcut.bus import BusConfig, Credentials, EmbeddedServer, EventLog, ModelCallAdmitted, login_options

NS = "sec"


@pytest.fixture
def creds() -> Credentials:
    return Credentials.generate(NS)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "nats"


@pytest.fixture
def server(data_dir: Path, creds: Credentials) -> Iterator[EmbeddedServer]:
    creds.save(data_dir / "credentials.json")
    with EmbeddedServer(data_dir, credentials=creds) as srv:
        yield srv


@pytest.fixture
async def admin(server: EmbeddedServer, creds: Credentials) -> AsyncIterator[EventLog]:
    log = await EventLog.connect(BusConfig(url=server.url, request_timeout_s=5).as_role(creds, "admin"))
    yield log
    await log.close()


@pytest.fixture
async def raw_as() -> AsyncIterator[object]:
    """``await raw_as(server, creds, role, name=None)``: a plain nats-py connection with an identity
    of ``role`` named ``name`` (made from the role's key, as a server of that role makes its own)."""
    opened: list[Client] = []

    async def connect(
        server: EmbeddedServer, creds: Credentials, role: str, name: str | None = None, **kw: object
    ) -> Client:
        login = login_options(BusConfig(url=server.url).as_role(creds, role, name))
        nc = await nats.connect(server.url, allow_reconnect=False, **login, **kw)
        opened.append(nc)
        return nc

    yield connect
    for nc in opened:
        await nc.close()


def forged_admitted(rollout_id: str) -> ModelCallAdmitted:
    """A valid model-call admission, as if ``model-w0`` had admitted it (the attacks publish it on the
    model role's own connection)."""
    return ModelCallAdmitted(
        component="model",
        instance="model-w0",
        rollout_id=rollout_id,
        attempt=1,
        call_id="c-forged",
        request_digest="ab" * 8,
    )
