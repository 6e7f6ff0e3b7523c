"""The Simple Agent with the model and resources servers, on the real bus."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollcut.bus import (
    AgentBoundary,
    BusConfig,
    EventLog,
    ModelCallCompleted,
    ModelCallReused,
    ResourcesMutated,
)
from rollcut.gym.agent import SimpleAgent, create_agent_app
from rollcut.gym.model import LocalBackend, ModelService, create_app
from rollcut.gym.resources import Counter, ResourcesService, create_resources_app
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, Participant
from rollcut.tokens import LocalTokenStore

TASK = {"env": "counter", "prompt": "count up", "seed": {"start": 0}, "max_steps": 8}


@dataclass
class Stack:
    log: EventLog
    model: ModelService
    resources: ResourcesService
    agent: SimpleAgent
    client: httpx.AsyncClient
    coordinator: Coordinator

    async def run(self, rollout: str, attempt: int, task: dict[str, Any] = TASK) -> httpx.Response:
        return await self.client.post(
            "/run", json=task, headers={"x-rollout-id": rollout, "x-rollout-attempt": str(attempt)}
        )


@pytest.fixture
async def stack(log: EventLog, bus_config: BusConfig, tmp_path: Path) -> AsyncIterator[Any]:
    made: list[Any] = []

    async def make(*, token_delay: float = 0.0, system_prompt: str | None = None) -> Stack:
        logs = [await EventLog.connect(bus_config) for _ in range(3)]
        tokens = LocalTokenStore(tmp_path / f"tokens{len(made)}")
        mp = Participant(
            logs[0], component="model", instance=f"model-{len(made)}", mode="exported", drain=False
        )
        model = ModelService(
            logs[0],
            tokens,
            LocalBackend(seed=1, token_delay_s=token_delay),
            instance=mp.instance,
            participant=mp,
        )
        mp.hooks = model
        rp = Participant(
            logs[1], component="resources", instance=f"counter-{len(made)}", mode="event_sourced"
        )
        resources = ResourcesService(logs[1], Counter(), instance=rp.instance, participant=rp)
        rp.hooks = resources
        transport = httpx.AsyncClient(
            mounts={
                "http://model": httpx.ASGITransport(app=create_app(model)),
                "http://res": httpx.ASGITransport(app=create_resources_app(resources)),
            }
        )
        ap = Participant(
            logs[2], component="agent", instance=f"agent-{len(made)}", mode="exported", drain=False
        )
        kw = {"system_prompt": system_prompt} if system_prompt else {}
        agent = SimpleAgent(
            logs[2],
            instance=ap.instance,
            model_url="http://model",
            resources={"counter": "http://res"},
            participant=ap,
            http=transport,
            **kw,
        )
        ap.hooks = agent
        for p in (mp, rp, ap):
            await p.start()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_agent_app(agent)), base_url="http://a"
        )
        ledger = Ledger(tmp_path / f"ledger{len(made)}")
        made.append((logs, tokens, transport, client, ledger, (mp, rp, ap)))
        return Stack(log, model, resources, agent, client, Coordinator(log, ledger, tokens))

    yield make
    for logs, tokens, transport, client, ledger, parts in made:
        await client.aclose()
        await transport.aclose()
        for p in parts:
            await p.stop()
        for lg in logs:
            await lg.close()
        ledger.close()
        tokens.close()


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
    assert again.status_code == 409 and again.json()["error"]["type"] == "attempt_in_use"
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
    assert len([e for e in a2 if isinstance(e, ModelCallReused)]) == 1  # turn 2's call came from the log
    assert s.resources.stats["tool_calls_served_from_log"] == 1  # turn 2's tool call came from the log
    assert s.model.stats["calls_generated"] - generated == 2  # turns 3 and the answer, live
    assert s.resources.stats["tool_calls_executed"] - executed == 1  # turn 3's tool call, live
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
    assert resp.status_code == 409 and resp.json()["error"]["type"] == "fresh_dispatch"
    assert "differs from logged" in resp.json()["error"]["message"]


async def test_a_checkpoint_parks_running_episodes_at_a_boundary_and_releases_them(
    log: EventLog, stack: Any
) -> None:
    s = await stack(token_delay=0.01)
    for r in ("p1", "p2"):
        await log.dispatch(r, TASK, instance="collector")
    runs = [asyncio.ensure_future(s.run(r, 1)) for r in ("p1", "p2")]
    for _ in range(300):  # bounded: until both are under way
        if s.agent.stats["boundaries"] >= 1 and len(s.agent._runs) == 2:
            break
        await asyncio.sleep(0.01)
    res = await s.coordinator.checkpoint(deadline_s=10)
    assert s.agent.stats["parks"] >= 1
    outs = [(await r).json() for r in runs]
    assert all(o["turns"] == 3 for o in outs)
    # every boundary a parked episode stopped at is below the seal
    parked_at = [e.seq async for e in log.read(up_to=res.record.cut) if isinstance(e.event, AgentBoundary)]
    assert parked_at and max(parked_at) < res.record.cut


async def test_an_episode_that_finishes_during_prepare_is_neither_lost_nor_redone(
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
        for _ in range(500):  # bounded: until the last tool turn is done and the final answer is generating
            if s.agent.stats["boundaries"] >= 3:
                break
            await asyncio.sleep(0.01)
        res = await s.coordinator.checkpoint(deadline_s=10)  # its final turn ends inside this prepare
        out = await episode
    assert out.status_code == 200 and out.json()["turns"] == 3  # not lost
    completed = [e async for e in log.read(rollout_id="r1") if isinstance(e.event, RolloutCompleted)]
    assert len(completed) == 1 and completed[0].seq < res.record.cut  # completed below the cut: not redone
    answers = [e async for e in log.read(rollout_id="r1") if isinstance(e.event, ModelCallCompleted)]
    assert len(answers) == 4 and answers[-1].seq < res.record.cut
