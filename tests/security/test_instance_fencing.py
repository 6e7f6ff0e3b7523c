"""One instance of a role cannot write for another (issue 54): an attempt's events of a Gym server
role go on a subject that names their writer, which the server lets only that instance publish on;
an instance that writes in an attempt another instance of its role holds gets the rollout
quarantined, restarted from its input with the reason named, and nothing else is touched."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from rollcut import PermissionDeniedError
from rollcut.bus import BusConfig, Codec, Credentials, EmbeddedServer, EventLog, ModelCallAdmitted
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, plan_recovery
from rollcut.replay import replay
from rollcut.tokens import LocalTokenStore

from ..helpers import model_event


@pytest.fixture
async def workers(server: EmbeddedServer, creds: Credentials) -> AsyncIterator[tuple[EventLog, EventLog]]:
    """Two instances of the model role, each with its own identity, as a two-worker server has."""
    logs = [
        await EventLog.connect(BusConfig(url=server.url, request_timeout_s=5).as_role(creds, "model", name))
        for name in ("model-w0", "model-w1")
    ]
    yield logs[0], logs[1]
    for lg in logs:
        await lg.close()


def _as(instance: str, rollout_id: str, call_id: str) -> ModelCallAdmitted:
    return msgspec.structs.replace(model_event(rollout_id, call_id=call_id), instance=instance)


async def test_an_instance_cannot_write_on_a_siblings_subject(
    admin: EventLog, workers: tuple[EventLog, EventLog]
) -> None:
    w0, _ = workers
    await admin.dispatch("r1", {}, instance="collector-0")
    before = await admin.last_seq()
    with pytest.raises(PermissionDeniedError, match=r"\.model\.model-w1"):
        await w0.append(_as("model-w1", "r1", "c1"))
    assert await admin.last_seq() == before


async def test_a_body_naming_another_writer_than_its_subject_is_quarantined(
    admin: EventLog, workers: tuple[EventLog, EventLog]
) -> None:
    w0, _ = workers
    await admin.dispatch("r1", {}, instance="collector-0")
    own = admin.subjects.event("r1", 1, "model", "model-w0")
    ack = await w0.nc.jetstream().publish(own, Codec().encode(_as("model-w1", "r1", "c1")))
    [stored] = [s async for s in admin.read(strict=False) if s.seq == ack.seq]
    assert stored.event is None and "written by 'model-w1', the subject by 'model-w0'" in str(stored.error)


async def test_an_instance_writing_in_an_attempt_its_sibling_holds_gets_that_rollout_restarted(
    admin: EventLog, workers: tuple[EventLog, EventLog], tmp_path: Path
) -> None:
    w0, w1 = workers
    for rid in ("held", "bystander"):
        await admin.dispatch(rid, {}, instance="collector-0")
        await w1.append(_as("model-w1", rid, f"{rid}-c1"))
    await w0.append(_as("model-w0", "held", "held-c2"))  # allowed: its own subject
    result = await replay(admin)
    held, bystander = result.rollouts["held"], result.rollouts["bystander"]
    assert held.foreign_at(result.cut) is not None and bystander.foreign_at(result.cut) is None
    assert held.attempts[1].holders == bystander.attempts[1].holders == {"model": "model-w1"}
    with Ledger(tmp_path / "ledger") as ledger, LocalTokenStore(tmp_path / "tokens") as tokens:
        await Coordinator(admin, ledger, tokens).checkpoint(deadline_s=5)
        plan = await plan_recovery(admin, ledger)
    assert plan.continue_ == ["bystander"] and plan.fresh_dispatch == ["held"]
    why = plan.quarantined["held"]
    assert why.startswith("model-w0 wrote model.") and "which model-w1 holds for model" in why
    assert "held" not in plan.reuse_completed  # nothing of the attempt is trusted
    # restarted from its input (as the restore does), its new attempt is held by one writer: the
    # next restore continues it, the old attempt's mixed writers no longer in its lineage
    await admin.supersede("held", 1, instance="coordinator", reason="restart", from_cut=0)
    await w0.append(msgspec.structs.replace(model_event("held", 2, "held-c3"), instance="model-w0"))
    with Ledger(tmp_path / "ledger") as ledger, LocalTokenStore(tmp_path / "tokens") as tokens:
        await Coordinator(admin, ledger, tokens).checkpoint(deadline_s=5)
        again = await plan_recovery(admin, ledger)
    assert sorted(again.continue_) == ["bystander", "held"] and again.quarantined == {}
