"""Stateful resources: durable mutations, exact restore under a new attempt, fail-closed modes."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from rollcut.bus import EventLog, ResourcesMutated
from rollcut.gym.resources import (
    Blackjack,
    Counter,
    MathVerifier,
    Scratchpad,
    Workplace,
    WorkplaceExported,
)

from ..helpers import until


async def test_counter_restores_under_the_new_attempt_and_the_old_one_is_refused(
    log: EventLog, make_rig: Any
) -> None:
    rig = await make_rig(Counter())
    await log.dispatch("r1", {}, instance="c")
    assert (await rig.post("/seed_session", "r1", 1, {"start": 10})).status_code == 200
    for n in (1, 2, 3):
        assert (await rig.post("/add", "r1", 1, {"n": n})).json()["revision"] == n
    # the agent recorded a boundary after those calls: nothing of attempt 1 is left to replay
    await rig.boundary("r1", "counter", 3)
    await rig.restore_from_checkpoint("r1")
    restored = rig.service.sessions[next(k for k in rig.service.sessions if k.attempt == 2)]
    assert restored.state == {"value": 16} and restored.revision == 3
    late = await rig.post("/add", "r1", 1, {"n": 100})  # a delayed request from attempt 1
    assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt"
    assert (await rig.post("/read", "r1", 2)).json()["result"] == {"value": 16}
    assert (await rig.post("/add", "r1", 2, {"n": 4})).json() == {
        "result": {"value": 20},
        "revision": 5,  # the read was revision 4: every tool call is a logged mutation
        "served_from_log": False,
    }


async def test_blackjack_restored_mid_game_deals_the_same_cards(log: EventLog, make_rig: Any) -> None:
    rig = await make_rig(Blackjack())
    # the uninterrupted game, for reference: one hit before the cut, two after, then stand
    ref_env = Blackjack()
    ref = ref_env.seed({"seed": 0})
    ref_env.tools()["hit"](ref, {})
    after_cut = [
        ref_env.tools()["hit"](ref, {})[0],
        ref_env.tools()["hit"](ref, {})[0],
        ref_env.tools()["stand"](ref, {})[0],
    ]
    assert not after_cut[1]["done"]  # the cards after the cut really are dealt from the deck
    await log.dispatch("r1", {}, instance="c")
    await rig.post("/seed_session", "r1", 1, {"seed": 0})
    await rig.post("/hit", "r1", 1)
    await rig.boundary("r1", "blackjack", 1)
    await rig.restore_from_checkpoint("r1")
    continued = [(await rig.post(f"/{t}", "r1", 2)).json()["result"] for t in ("hit", "hit", "stand")]
    assert continued == after_cut


@pytest.mark.parametrize("env", [Workplace(), WorkplaceExported()], ids=["in_events", "exported"])
async def test_workplace_database_is_restored_row_for_row(
    log: EventLog, make_rig: Any, env: Workplace
) -> None:
    rig = await make_rig(env)
    await log.dispatch("r1", {}, instance="c")
    await rig.post("/seed_session", "r1", 1, {"contacts": [{"name": "Ada", "company": "AE"}]})
    await rig.post("/send_email", "r1", 1, {"to": "ada@ae", "subject": "hi", "body": "hello"})
    await rig.post("/create_event", "r1", 1, {"title": "sync", "day": "mon", "attendees": ["ada"]})
    await rig.post("/update_stage", "r1", 1, {"name": "Ada", "stage": "won"})
    ident1 = next(iter(rig.service.sessions))
    before = env.rows(rig.service.sessions[ident1].state)
    await rig.restore_from_checkpoint("r1")
    ident2 = next(k for k in rig.service.sessions if k.attempt == 2)
    assert env.rows(rig.service.sessions[ident2].state) == before
    verdict = (
        await rig.post("/verify", "r1", 2, {"expect": {"crm": [{"name": "Ada", "stage": "won"}]}})
    ).json()
    assert verdict["passed"] is True
    assert isinstance(rig.service.sessions[ident2].state, sqlite3.Connection)


async def test_restart_only_environment_fails_closed_into_fresh_dispatch(
    log: EventLog, make_rig: Any
) -> None:
    rig = await make_rig(Scratchpad())
    await log.dispatch("r1", {}, instance="c")
    await rig.post("/seed_session", "r1", 1)
    await rig.post("/write", "r1", 1, {"text": "a"})
    res = await rig.coordinator.checkpoint(deadline_s=5)
    assert res.unreproducible == {"scratchpad-0": ["scratchpad-0: restart_only, sessions cannot continue"]}
    await log.supersede(
        "r1", 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=res.record.cut
    )
    refused = await rig.post("/write", "r1", 2, {"text": "b"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "not_continuable"


async def test_post_boundary_tool_calls_are_served_from_the_log_and_a_change_is_refused(
    log: EventLog, make_rig: Any
) -> None:
    rig = await make_rig(Counter())
    await rig.counter_turn("r1")
    await rig.post("/add", "r1", 1, {"n": 5})  # the unfinished turn's call, done before the cut
    await rig.restore_from_checkpoint("r1")
    executed = rig.service.stats["tool_calls_executed"]
    again = (await rig.post("/add", "r1", 2, {"n": 5})).json()
    assert again == {"result": {"value": 6}, "revision": 2, "served_from_log": True}
    assert rig.service.stats["tool_calls_executed"] == executed  # did not run twice
    mutated = [
        s.event async for s in log.read(rollout_id="r1", attempt=2) if isinstance(s.event, ResourcesMutated)
    ]
    assert mutated == []
    # a different re-issued call in another restored rollout is refused, never mixed
    await log.dispatch("r2", {}, instance="c")
    await rig.post("/seed_session", "r2", 1)
    await rig.post("/add", "r2", 1, {"n": 2})
    await rig.restore_from_checkpoint("r2")
    changed = await rig.post("/add", "r2", 2, {"n": 3})
    assert changed.status_code == 409 and changed.json()["error"]["code"] == "replay_mismatch"


async def test_replayable_verification_gives_the_same_answer_when_re_run(
    log: EventLog, make_rig: Any
) -> None:
    rig = await make_rig(MathVerifier())
    await log.dispatch("r1", {}, instance="c")
    await rig.post("/seed_session", "r1", 1)
    body = {"answer": "so the total is 42", "expected": "42"}
    first = (await rig.post("/verify", "r1", 1, body)).json()
    await rig.restore_from_checkpoint("r1")
    again = (await rig.post("/verify", "r1", 2, body)).json()  # re-run after the "crash"
    assert first == again == {"reward": 1.0, "passed": True, "parsed": "42"}


class SlowJudge(MathVerifier):
    name = "judge"
    verification = "wait"

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def verify(self, state: Any, args: dict[str, Any]) -> dict[str, Any]:  # type: ignore[override]
        await self.release.wait()
        return super().verify(state, args)


async def test_wait_mode_verification_is_waited_for_by_prepare(log: EventLog, make_rig: Any) -> None:
    judge = SlowJudge()
    rig = await make_rig(judge)
    await log.dispatch("r1", {}, instance="c")
    await rig.post("/seed_session", "r1", 1)
    verifying = asyncio.ensure_future(rig.post("/verify", "r1", 1, {"answer": "7", "expected": "7"}))
    await until(lambda: bool(rig.service.verifying), timeout=30, what="the verification running")
    checkpoint = asyncio.ensure_future(rig.coordinator.checkpoint(deadline_s=5))
    await asyncio.sleep(0.2)  # give prepare every chance to (wrongly) finish before the verification
    assert not checkpoint.done()
    judge.release.set()
    assert (await verifying).json()["passed"] is True
    res = await checkpoint
    assert res.record.cut > 0


async def test_successful_sessions_retire_and_failed_ones_stay_for_inspection(
    log: EventLog, make_rig: Any
) -> None:
    from rollcut.bus import ResourcesRetired, ResultAccepted

    rig = await make_rig(Counter())
    for r, target in (("ok", 2), ("bad", 99)):
        await log.dispatch(r, {}, instance="c")
        await rig.post("/seed_session", r, 1)
        await rig.post("/add", r, 1, {"n": 2})
        await rig.post("/verify", r, 1, {"target": target})
        assert (await rig.post("/close_session", r, 1)).status_code == 200
    kept = {k.rollout_id for k in rig.service.sessions}
    assert kept == {"bad"}  # the passed one is gone, the failed one is still there to inspect
    reasons = {
        s.event.rollout_id: s.event.reason async for s in log.read() if isinstance(s.event, ResourcesRetired)
    }
    assert reasons == {"ok": "completed", "bad": "failed_verification"}
    # the hand-off is acknowledged: the inspected session goes too, seen on the log by the server
    await log.append(
        ResultAccepted(
            component="collector", instance="c", rollout_id="bad", attempt=1, result_digest="0" * 16
        )
    )
    await until(lambda: not rig.service.sessions)
    assert rig.service.stats["sessions_retired"] == 1


async def test_a_second_crash_before_the_replacement_did_anything_still_continues(
    log: EventLog, make_rig: Any
) -> None:
    """Attempt 3 continues attempt 1's lineage through attempt 2, which reached no boundary."""
    rig = await make_rig(Counter())
    await rig.counter_turn("r1")
    await rig.post("/add", "r1", 1, {"n": 5})  # after the boundary, before the cut
    await rig.restore_from_checkpoint("r1")  # attempt 2 restored (value 6), then the second crash
    cut = await log.last_seq()
    await log.supersede("r1", 2, instance="coordinator", from_cut=cut)
    rig.service.sessions.clear()  # the replacement process: nothing in memory
    # the agent restarts from attempt 1's boundary and re-issues the call it made after it
    replayed = (await rig.post("/add", "r1", 3, {"n": 5})).json()
    assert replayed["served_from_log"] is True and replayed["revision"] == 2
    fresh = (await rig.post("/add", "r1", 3, {"n": 1})).json()
    assert fresh["served_from_log"] is False and fresh["result"] == {"value": 7} and fresh["revision"] == 3
    adds = [
        (s.event.attempt, s.event.arguments)
        async for s in log.read(rollout_id="r1")
        if isinstance(s.event, ResourcesMutated)
    ]
    assert adds == [(1, {"n": 1}), (1, {"n": 5}), (3, {"n": 1})]  # nothing applied twice


