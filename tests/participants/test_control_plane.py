"""The checkpoint control plane against a real nats-server: participants, coordinator, faults."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from rollcut import AdmissionClosedError, CheckpointConflictError, CheckpointFailedError, RollcutError
from rollcut.bus import (
    AgentBoundary,
    AgentBoundaryRecord,
    CheckpointAborted,
    CheckpointCommitted,
    EventLog,
    ParticipantLeaseExpired,
    ParticipantReplied,
    TokenReceipt,
)
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, PauseBreakdown, Restorer
from rollcut.participants._admission import RETRY_AFTER_S
from rollcut.tokens import LocalTokenStore, TokenRecord

from ..helpers import completed_event, until


class CountingExport:
    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[str] = []
        self.delay = delay

    async def prepare(self, checkpoint_id: str) -> list[str]:
        self.calls.append(checkpoint_id)
        if self.delay:
            await asyncio.sleep(self.delay)  # a slow state export, on purpose
        return []

    async def restore(self, checkpoint_id: str, cut: int) -> None:
        return None


async def _lane_markers(log: EventLog, kind: type) -> list[Any]:
    return [s.event async for s in log.read() if isinstance(s.event, kind)]


async def test_checkpoint_publishes_and_releases_everyone(
    log: EventLog, participants: Any, coordinator: Coordinator, ledger: Ledger, tokens: LocalTokenStore
) -> None:
    model = await participants("model-0", "event_sourced", component="model")
    hooks = CountingExport()
    res_p = await participants("res-0", "exported", hooks=hooks)
    await log.dispatch("r1", {"q": 1}, instance="collector")
    rc = tokens.put("c1", TokenRecord(prompt_ids=[1], output_ids=[2, 3]))
    await model.append(completed_event("r1", "c1", rc, instance="model-0"))
    result = await coordinator.checkpoint(deadline_s=5)
    rec = result.record
    assert ledger.checkpoint(rec.checkpoint_id) == rec == ledger.latest_checkpoint()
    assert sorted(result.participants) == ["model-0", "res-0"] and sorted(result.resumed) == [
        "model-0",
        "res-0",
    ]
    assert hooks.calls == [rec.checkpoint_id]
    assert tokens.verify_snapshot(tokens.snapshot(rec.checkpoint_id)) == []
    assert rec.token_snapshot_digest == tokens.snapshot(rec.checkpoint_id).digest
    seal_seq = rec.cut
    assert [s.event.checkpoint_id async for s in log.read(start=seal_seq, up_to=seal_seq)] == [
        rec.checkpoint_id
    ]
    assert model.gate.state == res_p.gate.state == "open"
    assert [m.checkpoint_id for m in await _lane_markers(log, CheckpointCommitted)] == [rec.checkpoint_id]


async def test_control_ops_are_idempotent(participants: Any, coordinator: Coordinator) -> None:
    hooks = CountingExport()
    p = await participants("res-0", "exported", hooks=hooks)
    [info] = await coordinator.discover()
    deadline = time.time() + 5
    first = await coordinator.call(info, "prepare", "ck1", deadline)
    again = await coordinator.call(info, "prepare", "ck1", deadline)
    assert first == again and first.ok and hooks.calls == ["ck1"]
    assert p.gate.state == "closed"
    assert (await coordinator.call(info, "commit", "ck1", deadline)).ok
    assert (await coordinator.call(info, "commit", "ck1", deadline)).ok
    assert (await coordinator.call(info, "resume", "ck1", deadline)).ok
    assert (await coordinator.call(info, "resume", "ck1", deadline)).ok
    assert p.gate.state == "open" and hooks.calls == ["ck1"]


async def test_stale_checkpoint_can_neither_commit_nor_reopen(
    participants: Any, coordinator: Coordinator
) -> None:
    p = await participants("res-0", "exported")
    [info] = await coordinator.discover()
    deadline = time.time() + 5
    assert (await coordinator.call(info, "prepare", "old", deadline)).ok
    assert (await coordinator.call(info, "abort", "old", deadline)).ok
    assert (await coordinator.call(info, "prepare", "new", deadline)).ok
    for op in ("commit", "resume"):
        reply = await coordinator.call(info, op, "old", deadline)  # type: ignore[arg-type]
        assert not reply.ok and reply.error_kind == "stale", op
        assert p.gate.state == "closed"
    # repeating the old abort gets the old answer, and does not touch the new checkpoint
    again = await coordinator.call(info, "abort", "old", deadline)
    assert again.ok and again.state == "aborted"
    assert p.gate.state == "closed" and p.capabilities().active_checkpoint == "new"
    busy = await coordinator.call(info, "prepare", "other", deadline)
    assert not busy.ok and busy.error_kind == "busy"
    assert (await coordinator.call(info, "resume", "new", deadline)).ok and p.gate.state == "open"


async def test_closed_admission_refuses_at_once_and_retryably(
    participants: Any, coordinator: Coordinator
) -> None:
    p = await participants("res-0", "exported")
    [info] = await coordinator.discover()
    assert (await coordinator.call(info, "prepare", "ck", time.time() + 30)).ok
    # refused, not parked: the refusal comes before the caller ever waits (nothing else ran meanwhile)
    others_ran: list[bool] = []
    asyncio.get_running_loop().call_soon(others_ran.append, True)
    with pytest.raises(AdmissionClosedError) as err:
        async with p.gate.admit():
            pass
    assert others_ran == []
    assert err.value.retryable and err.value.checkpoint_id == "ck"
    # told to come back soon, not after the checkpoint's 30 s deadline: a checkpoint holds
    # admission for milliseconds, and a caller told to wait out the lease stalls for all of it
    assert 0 < err.value.retry_after_s <= RETRY_AFTER_S < 30


async def test_concurrent_checkpoints_exactly_one_publishes(
    log: EventLog, plog: EventLog, participants: Any, tmp_path: Path, tokens: LocalTokenStore
) -> None:
    await participants("res-0", "exported", hooks=CountingExport(delay=0.2))
    with Ledger(tmp_path / "l1") as l1, Ledger(tmp_path / "l2") as l2:
        a = Coordinator(log, l1, tokens, instance="coord-a")
        b = Coordinator(plog, l2, tokens, instance="coord-b")
        results = await asyncio.gather(
            a.checkpoint(deadline_s=5), b.checkpoint(deadline_s=5), return_exceptions=True
        )
        published = [r for r in results if not isinstance(r, BaseException)]
        failed = [r for r in results if isinstance(r, BaseException)]
        assert len(published) == 1 and len(failed) == 1
        assert isinstance(failed[0], CheckpointConflictError | CheckpointFailedError)
        assert len(l1.checkpoints()) + len(l2.checkpoints()) == 1
    assert len(await _lane_markers(log, CheckpointCommitted)) == 1


async def test_silent_worker_fails_the_checkpoint_and_everyone_reopens(
    participants: Any, coordinator: Coordinator, ledger: Ledger
) -> None:
    silent = await participants("res-silent", "exported")
    other = await participants("res-ok", "exported")

    async def never_answer_prepare(req: Any) -> None:
        if req.op == "prepare":
            await asyncio.Event().wait()

    silent.on_control = never_answer_prepare
    with pytest.raises(CheckpointFailedError, match="res-silent") as err:
        await coordinator.checkpoint(deadline_s=1.0)
    assert err.value.participant == "res-silent"
    assert ledger.checkpoints() == []
    assert other.gate.state == "open"


async def test_deadline_expiry_during_export_aborts(
    participants: Any, coordinator: Coordinator, ledger: Ledger
) -> None:
    slow = await participants("res-slow", "exported", hooks=CountingExport(delay=3.0))
    with pytest.raises(CheckpointFailedError, match="res-slow"):
        await coordinator.checkpoint(deadline_s=0.8)
    assert ledger.checkpoints() == []
    assert slow.gate.state == "open"


async def test_lost_reply_is_retried_without_a_second_effect(
    participants: Any, coordinator: Coordinator, ledger: Ledger
) -> None:
    hooks = CountingExport()
    p = await participants("res-0", "exported", hooks=hooks)
    p.drop_replies = 1  # the first prepare reply is lost on the wire
    coordinator.per_try_s = 0.3
    res = await coordinator.checkpoint(deadline_s=5)
    assert hooks.calls == [res.record.checkpoint_id]
    assert ledger.checkpoint(res.record.checkpoint_id) is not None


async def test_missing_worker_of_a_group_fails_by_name(participants: Any, coordinator: Coordinator) -> None:
    await participants(
        "model-w0",
        "event_sourced",
        component="model",
        group="model",
        worker=0,
        workers=2,
        process_mode="coordinated_workers",
    )
    with pytest.raises(CheckpointFailedError, match="model worker 1 of 2"):
        await coordinator.checkpoint(deadline_s=2)


async def test_unresolved_references_quarantine_their_rollout_and_the_checkpoint_publishes(
    log: EventLog, participants: Any, coordinator: Coordinator, ledger: Ledger
) -> None:
    res_p = await participants("res-0", "exported")
    await log.dispatch("r1", {}, instance="c")
    ghost = TokenReceipt(receipt_id="never-stored", count=3, digest="cd" * 16)
    await log.append(completed_event("r1", "c9", ghost, instance="m"))
    await log.append(
        AgentBoundary(
            component="agent",
            instance="a",
            rollout_id="r1",
            attempt=1,
            record=AgentBoundaryRecord(
                turn=0, last_model_call_id="c-missing", resources_revisions={"env": 4}
            ),
        )
    )
    await log.dispatch("r2", {}, instance="c")  # a rollout with nothing wrong
    with pytest.raises(CheckpointFailedError) as err:
        await coordinator.checkpoint(deadline_s=3)
    first = str(err.value)
    assert "never-stored" in first and "c-missing" in first and "env revision 4" in first
    # failed after the release: nothing published, nobody held, and the lane is free again
    assert ledger.checkpoints() == [] and res_p.gate.state == "open" and res_p.capabilities().state == "idle"
    last = await log.last_on(log.subjects.mark())
    assert last is not None and isinstance(last.event, CheckpointAborted)
    # still found by the next checkpoint: it publishes, with r1 quarantined
    result = await coordinator.checkpoint(deadline_s=3)
    # fail closed for the rollout, never for the namespace (issue 29): every finding of r1 is named
    msg = result.record.quarantined["r1"]
    assert "never-stored" in msg and "c-missing" in msg and "env revision 4" in msg
    assert list(result.record.quarantined) == ["r1"] and ledger.checkpoints() == [result.record]
    assert res_p.gate.state == "open" and res_p.capabilities().state == "idle"
    # validation is incremental: the next checkpoint does not look at r1's events again, and keeps it out
    again = await coordinator.checkpoint(deadline_s=3)
    assert list(again.record.quarantined) == ["r1"]


async def test_lease_expiry_reopens_admission_and_is_recorded(
    log: EventLog, participants: Any, coordinator: Coordinator
) -> None:
    p = await participants("res-0", "exported", lease_grace_s=0.2)
    [info] = await coordinator.discover()
    assert (await coordinator.call(info, "prepare", "orphan", time.time() + 0.3)).ok
    assert p.gate.state == "closed"
    # the coordinator vanishes: nobody sends resume. Wait (bounded) for the lease to run out.
    for _ in range(100):
        if p.gate.state == "open":
            break
        await asyncio.sleep(0.05)
    assert p.gate.state == "open" and p.lease_expiries == 1
    for _ in range(100):
        recorded = await _lane_markers(log, ParticipantLeaseExpired)
        if recorded:
            break
        await asyncio.sleep(0.05)
    assert [(m.checkpoint_id, m.participant) for m in recorded] == [("orphan", "res-0")]


@pytest.mark.slow
async def test_participant_killed_during_prepare_fails_that_checkpoint(
    nats_url: str, namespace: str, coordinator: Coordinator, ledger: Ledger, spawn: Any
) -> None:
    proc = spawn(
        "participant", "--url", nats_url, "--ns", namespace, "--instance", "victim", "--slow-export", "60"
    )
    await proc.aexpect("READY")
    task = asyncio.create_task(coordinator.checkpoint(deadline_s=3))
    await proc.aexpect("PREPARING")
    proc.kill()  # SIGKILL mid-prepare
    with pytest.raises(CheckpointFailedError, match="victim"):
        await task
    assert ledger.checkpoints() == []
    # with the dead process gone from discovery, the next checkpoint succeeds
    res = await coordinator.checkpoint(deadline_s=3)
    assert ledger.checkpoint(res.record.checkpoint_id) is not None


@pytest.mark.slow
async def test_coordinator_killed_between_seal_and_publication(
    log: EventLog,
    participants: Any,
    coordinator: Coordinator,
    ledger: Ledger,
    tmp_path: Path,
    kill_coordinator_after: Any,
    checkpoint_when_free: Any,
) -> None:
    p = await participants("res-0", "exported", lease_grace_s=0.3)
    await kill_coordinator_after("seal")  # SIGKILL with the seal on the log and nothing in its ledger
    with Ledger(tmp_path / "dead-ledger") as dl:
        assert dl.checkpoints() == []
    assert p.gate.state == "closed"
    # the next checkpoint succeeds once the dead one's deadline has passed (bounded wait)
    res = await checkpoint_when_free()
    assert [c.checkpoint_id for c in ledger.checkpoints()] == [res.record.checkpoint_id]
    assert p.gate.state == "open"
    committed = await _lane_markers(log, CheckpointCommitted)
    assert [m.checkpoint_id for m in committed] == [res.record.checkpoint_id]


async def test_capabilities_describe_each_instance(participants: Any, coordinator: Coordinator) -> None:
    await participants(
        "model-w0",
        "event_sourced",
        component="model",
        group="model",
        worker=0,
        workers=2,
        process_mode="coordinated_workers",
    )
    await participants(
        "model-w1",
        "event_sourced",
        component="model",
        group="model",
        worker=1,
        workers=2,
        process_mode="coordinated_workers",
    )
    await participants("env-0", "restart_only", component="environment")
    caps = {c.instance: c for c in await coordinator.capabilities()}
    assert sorted(caps) == ["env-0", "model-w0", "model-w1"]
    assert caps["model-w1"].workers == 2 and caps["model-w1"].process_mode == "coordinated_workers"
    assert caps["env-0"].checkpoint_mode == "restart_only" and caps["env-0"].state == "idle"
    res = await coordinator.checkpoint(deadline_s=3)
    assert res.unreproducible == {"env-0": ["env-0: restart_only, sessions cannot continue"]}


async def test_verify_detects_a_token_record_corrupted_on_disk(
    log: EventLog, participants: Any, coordinator: Coordinator, ledger: Ledger, tokens: LocalTokenStore
) -> None:
    from rollcut.ledger import verify_checkpoint

    model = await participants("model-0", "event_sourced", component="model")
    await log.dispatch("r1", {}, instance="c")
    rc = tokens.put("c1", TokenRecord(prompt_ids=[1, 2, 3], output_ids=[4, 5]))
    await model.append(completed_event("r1", "c1", rc, instance="model-0"))
    res = await coordinator.checkpoint(deadline_s=5)
    cid = res.record.checkpoint_id
    assert await verify_checkpoint(log, ledger, tokens, cid) == []
    with tokens.env.begin(write=True) as txn:  # bit rot in the stored token record
        key = rc.receipt_id.encode()
        v = bytearray(txn.get(key, db=tokens._records))
        v[-1] ^= 0x01
        txn.put(key, bytes(v), db=tokens._records)
    problems = await verify_checkpoint(log, ledger, tokens, cid)
    assert any(rc.receipt_id in p for p in problems)


async def test_phases_feed_prometheus_metrics(participants: Any, coordinator: Coordinator) -> None:
    from prometheus_client import REGISTRY

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    await participants("res-0", "exported")
    published = value("rollcut_checkpoint_outcomes_total", outcome="published")
    prepares = value("rollcut_checkpoint_phase_seconds_count", phase="prepare")
    res = await coordinator.checkpoint(deadline_s=5)
    assert value("rollcut_checkpoint_outcomes_total", outcome="published") == published + 1
    assert value("rollcut_checkpoint_phase_seconds_count", phase="prepare") == prepares + 1
    assert value("rollcut_participant_reply_seconds_count", op="prepare", instance="res-0") >= 1
    assert set(res.phases_ms) >= {"acquire", "discover", "prepare", "seal", "validate", "publish", "release"}


class FailingRestore(CountingExport):
    async def restore(self, checkpoint_id: str, cut: int) -> None:
        raise RuntimeError("this environment cannot rebuild its sessions")


async def test_a_partial_restore_is_released_at_once_not_left_to_the_lease(
    log: EventLog, participants: Any, coordinator: Coordinator, ledger: Ledger
) -> None:
    good = await participants("res-0", "exported", hooks=CountingExport(), lease_grace_s=600)
    await participants("res-1", "exported", hooks=FailingRestore(), lease_grace_s=600)
    rec = (await coordinator.checkpoint(deadline_s=5)).record
    restorer = Restorer(log, ledger, coordinator, instance="collector-0", deadline_s=5)
    with pytest.raises(RollcutError):
        await restorer.restore(rec.checkpoint_id, rec.cut)
    # the one that did restore is open again now, not in 600 s when its lease would run out
    assert good.gate.state == "open"
    assert (await coordinator.checkpoint(deadline_s=5)).record.checkpoint_id != rec.checkpoint_id


async def test_a_checkpoint_says_whom_it_waited_for_and_on_what(
    log: EventLog, participants: Any, coordinator: Coordinator
) -> None:
    """Each participant's prepare, as the coordinator waited for it (round trip) and inside it
    (drain, export), comes back with the result and goes on the participant's own lane."""
    await participants("model-0", "event_sourced", component="model")
    await participants("res-slow", "exported", hooks=CountingExport(delay=0.2))
    res = await coordinator.checkpoint(deadline_s=10)
    slow, model = res.waited_ms["res-slow"], res.waited_ms["model-0"]
    assert slow["export"] >= 200 and slow["round_trip"] >= slow["total"] >= slow["export"] + slow["drain"]
    assert "export" not in model and model["round_trip"] >= 0  # nothing to export: the log is its state
    assert res.components == {"res-slow": "resources", "model-0": "model"}
    pauses = PauseBreakdown()
    pauses.add(res)
    summary = pauses.summary()
    assert summary["slowest"] == {"resources": 1} and summary["checkpoints"] == 1
    assert summary["waited_ms"]["resources"]["export"]["p50"] == round(slow["export"], 2)

    async def both_recorded() -> bool:
        return len(await _lane_markers(log, ParticipantReplied)) == 2

    await until(both_recorded, timeout=10, what="the replies on the participants' lanes")
    replies = {r.participant: r for r in await _lane_markers(log, ParticipantReplied)}
    assert set(replies) == {"res-slow", "model-0"}
    assert replies["res-slow"].checkpoint_id == res.record.checkpoint_id
    assert {k: replies["res-slow"].phases_ms[k] for k in ("drain", "export", "total")} == {
        k: slow[k] for k in ("drain", "export", "total")
    }
