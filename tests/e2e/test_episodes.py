"""Episodes across crashes: every Gym server a process, SIGKILL, continuation from the cut.

Each test compares the continued episode with the same task run without interruption
(``reference``): same answer, same verification, and the log shows that nothing completed
below the cut was generated or applied again.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollcut.bus import (
    AgentBoundary,
    ModelCallAdmitted,
    ModelCallCompleted,
    ModelCallPrefixCut,
    ModelCallReused,
    ResourcesMutated,
    ResourcesRetired,
    ResourcesSeeded,
    RolloutCompleted,
)
from rollcut.ledger import verify_checkpoint
from rollcut.participants import Coordinator, plan_recovery
from rollcut.testing import ServerProcess

from ..helpers import until
from .conftest import Deployment, deploy
from .episodes import COUNTER, Episodes, episodes

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Deployment]:
    # slow enough tokens and enough tool turns that a kill right after a checkpoint is mid-episode
    with deploy(tmp_path, token_delay=0.004, tool_turns=6, agent_workers=1) as dep:
        yield dep


@pytest.fixture
async def ep(stack: Deployment) -> AsyncIterator[Episodes]:
    async with episodes(stack) as e:
        yield e


async def _crash_mid_episode(ep: Episodes, rid: str, task: dict[str, Any]) -> tuple[Any, int]:
    """Run ``rid`` until it passed a boundary, checkpoint, SIGKILL everything; restart."""
    await ep.log.dispatch(rid, task, instance="collector")
    ep.start_run(rid, 1, task)
    await ep.boundaries(rid, 1, at_least=1)
    ck = await ep.checkpoint()
    await ep.crash()
    assert not await ep.finished(rid), "the crash must hit the episode mid-run"
    ep.dep.restart()
    return ck, await ep.last_turn_below(rid, ck.cut)


async def _continued_like(
    ep: Episodes, rid: str, attempt: int, task: dict[str, Any], ref: dict[str, Any]
) -> None:
    resp = await ep.post_run(rid, attempt, task)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["continued"] is True
    assert (out["answer"], out["verified"], out["turns"]) == (ref["answer"], ref["verified"], ref["turns"])


async def test_an_episode_continues_from_its_last_boundary_with_its_resources_restored(ep: Episodes) -> None:
    ref = await ep.reference(COUNTER)
    # the verification checks the counter's final value: only a correctly restored session passes
    task = {**COUNTER, "verify": {"target": ref["verified"]["value"]}}
    ck, turn = await _crash_mid_episode(ep, "r", task)
    assert turn >= 1
    await ep.continue_from("r", ck)
    resp = await ep.post_run("r", 2, task)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["continued"] is True and out["answer"] == ref["answer"]
    assert out["verified"]["passed"] is True and out["verified"]["value"] == ref["verified"]["value"]
    assert await ep.first_turn("r", 2) == turn + 1  # from the last boundary below the cut
    assert await ep.regenerated("r") == []  # no model call generated twice
    assert await ep.reapplied("r") == []  # no tool call applied twice


async def test_a_second_crash_before_the_replacement_attempt_starts_still_continues(ep: Episodes) -> None:
    ref = await ep.reference(COUNTER)
    ck, turn = await _crash_mid_episode(ep, "r", COUNTER)
    await ep.continue_from("r", ck)  # attempt 2 is opened from the cut ...
    await ep.crash()  # ... and everything dies again before it ran a single step
    ep.dep.restart()
    tail = await ep.checkpoint()  # recovery seals the tail, as `rollcut collect --resume` does
    plan = await plan_recovery(ep.log, ep.ledger, ["r"], tail.checkpoint_id)
    assert plan.continue_ == ["r"]
    assert await ep.continue_from("r", tail) == 3
    await _continued_like(ep, "r", 3, COUNTER, ref)
    assert await ep.first_turn("r", 3) == turn + 1  # attempt 1's boundary, through attempt 2
    assert await ep.regenerated("r") == [] and await ep.reapplied("r") == []


async def test_the_same_checkpoint_restores_again_after_its_replacement_made_calls_and_died(
    ep: Episodes,
) -> None:
    ref = await ep.reference(COUNTER)
    ck, turn = await _crash_mid_episode(ep, "r", COUNTER)
    await ep.continue_from("r", ck)
    ep.start_run("r", 2, COUNTER)

    async def new_call_in_attempt_2() -> bool:
        return any(a == 2 for _, a, _ in await ep.generated("r"))

    await until(new_call_in_attempt_2, timeout=60, what="attempt 2 generating")
    await ep.crash()
    assert not await ep.finished("r")
    ep.dep.restart()
    plan = await plan_recovery(ep.log, ep.ledger, ["r"], ck.checkpoint_id)  # the same checkpoint again
    assert plan.continue_ == ["r"]
    assert await ep.continue_from("r", ck) == 3
    await _continued_like(ep, "r", 3, COUNTER, ref)
    assert await ep.first_turn("r", 3) == turn + 1
    # nothing completed below the cut ran again, in either replacement
    assert await ep.regenerated("r", at_or_below=ck.cut) == []
    assert await ep.reapplied("r", at_or_below=ck.cut) == []
    # attempt 3 starts from the state at the cut, not from what attempt 2 did after it
    seeded = [e for _, e in await ep.events("r", 3) if isinstance(e, ResourcesSeeded)]
    below = [e for s, e in await ep.events("r", 1) if s <= ck.cut and hasattr(e, "revision")]
    assert seeded[0].revision == max(e.revision for e in below)


async def test_skipping_the_resources_restore_fails_the_episodes_verification(ep: Episodes) -> None:
    """The negative control: the same crash and continuation, on a counter that does not restore."""
    ref = await ep.reference(COUNTER)
    task = {**COUNTER, "verify": {"target": ref["verified"]["value"]}}
    ck, _ = await _crash_mid_episode(ep, "r", task)
    adds_kept = [
        e for s, e in await ep.events("r", 1) if isinstance(e, ResourcesMutated) and e.delta and s <= ck.cut
    ]
    assert adds_kept, "the control needs state below the cut that only a restore carries over"
    counter = ep.dep.stack[1]
    port = counter.url.rsplit(":", 1)[1]
    counter.kill()
    amnesiac = ServerProcess(
        ["--url", ep.dep.url, "--namespace", "demo", "--credentials", str(ep.dep.creds), "--port", port],
        command=[sys.executable, "-m", "tests.e2e.amnesiac"],
    ).start()
    ep.dep.stack[1] = amnesiac
    await ep.continue_from("r", ck)
    resp = await ep.post_run("r", 2, task)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["verified"]["passed"] is False and out["verified"]["value"] != ref["verified"]["value"]


async def test_token_lineage_continues_across_a_crash(ep: Episodes) -> None:
    await ep.reference(COUNTER)
    ck, _ = await _crash_mid_episode(ep, "r", COUNTER)
    await ep.continue_from("r", ck)
    assert (await ep.post_run("r", 2, COUNTER)).status_code == 200
    continued, reference = await ep.lineage_tokens("r"), await ep.lineage_tokens("reference")
    assert continued == reference  # one unbroken chain of the same tokens, through the crash
    first_attempt_calls = {e.call_id for _, e in await ep.events("r", 1) if isinstance(e, ModelCallCompleted)}
    chain = ep.tokens.chain(
        [
            e.call_id
            for _, e in await ep.events("r", 2)
            if isinstance(e, ModelCallCompleted | ModelCallReused)
        ][-1]
    )
    assert first_attempt_calls & set(chain)  # the lineage reaches back into attempt 1


async def test_a_checkpoint_without_a_crash_takes_every_episode_as_it_stands_and_releases_them(
    ep: Episodes,
) -> None:
    ref = await ep.reference(COUNTER)
    ids = [f"p{i}" for i in range(6)]
    for rid in ids:
        await ep.log.dispatch(rid, COUNTER, instance="collector")
    runs = [ep.start_run(rid, 1, COUNTER) for rid in ids]
    for rid in ids:
        await ep.boundaries(rid, 1, at_least=1)
    ck = await ep.checkpoint()
    for rid in ids:  # at the cut each episode stood at a boundary or in one model call the cut covers
        evs = [(s, e) for s, e in await ep.events(rid) if s <= ck.cut]
        if any(isinstance(e, ResourcesRetired | RolloutCompleted) for _, e in evs):
            continue  # it finished before the cut
        admitted = [e.call_id for _, e in evs if isinstance(e, ModelCallAdmitted)]
        completed = {e.call_id for _, e in evs if isinstance(e, ModelCallCompleted)}
        open_calls = [c for c in admitted if c not in completed]
        # at most the latest call is open: cut at a durable prefix, or not yet started (the validator
        # found it in the model worker's prepare reply, or the checkpoint would not be published)
        assert open_calls in ([], admitted[-1:]), rid
        turns = [e.record.turn for _, e in evs if isinstance(e, AgentBoundary)]
        assert turns[-1] <= len(completed), rid  # a boundary names only completed turns
    outs = await asyncio.gather(*runs)  # released: every one finishes, as if nothing happened
    for o in outs:
        assert o.status_code == 200 and o.json()["answer"] == ref["answer"]
    assert await verify_checkpoint(ep.log, ep.ledger, ep.tokens, ck.checkpoint_id) == []


async def test_a_retired_episode_stops_everywhere_and_leaves_nothing_behind(ep: Episodes) -> None:
    await ep.log.dispatch("r", COUNTER, instance="collector")
    run = ep.start_run("r", 1, COUNTER)
    await ep.boundaries("r", 1, at_least=1)
    # the model server held closed (a prepare with no checkpoint after it): the episode's next model
    # call waits there, so it cannot finish before the operator's command lands, however slowly
    # that starts on a loaded machine
    coordinator = Coordinator(ep.log, ep.ledger, ep.tokens)
    [model] = [i for i in await coordinator.discover() if i.component == "model"]
    assert (await coordinator.call(model, "prepare", "hold", time.time() + 120)).ok
    retired = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollcut",
            "retire",
            "r",
            "--reason",
            "policy moved on",
            "--url",
            ep.dep.url,
            "--namespace",
            "demo",
            "--credentials",
            str(ep.dep.creds),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert retired.returncode == 0, retired.stderr[-1500:]
    assert (await coordinator.call(model, "abort", "hold", time.time() + 30)).ok
    resp = await run
    assert resp.status_code == 409, resp.text
    assert resp.json()["error"]["code"] in ("retired", "stale_attempt")
    assert not await ep.finished("r")

    async def nothing_left() -> bool:
        s = await ep.stats()
        model, counter, agents = s[0], s[1], s[4]
        return model["in_flight"] == 0 and counter["sessions"] == 0 and agents["running"] == 0

    await until(nothing_left, timeout=20, what="every server to drop the retired rollout")
    # nothing of it is ever written again, and no attempt may open
    last = (await ep.events("r"))[-1][0]
    again = await ep.post_run("r", 1, COUNTER)
    assert again.status_code == 409
    state = await ep.log.fence_state("r")
    assert state is not None and state.retired
    assert (await ep.events("r"))[-1][0] == last
    plan = await plan_recovery(ep.log, ep.ledger, ["r"])
    assert plan.retired == ["r"] and not plan.continue_ and not plan.fresh_dispatch


async def test_an_episode_whose_answer_is_generating_at_a_checkpoint_is_neither_lost_nor_redone(
    ep: Episodes,
) -> None:
    ref = await ep.reference(COUNTER)
    await ep.log.dispatch("r", COUNTER, instance="collector")
    run = ep.start_run("r", 1, COUNTER)

    async def final_call_running() -> bool:  # the answer's call admitted: no boundary comes after it
        evs = [e for _, e in await ep.events("r", 1)]
        admitted = sum(isinstance(e, ModelCallAdmitted) for e in evs)
        return admitted == ref["turns"] + 1

    await until(final_call_running, timeout=60, what="the final turn")
    ck = await ep.checkpoint()  # the answer is generating: the checkpoint does not wait for it
    resp = await run
    assert resp.status_code == 200 and resp.json()["answer"] == ref["answer"]  # not lost
    evs = await ep.events("r", 1)
    final = [(s, e) for s, e in evs if isinstance(e, ModelCallCompleted)][-1]
    cuts = [s for s, e in evs if isinstance(e, ModelCallPrefixCut) and e.call_id == final[1].call_id]
    if cuts:  # it was cut at a durable prefix below the seal, and finished after it
        assert cuts[-1] < ck.cut < final[0]
    # the hand-off never happened (the crash comes first): recovery continues it, and nothing runs again
    await ep.crash()
    ep.dep.restart()
    assert (await plan_recovery(ep.log, ep.ledger, ["r"], ck.checkpoint_id)).continue_ == ["r"]
    await ep.continue_from("r", ck)
    again = await ep.post_run("r", 2, COUNTER)
    assert again.status_code == 200 and again.json()["answer"] == ref["answer"]
    assert not any(isinstance(e, ModelCallCompleted) for _, e in await ep.events("r", 2))  # not redone
    assert await ep.regenerated("r") == [] and await ep.reapplied("r") == []
