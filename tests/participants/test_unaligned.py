"""Unaligned checkpoints: everyone goes on right after the seal; validation and publication follow.

And membership without waiting: a discovery round ends once every known member answered.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rollcut import CheckpointFailedError
from rollcut.bus import (
    AgentBoundary,
    AgentBoundaryRecord,
    EventLog,
    ResourcesMutated,
    TokenReceipt,
)
from rollcut.ledger import Ledger, verify_checkpoint
from rollcut.participants import Coordinator
from rollcut.tokens import LocalTokenStore, TokenRecord

from ..helpers import completed_event, until


async def test_participants_go_on_before_validation_and_the_cut_excludes_what_they_do_meanwhile(
    log: EventLog, participants: Any, coordinator: Coordinator, ledger: Ledger, tokens: LocalTokenStore
) -> None:
    model = await participants("model-0", "event_sourced", component="model")
    res_p = await participants("res-0", "exported")
    await log.dispatch("r1", {}, instance="collector")
    await model.append(
        completed_event("r1", "c1", tokens.put("c1", TokenRecord(prompt_ids=[1], output_ids=[2])))
    )
    seen: dict[str, Any] = {}

    async def between(phase: str) -> None:
        seen[phase] = (res_p.gate.state, [c.checkpoint_id for c in ledger.checkpoints()])
        if phase == "release":  # the collection goes on while the coordinator validates
            rc = tokens.put("c2", TokenRecord(prompt_ids=[1], output_ids=[3]))
            seen["later_seq"] = await model.append(completed_event("r1", "c2", rc))

    coordinator.after_phase = between
    res = await coordinator.checkpoint(deadline_s=5)
    assert seen["seal"] == ("closed", [])  # sealed: the cut is fixed, nobody has gone on yet
    assert seen["release"] == ("open", [])  # released before anything was validated or published
    assert res.record.cut < seen["later_seq"]
    assert [c.checkpoint_id for c in ledger.checkpoints()] == [res.record.checkpoint_id]
    assert sorted(res.resumed) == ["model-0", "res-0"]
    assert res.pause_ms > 0 and res.publish_ms > 0
    assert await verify_checkpoint(log, ledger, tokens, res.record.checkpoint_id) == []
    # the next checkpoint takes what was done meanwhile
    coordinator.after_phase = None
    nxt = await coordinator.checkpoint(deadline_s=5)
    assert nxt.record.cut > seen["later_seq"]


async def test_a_round_ends_once_every_known_member_answered(
    participants: Any, coordinator: Coordinator
) -> None:
    m = coordinator.membership
    await participants("res-0", "exported")
    await participants("model-0", "event_sourced", component="model")
    assert [i.instance for i in await coordinator.discover()] == ["model-0", "res-0"]
    assert m.rounds_waited == 1  # nobody known yet: the first round waits for quiet
    assert [i.instance for i in await coordinator.discover()] == ["model-0", "res-0"]
    assert m.rounds_waited == 1  # everyone known answered: no wait
    # a newcomer announces itself: the next round waits for it, and does not wait for quiet
    late = await participants("agent-0", "event_sourced", component="agent")
    assert [i.instance for i in await coordinator.discover()] == ["agent-0", "model-0", "res-0"]
    assert m.rounds_waited == 1
    # a member that left costs one round of waiting for quiet, then the view forgets it
    await late.stop()
    assert [i.instance for i in await coordinator.discover()] == ["model-0", "res-0"]
    assert m.rounds_waited == 2
    assert [i.instance for i in await coordinator.discover()] == ["model-0", "res-0"]
    assert m.rounds_waited == 2 and m.known == {"model-0", "res-0"}


async def test_a_boundary_stored_before_the_call_it_names_validates_when_both_are_below_the_cut(
    log: EventLog, coordinator: Coordinator, ledger: Ledger, tokens: LocalTokenStore
) -> None:
    """Writers on different connections land in either order; validation runs on the projector's
    pages, and a boundary's model call may come pages later (found by ``bench checkpoint``)."""
    await log.dispatch("r1", {}, instance="collector")
    boundary = AgentBoundary(
        component="agent",
        instance="a",
        rollout_id="r1",
        attempt=1,
        record=AgentBoundaryRecord(turn=1, last_model_call_id="c1", resources_revisions={"env": 3000}),
    )
    await log.append(boundary)
    filler = [
        ResourcesMutated(
            component="resources",
            instance="s",
            rollout_id="r1",
            attempt=1,
            session="env",
            revision=i,
            tool="t",
        )
        for i in range(1, 3001)
    ]
    for chunk in range(0, len(filler), 500):  # more than a page of reads between the two
        await log.append_many(filler[chunk : chunk + 500])
    await log.append(
        completed_event("r1", "c1", tokens.put("c1", TokenRecord(prompt_ids=[1], output_ids=[2])))
    )
    res = await coordinator.checkpoint(deadline_s=30)
    assert res.validated_events == res.record.cut and ledger.latest_checkpoint() == res.record


