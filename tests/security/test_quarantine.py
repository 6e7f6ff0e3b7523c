"""No single record stops recovery, checkpoints or verify: a record that cannot belong costs its own
rollout or lane, and everything else goes on. Each attack is made as the model role would make it,
on its own connection; then the operator's commands run as processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollcut import CheckpointFailedError
from rollcut.bus import (
    AgentBoundary,
    AgentBoundaryRecord,
    Codec,
    Credentials,
    EmbeddedServer,
    EventLog,
)

from .conftest import forged_admitted

NS = "sec"


def _cli(server: EmbeddedServer, data_dir: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    where = ["--url", server.url, "--credentials", str(data_dir / "credentials.json"), "--namespace", NS]
    argv = [sys.executable, "-m", "rollcut", *args, *where, "--home", str(home)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def test_a_participant_record_of_a_rollout_never_dispatched_does_not_block_restore(
    server: EmbeddedServer, creds: Credentials, admin: EventLog, raw_as: Any, data_dir: Path, tmp_path: Path
) -> None:
    await admin.dispatch("real", {"task": 1}, instance="collector-0")
    await admin.append(
        AgentBoundary(
            component="agent",
            instance="agent-w0",
            rollout_id="real",
            attempt=1,
            record=AgentBoundaryRecord(turn=1, output_items=[{"turn": 1}]),
        )
    )
    nc = await raw_as(server, creds, "model", "model-w0")
    forged = forged_admitted("ghost")  # a valid record, on a rollout nobody dispatched
    await nc.jetstream().publish(
        admin.subjects.event("ghost", 1, "model", "model-w0"), Codec().encode(forged)
    )
    home = tmp_path / "home"
    ck = _json(_cli(server, data_dir, home, "checkpoint", "--json"))
    restored = _cli(server, data_dir, home, "restore", "--checkpoint", ck["checkpoint_id"], "--json")
    out = _json(restored)  # before: exit 2, "rollout 'ghost' was never dispatched", for every checkpoint
    assert out["continue"] == ["real"] and "ghost" not in out["fresh_dispatch"], out
    assert "never dispatched" in out["quarantined"]["ghost"]


async def test_a_forged_admitted_call_no_reply_names_quarantines_its_rollout_not_every_checkpoint(
    server: EmbeddedServer, creds: Credentials, admin: EventLog, raw_as: Any, data_dir: Path, tmp_path: Path
) -> None:
    from rollcut.ledger import Ledger
    from rollcut.participants import Coordinator, Participant, PrepareReport

    class Idle:  # a model server with no call running: its prepare reply names none
        async def prepare(self, checkpoint_id: str) -> PrepareReport:
            return PrepareReport(calls=[])

        async def restore(self, checkpoint_id: str, cut: int) -> None:
            return None

    await admin.dispatch("victim", {"task": 1}, instance="collector-0")
    await admin.dispatch("bystander", {"task": 2}, instance="collector-0")
    model = await EventLog.connect(admin.config.as_role(creds, "model", "model-w0"), name="model-w0")
    part = Participant(model, component="model", instance="model-w0", mode="exported")
    part.hooks = Idle()
    await part.start()  # a real model participant: its prepare reply names no call of its own
    try:
        forged = forged_admitted("victim")  # as if that participant had admitted it: on its connection
        own = admin.subjects.event("victim", 1, "model", "model-w0")
        await model.nc.jetstream().publish(own, Codec().encode(forged))
        with Ledger(tmp_path / "ledger") as ledger:
            coordinator = Coordinator(admin, ledger, None, instance="coordinator")
            with pytest.raises(CheckpointFailedError, match="omits it"):  # once: it might still resolve
                await coordinator.checkpoint(deadline_s=10)
            first = await coordinator.checkpoint(deadline_s=10)
            second = await coordinator.checkpoint(deadline_s=10)
    finally:
        await part.stop()
        await model.close()
    # before: "references do not resolve below the cut … its prepare reply omits it", every time
    assert list(first.record.quarantined) == ["victim"] and "omits it" in first.record.quarantined["victim"]
    assert list(second.record.quarantined) == ["victim"]
    # the quarantine is on the commit marker: a ledger rebuilt from the stream alone still has it
    from rollcut.ledger import rebuild_ledger

    await rebuild_ledger(admin, tmp_path / "rebuilt")
    with Ledger(tmp_path / "rebuilt") as rebuilt:
        again = rebuilt.checkpoint(second.record.checkpoint_id)
    assert again is not None and again.quarantined == second.record.quarantined


async def test_garbage_on_a_marker_lane_is_a_quarantine_in_verify_not_a_failure(
    server: EmbeddedServer, creds: Credentials, admin: EventLog, raw_as: Any, data_dir: Path, tmp_path: Path
) -> None:
    await admin.dispatch("real", {"task": 1}, instance="collector-0")
    # another component's lane is out of the model role's reach now (the matrix test); the lane's
    # own instance, compromised, can still write garbage on it
    nc = await raw_as(server, creds, "agent", "agent-w0")
    lane = admin.subjects.mark("agent-w0")
    await nc.jetstream().publish(lane, b"\x00garbage, not a frame")
    home = tmp_path / "home"
    ck = _json(_cli(server, data_dir, home, "checkpoint", "--json"))
    done = _cli(server, data_dir, home, "checkpoints", "verify", ck["checkpoint_id"], "--json")
    out = _json(done)  # before: exit 1, a problem per corrupt record, for every checkpoint
    assert out["ok"] is True and out["problems"] == []
    assert list(out["quarantined"]) == [f"lane {lane}"]