async def test_the_same_checkpoint_restores_again_after_its_replacement_made_calls_and_died(
    log: EventLog, make_rig: Any
) -> None:
    rig = await make_rig(Counter())
    await rig.counter_turn("r1")
    cut = await rig.restore_from_checkpoint("r1")
    assert (await rig.post("/add", "r1", 2, {"n": 100})).json()["result"] == {"value": 101}  # then it died
    await log.supersede("r1", 2, instance="coordinator", from_cut=cut)  # the same checkpoint again
    rig.service.sessions.clear()
    again = (await rig.post("/add", "r1", 3, {"n": 2})).json()
    assert again["result"] == {"value": 3} and again["revision"] == 2  # attempt 2's call is not inherited


async def test_a_session_retired_while_prepare_waits_for_it_is_skipped_not_exported(
    log: EventLog, make_rig: Any
) -> None:
    """An exported environment snapshots every live session at prepare. A session retired (its
    database closed) while prepare waited for its lock was exported anyway, and the checkpoint
    failed on "Cannot operate on a closed database" (seen in a 300-rollout collection)."""
    rig = await make_rig(WorkplaceExported())
    for r in ("gone", "stays"):
        await log.dispatch(r, {}, instance="c")
        await rig.post("/seed_session", r, 1)
    held = next(s for s in rig.service.sessions.values() if s.ident.rollout_id == "gone")
    async with held.lock:  # a tool call in progress: prepare waits here
        exporting = asyncio.ensure_future(rig.service.prepare("ck-race"))
        await until(lambda: held.lock._waiters)  # type: ignore[attr-defined]
        assert rig.service.retire("gone", "accepted") == 1  # the hand-off lands meanwhile
    report = await exporting
    assert report.unreproducible == []
    from rollcut.bus import ResourcesSnapshot

    snapped = [s.event.rollout_id async for s in log.read() if isinstance(s.event, ResourcesSnapshot)]
    assert snapped == ["stays"]


def test_letters_rewards_the_share_of_the_answer_in_its_characters_and_refuses_a_bad_set() -> None:
    from rollcut.gym.resources import Letters

    env = Letters()
    assert env.verify(None, {"chars": "e", "answer": "eex!"})["reward"] == 0.5
    assert env.verify(None, {"chars": "ab", "answer": ""})["reward"] == 0.0
    for bad in ("", "x" * 65, 3):
        with pytest.raises(ValueError, match=r"verify\.chars"):
            env.verify(None, {"chars": bad, "answer": "e"})