async def test_the_validator_keeps_up_in_the_background_and_never_passes_a_cut(
    log: EventLog, participants: Any, coordinator: Coordinator, ledger: Ledger, tokens: LocalTokenStore
) -> None:
    model = await participants("model-0", "event_sourced", component="model")
    v = coordinator.validator
    v.start(every_s=0.005)
    try:
        for i in range(50):
            await log.dispatch(f"r{i}", {}, instance="collector")
            rc = tokens.put(f"c{i}", TokenRecord(prompt_ids=[i], output_ids=[i + 1]))
            await model.append(completed_event(f"r{i}", f"c{i}", rc))
        last = await log.last_seq()
        await until(lambda: v.fed_to >= last, what="the validator reached the stream's end")
        assert ledger.watermark >= last  # projected in the background, before any checkpoint

        async def busy(phase: str) -> None:  # the collection goes on, and the validator would too
            if phase == "release":
                for i in range(50, 80):
                    await log.dispatch(f"r{i}", {}, instance="collector")

        coordinator.after_phase = busy
        first = await coordinator.checkpoint(deadline_s=5)
        # exactly the events below the cut, each once: nothing past the seal was taken in
        assert first.validated_events == first.record.cut
        coordinator.after_phase = None
        second = await coordinator.checkpoint(deadline_s=5)
        assert second.validated_events == second.record.cut - first.record.cut
        for ck in (first, second):
            assert await verify_checkpoint(log, ledger, tokens, ck.record.checkpoint_id) == []
        # a bad reference found while tailing costs its rollout only (issue 29): quarantined in this
        # checkpoint and every later one, which publish for everything else
        ghost = TokenReceipt(receipt_id="never-stored", count=3, digest="cd" * 16)
        await model.append(completed_event("r0", "c-ghost", ghost))
        with pytest.raises(CheckpointFailedError, match="never-stored"):  # once: it might still resolve
            await coordinator.checkpoint(deadline_s=5)
        for _ in range(2):
            ck = await coordinator.checkpoint(deadline_s=5)
            assert list(ck.record.quarantined) == ["r0"] and "never-stored" in ck.record.quarantined["r0"]
        assert ledger.latest_checkpoint() == ck.record
    finally:
        await v.stop()


async def test_an_expected_participant_that_answers_late_is_waited_for_and_one_never_heard_fails(
    participants: Any, coordinator: Coordinator
) -> None:
    """A fresh coordinator knows nobody: a participant slower than the discovery timeout (a model
    server under load) would be left out of the checkpoint, and its in-flight calls not cut. One the
    caller expects is waited for, as a short group's workers are."""
    m = coordinator.membership
    assert await coordinator.discover() == []  # nobody there: the round ends at its timeout
    round_ = asyncio.ensure_future(m.discover(expect=frozenset({"model-0"})))
    await until(lambda: bool(m._round), timeout=5, what="the ping sent")
    # slower than the discovery timeout: the scenario under test, not a synchronisation
    await asyncio.sleep(m.timeout_s * 2)
    await participants("model-0", "event_sourced", component="model")
    assert [i.instance for i in await round_] == ["model-0"]
    with pytest.raises(CheckpointFailedError, match="missing participant instances: ghost-0"):
        await coordinator.checkpoint(deadline_s=10, expect={"ghost-0"})
    assert [i.instance for i in await coordinator.discover()] == ["model-0"]


async def test_an_expected_participant_slower_than_a_short_group_is_waited_for_as_long_as_the_caller_says(
    participants: Any, coordinator: Coordinator
) -> None:
    """A model server beside vLLM's CPU engine on two cores once answered after the short wait
    (3 s), and the checkpoint failed naming it missing. The caller's own bound holds instead."""
    m = coordinator.membership
    m.short_s = m.timeout_s * 2  # the short wait made short, so the scenario costs under a second
    round_ = asyncio.ensure_future(m.discover(expect=frozenset({"model-0"}), expect_s=m.short_s * 10))
    await until(lambda: bool(m._round), timeout=5, what="the ping sent")
    # slower than the short wait: the scenario under test, not a synchronisation
    await asyncio.sleep(m.short_s * 2)
    await participants("model-0", "event_sourced", component="model")
    assert [i.instance for i in await round_] == ["model-0"]
