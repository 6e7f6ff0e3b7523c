"""A participant's own failure costs its rollout, never the namespace (issue 49): a sandbox session
that cannot be snapshotted, an attempt a newer one superseded, and the "found twice" rule, each
on a real nats-server with real participants and the real sandbox server's service."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollcut.bus import Codec, Credentials, EmbeddedServer, EventLog
from rollcut.gym.resources import ResourcesService, Sandbox
from rollcut.gym.wire import GymError, Identity
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, Participant, PrepareReport, plan_recovery

from ..helpers import until
from .conftest import forged_admitted

NS = "sec"


@pytest.fixture
async def sandbox(
    server: EmbeddedServer, creds: Credentials, admin: EventLog
) -> AsyncIterator[ResourcesService]:
    """The sandbox server's service as a participant of the namespace, as ``rollcut serve`` runs it."""
    log = await EventLog.connect(admin.config.as_role(creds, "resources", "sandbox-w0"), name="sandbox-w0")
    part = Participant(log, component="resources", instance="sandbox-w0", mode="exported")
    service = ResourcesService(log, Sandbox(), instance="sandbox-w0", participant=part)
    part.hooks = service
    await part.start()
    try:
        yield service
    finally:
        service.close_all()
        await part.stop()
        await log.close()


async def _seeded(admin: EventLog, service: ResourcesService, rid: str) -> Identity:
    await admin.dispatch(rid, {"task": "hello_file"}, instance="collector-0")
    ident = Identity(rid, 1)
    await service.seed(ident, {"task": "hello_file"})
    return ident


async def test_a_session_that_cannot_be_snapshotted_quarantines_its_rollout_and_the_checkpoint_publishes(
    admin: EventLog, sandbox: ResourcesService, tmp_path: Path
) -> None:
    venv = await _seeded(admin, sandbox, "venv-maker")
    bystander = await _seeded(admin, sandbox, "bystander")
    made = await sandbox.tool(venv, "run", {"command": "python3 -m venv --without-pip .venv"})
    assert made["result"]["exit_code"] == 0, made  # a link out of the tree: allowed live, not across a cut
    await sandbox.tool(bystander, "write_file", {"path": "out.txt", "content": "hello sandbox\n"})
    with Ledger(tmp_path / "ledger") as ledger:
        coordinator = Coordinator(admin, ledger, None, instance="coordinator")
        # before: "sandbox-w0 refused prepare ... the symlink '.venv/bin/python3' points out of the tree",
        # and so did every checkpoint after it, for every rollout of the namespace
        first = await coordinator.checkpoint(deadline_s=20)
        second = await coordinator.checkpoint(deadline_s=20)
        plan = await plan_recovery(admin, ledger)
    why = first.record.quarantined["venv-maker"]
    assert "points out of the tree" in why and "sandbox-w0" in why, why
    assert list(first.record.quarantined) == ["venv-maker"] == list(second.record.quarantined)
    assert "venv-maker" in plan.fresh_dispatch and "points out of the tree" in plan.quarantined["venv-maker"]
    assert "bystander" in plan.continue_ and "bystander" not in plan.quarantined


async def test_a_superseded_attempts_session_goes_when_the_new_attempt_opens_and_never_fails_a_prepare(
    admin: EventLog, sandbox: ResourcesService, tmp_path: Path
) -> None:
    old = await _seeded(admin, sandbox, "healed")
    await sandbox.tool(old, "write_file", {"path": "out.txt", "content": "half done\n"})
    root = sandbox.sessions[old].state.root
    await admin.supersede("healed", 1, instance="collector-0", reason="agent restarted")
    # the newer attempt's opening, heard on the fence, drops the old session and its directory
    await until(lambda: old not in sandbox.sessions, what="attempt 1's session to be dropped")
    assert not root.exists()
    with pytest.raises(GymError) as late:  # a late call of the old attempt: stale, not "no session"
        await sandbox.tool(old, "run", {"command": "true"})
    assert late.value.kind == "stale_attempt"
    with Ledger(tmp_path / "ledger") as ledger:
        published = await Coordinator(admin, ledger, None, instance="coordinator").checkpoint(deadline_s=20)
    assert published.record.quarantined == {}


async def test_a_stale_session_still_held_at_a_prepare_is_dropped_not_a_failed_checkpoint(
    admin: EventLog, sandbox: ResourcesService, tmp_path: Path
) -> None:
    old = await _seeded(admin, sandbox, "healed-late")
    await sandbox.tool(old, "write_file", {"path": "out.txt", "content": "half done\n"})
    sandbox.supersede = lambda rollout_id, attempt: 0  # type: ignore[method-assign]  # the opening unheard
    await admin.supersede("healed-late", 1, instance="collector-0", reason="agent restarted")
    with Ledger(tmp_path / "ledger") as ledger:
        # before: "sandbox-w0 refused prepare: ... attempt 1 is stale (attempt 2 is current)"
        published = await Coordinator(admin, ledger, None, instance="coordinator").checkpoint(deadline_s=20)
    assert published.record.quarantined == {} and old not in sandbox.sessions


async def test_the_found_twice_rule_holds_across_coordinator_processes(
    server: EmbeddedServer,
    creds: Credentials,
    admin: EventLog,
    raw_as: object,
    data_dir: Path,
    tmp_path: Path,
) -> None:
    """``rollcut checkpoint`` is a new coordinator each time: the first run's findings are on the
    lane, so the second quarantines what the first found (before: every run failed again)."""

    class Idle:
        async def prepare(self, checkpoint_id: str) -> PrepareReport:
            return PrepareReport(calls=[])

        async def restore(self, checkpoint_id: str, cut: int) -> None:
            return None

    await admin.dispatch("victim", {"task": 1}, instance="collector-0")
    model = await EventLog.connect(admin.config.as_role(creds, "model", "model-w0"), name="model-w0")
    part = Participant(model, component="model", instance="model-w0", mode="exported")
    part.hooks = Idle()
    await part.start()
    try:
        await model.nc.jetstream().publish(  # on the participant's own connection, as if it admitted it
            admin.subjects.event("victim", 1, "model", "model-w0"), Codec().encode(forged_admitted("victim"))
        )
        home = tmp_path / "home"
        # in a thread: this loop answers for the participant while each CLI process coordinates
        runs = [await asyncio.to_thread(_checkpoint, server, data_dir, home) for _ in range(2)]
    finally:
        await part.stop()
        await model.close()
    assert runs[0].returncode != 0 and "omits it" in runs[0].stderr, runs[0].stderr + runs[0].stdout
    assert runs[1].returncode == 0, runs[1].stderr
    assert '"victim"' in runs[1].stdout and "omits it" in runs[1].stdout


def _checkpoint(server: EmbeddedServer, data_dir: Path, home: Path) -> subprocess.CompletedProcess[str]:
    where = ["--url", server.url, "--credentials", str(data_dir / "credentials.json"), "--namespace", NS]
    argv = [sys.executable, "-m", "rollcut", "checkpoint", "--json", *where, "--home", str(home)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)
