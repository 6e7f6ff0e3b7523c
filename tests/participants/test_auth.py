"""Per-role credentials, enforced by a real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest

from rollcut import PermissionDeniedError, RollcutError
from rollcut.bus import BusConfig, Credentials, EmbeddedServer, EventLog, ParticipantLeaseExpired
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, Participant
from rollcut.tokens import LocalTokenStore

from ..helpers import boundary_event, model_event

NS = "secure"


@pytest.fixture(scope="module")
def creds() -> Credentials:
    return Credentials.generate(NS)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, creds: Credentials) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(tmp_path_factory.mktemp("authnats"), credentials=creds) as srv:
        yield srv


@pytest.fixture
async def admin(server: EmbeddedServer, creds: Credentials) -> AsyncIterator[EventLog]:
    lg = await EventLog.connect(BusConfig(url=server.url).as_role(creds, "admin"))  # creates the stream
    yield lg
    await lg.close()


async def test_unauthenticated_client_is_refused(server: EmbeddedServer) -> None:
    with pytest.raises(Exception, match="Authorization Violation"):
        await nats.connect(server.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
    with pytest.raises(RollcutError):
        await EventLog.connect(BusConfig(url=server.url, namespace=NS, user="model", password="wrong"))


async def test_a_participant_writes_only_its_own_subjects(
    server: EmbeddedServer, creds: Credentials, admin: EventLog
) -> None:
    await admin.dispatch("r1", {}, instance="collector-0")
    # a denial is the server's answer, not a timeout: one would take the whole (long) request timeout
    config = BusConfig(url=server.url, request_timeout_s=600).as_role(creds, "model", "model-0")
    model = await EventLog.connect(config)
    try:
        assert await model.append(model_event("r1")) > 0
        before = await admin.last_seq()
        with pytest.raises(PermissionDeniedError, match=r"\.agent"):
            await model.append(boundary_event("r1", 0))  # the agent's subject
        forged = ParticipantLeaseExpired(
            component="coordinator", instance="model-0", checkpoint_id="ck", participant="model-0"
        )
        with pytest.raises(PermissionDeniedError, match=r"mark\.checkpoint"):
            await model.append(forged)  # a coordinator marker
        with pytest.raises(PermissionDeniedError, match="fence"):
            await model.tombstone("r1", 1, instance="model-0")
        assert await admin.last_seq() == before
    finally:
        await model.close()


async def test_checkpoint_with_role_credentials(
    server: EmbeddedServer, creds: Credentials, admin: EventLog, tmp_path: Path
) -> None:
    base = BusConfig(url=server.url, request_timeout_s=5)
    plog = await EventLog.connect(base.as_role(creds, "resources", "res-0"))
    clog = await EventLog.connect(base.as_role(creds, "coordinator"))
    p = await Participant(plog, component="resources", instance="res-0", mode="exported").start()
    try:
        # a participant may not send control requests to anyone: capabilities go only to the coordinator
        with pytest.raises(nats.errors.TimeoutError):
            await plog.nc.request(p.control_subject, b"{}", timeout=0.5)
        with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tmp_path / "tokens") as tokens:
            res = await Coordinator(clog, led, tokens).checkpoint(deadline_s=5)
            assert led.checkpoint(res.record.checkpoint_id) is not None
            assert res.participants == ["res-0"] and p.gate.state == "open"
    finally:
        await p.stop()
        await plog.close()
        await clog.close()


async def test_resources_and_agent_servers_store_sandbox_trees_in_the_namespaces_bucket_and_no_other_role_can(
    server: EmbeddedServer, creds: Credentials, admin: EventLog, tmp_path: Path
) -> None:
    from rollcut.sandbox import BlobStore, scan

    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "f.txt").write_text("kept across a crash\n")
    tree = scan(tmp_path / "tree")
    res = await EventLog.connect(BusConfig(url=server.url, request_timeout_s=5).as_role(creds, "resources"))
    try:
        store = await BlobStore.open(res.nc.jetstream(), NS)  # created on first use, by this role
        assert (await store.put_tree(tree)).blobs_put == 1
        await store.materialise(tree.manifest, tmp_path / "back")
        assert (tmp_path / "back" / "f.txt").read_text() == "kept across a crash\n"
    finally:
        await res.close()
    agent = await EventLog.connect(BusConfig(url=server.url, request_timeout_s=5).as_role(creds, "agent"))
    try:  # an opaque agent's sandbox provider (--sandbox) reads and writes the same bucket
        store = await BlobStore.open(agent.nc.jetstream(), NS)
        assert await store.fetch(tree.manifest.entries[0].digest) == b"kept across a crash\n"
    finally:
        await agent.close()
    model = await EventLog.connect(BusConfig(url=server.url, request_timeout_s=2).as_role(creds, "model"))
    try:
        with pytest.raises(Exception, match=r"(?i)permission|timeout"):
            await (await BlobStore.open(model.nc.jetstream(), NS)).fetch(tree.manifest.entries[0].digest)
    finally:
        await model.close()
