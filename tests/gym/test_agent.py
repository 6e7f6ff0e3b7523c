"""The Simple Agent with the model and resources servers, on the real bus."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from rollcut.bus import (
    AgentBoundary,
    EventLog,
    ModelCallCompleted,
    ModelCallPrefixCut,
    ModelCallReused,
    ResourcesMutated,
)
from rollcut.gym.agent import create_agent_app
from rollcut.tokens import call_store

from ..helpers import until
from .conftest import TASK


async def test_a_run_calls_model_and_tools_writes_boundaries_and_verifies(log: EventLog, stack: Any) -> None:
    s = await stack()
    await log.dispatch("r1", TASK, instance="collector")
    out = (await s.run("r1", 1)).json()
    assert out["turns"] == 3 and out["answer"]  # three tool turns, then a final answer
    boundaries = [e.event async for e in log.read(rollout_id="r1") if isinstance(e.event, AgentBoundary)]
    assert [b.record.turn for b in boundaries] == [1, 2, 3]
    assert [b.record.resources_revisions["counter"] for b in boundaries] == [1, 2, 3]
    completed = [
        e.event.call_id async for e in log.read(rollout_id="r1") if isinstance(e.event, ModelCallCompleted)
    ]
    assert boundaries[-1].record.last_model_call_id == completed[2] and len(completed) == 4
    deltas = [e.event.delta async for e in log.read(rollout_id="r1") if isinstance(e.event, ResourcesMutated)]
    assert len(deltas) == 3 and out["verified"]["value"] == sum(deltas)  # the counter saw exactly those adds


async def test_an_attempt_that_already_ran_is_not_run_again(log: EventLog, stack: Any) -> None:
    """A framework retrying a /run would start the attempt over and redo its calls: refused."""
    s = await stack()
    await log.dispatch("r1", TASK, instance="collector")
    assert (await s.run("r1", 1)).status_code == 200
    before = await log.last_seq()
    again = await s.run("r1", 1)
    assert again.status_code == 409 and again.json()["error"]["code"] == "attempt_in_use"
    assert await log.last_seq() == before  # nothing ran, nothing was written


async def test_continuation_from_a_cut_mid_turn_repeats_no_model_or_tool_call(
    log: EventLog, stack: Any
) -> None:
    s = await stack()
    await log.dispatch("r1", TASK, instance="collector")
    first = (await s.run("r1", 1)).json()
    events = [e async for e in log.read(rollout_id="r1", attempt=1)]
    b1 = next(e.seq for e in events if isinstance(e.event, AgentBoundary) and e.event.record.turn == 1)
    # a cut inside turn 2: its model call and its tool call are durable, its boundary is not
    mut2 = next(e.seq for e in events if isinstance(e.event, ResourcesMutated) and e.event.revision == 2)
    cut = mut2
    assert b1 < cut
    below = {
        e.event.request_digest for e in events if isinstance(e.event, ModelCallCompleted) and e.seq <= cut
    }
    await log.supersede("r1", 1, instance="coordinator", from_cut=cut)
    generated, executed = s.model.stats["calls_generated"], s.resources.stats["tool_calls_executed"]
    second = (await s.run("r1", 2)).json()
    a2 = [e.event async for e in log.read(rollout_id="r1", attempt=2)]
    regenerated = {e.request_digest for e in a2 if isinstance(e, ModelCallCompleted)}
    assert not (regenerated & below)  # no completed model call ran twice
    reused = [e for e in a2 if isinstance(e, ModelCallReused)]
    # turn 2's call from below the cut; turn 3's and the answer's, which attempt 1 completed after the
    # cut and before the fence moved, for the very same requests: nothing generated again at all
    done_in_1 = {e.event.call_id for e in events if isinstance(e.event, ModelCallCompleted)}
    assert len(reused) == 3 and all(e.source_attempt == 1 and e.source_call_id in done_in_1 for e in reused)
    assert regenerated == set() and s.model.stats["calls_generated"] - generated == 0
    assert s.resources.stats["tool_calls_served_from_log"] == 1  # turn 2's tool call came from the log
    # turn 3's tool call runs live: the environment continues from its state at the cut, and what it
    # did after the cut is not part of that state
    assert s.resources.stats["tool_calls_executed"] - executed == 1
    assert second["answer"] == first["answer"] and second["continued"] is True
    assert second["verified"] == first["verified"]


async def test_a_changed_agent_falls_back_to_fresh_dispatch(log: EventLog, stack: Any) -> None:
    s = await stack()
    await log.dispatch("r1", TASK, instance="collector")
    await s.run("r1", 1)
    events = [e async for e in log.read(rollout_id="r1", attempt=1)]
    cut = next(e.seq for e in events if isinstance(e.event, ResourcesMutated) and e.event.revision == 1)
    await log.supersede("r1", 1, instance="coordinator", from_cut=cut)
    changed = await stack(system_prompt="You are a different agent now.")
    resp = await changed.run("r1", 2)
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "fresh_dispatch"
    assert "differs from logged" in resp.json()["error"]["message"]


async def test_a_checkpoint_does_not_wait_for_a_model_call_in_flight_and_both_episodes_go_on(
    log: EventLog, stack: Any
) -> None:
    s = await stack(token_delay=0.01)  # a model call takes about a second
    for r in ("p1", "p2"):
        await log.dispatch(r, TASK, instance="collector")
    runs = [asyncio.ensure_future(s.run(r, 1)) for r in ("p1", "p2")]
    await until(
        lambda: (
            s.agent.stats["boundaries"] >= 1
            and len(s.agent._runs) == 2
            and s.model.stats["tokens_generated"] > 0
        ),
        timeout=60,
        what="both runs under way, one of them generating",
    )
    generating = [r for r in s.agent._runs.values() if r.calling]
    res = await s.coordinator.checkpoint(deadline_s=10)
    assert generating and s.model.stats["prefix_cuts"] >= 1  # its call was cut, not waited for
    below = [e.event async for e in log.read(up_to=res.record.cut)]
    cuts = [e for e in below if isinstance(e, ModelCallPrefixCut)]
    assert cuts and not any(isinstance(e, ModelCallCompleted) and e.call_id == cuts[0].call_id for e in below)
    outs = [(await r).json() for r in runs]
    assert all(o["turns"] == 3 for o in outs)  # released, both went on to their answers


async def test_an_episode_whose_answer_is_generating_at_a_checkpoint_is_cut_not_waited_for_and_ends_once(
    log: EventLog, stack: Any
) -> None:
    from rollcut.bus import RolloutCompleted
    from rollcut.gym import create_environment_app

    s = await stack(token_delay=0.01)
    env_app = create_environment_app(
        log,
        instance="env-0",
        agent_url="http://agent",
        http=httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_agent_app(s.agent)), base_url="http://agent"
        ),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=env_app), base_url="http://env") as env:
        await log.dispatch("r1", TASK, instance="collector")
        episode = asyncio.ensure_future(
            env.post("/run", json=TASK, headers={"x-rollout-id": "r1", "x-rollout-attempt": "1"})
        )
        # until the last tool turn is done and the final answer is generating
        await until(lambda: s.agent.stats["boundaries"] >= 3, timeout=60, what="three boundaries")
        res = await s.coordinator.checkpoint(deadline_s=10)  # its final answer is generating
        out = await episode
    assert out.status_code == 200 and out.json()["turns"] == 3  # not lost
    completed = [e async for e in log.read(rollout_id="r1") if isinstance(e.event, RolloutCompleted)]
    assert len(completed) == 1  # ended once
    events = [e async for e in log.read(rollout_id="r1")]
    answers = [e for e in events if isinstance(e.event, ModelCallCompleted)]
    cut = [e for e in events if isinstance(e.event, ModelCallPrefixCut)]
    # the answer was cut below the seal, not waited for; it completed after, once
    assert len(answers) == 4 and len(cut) == 1 and cut[0].event.call_id == answers[-1].event.call_id
    assert cut[0].seq < res.record.cut < answers[-1].seq
    record = await call_store(s.model.tokens, s.model.tokens.get, answers[-1].event.receipt)
    prefix = await call_store(s.model.tokens, s.model.tokens.get, cut[0].event.receipt)
    assert record.output_ids[: len(prefix.output_ids)] == prefix.output_ids


async def test_concurrent_runs_of_one_attempt_on_two_agents_run_it_once(log: EventLog, stack: Any) -> None:
    from rollcut.bus import AttemptClaimed, ResourcesSeeded

    a, b = await stack(), await stack()  # two agents, two resources servers, one bus
    await log.dispatch("r-race", TASK, instance="collector")
    answers = await asyncio.gather(*(s.run("r-race", 1) for s in (a, b) * 5))
    codes = sorted(r.status_code for r in answers)
    assert codes == [200] + [409] * 9, codes
    assert all(r.json()["error"]["code"] == "attempt_in_use" for r in answers if r.status_code == 409)
    events = [s.event async for s in log.read(rollout_id="r-race", attempt=1)]
    assert len([e for e in events if isinstance(e, AttemptClaimed)]) == 1
    assert len([e for e in events if isinstance(e, ResourcesSeeded)]) == 1  # the losers changed nothing


async def test_a_rollout_retired_as_its_boundary_is_written_answers_409_not_500(
    log: EventLog, stack: Any
) -> None:
    """The race the episodes suite met under load: the rollout is retired between a turn's end and
    its boundary's append; the fence refuses the append, and the run's answer says why (a 409)."""
    s = await stack()
    await log.dispatch("r1", TASK, instance="collector")
    write = s.agent.boundary

    async def retired_first(run: Any, record: Any) -> None:
        await log.retire("r1", instance="collector", reason="policy moved on")
        await write(run, record)

    s.agent.boundary = retired_first
    out = await s.run("r1", 1)
    assert out.status_code == 409, out.text
    assert out.json()["error"]["code"] in ("retired", "stale_attempt")
