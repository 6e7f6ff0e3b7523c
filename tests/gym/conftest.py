"""An in-process model server on the real bus, called over ASGI."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from openai import AsyncOpenAI

from rollcut.bus import AgentBoundary, AgentBoundaryRecord, BusConfig, EventLog
from rollcut.gym.agent import SimpleAgent, create_agent_app
from rollcut.gym.model import Backend, LocalBackend, ModelService, create_app
from rollcut.gym.resources import Counter, Environment, ResourcesService, create_resources_app
from rollcut.gym.wire import Identity, ng_path_id
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, Participant
from rollcut.tokens import LocalTokenStore

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
        },
    }
]


@dataclass
class ModelRig:
    log: EventLog
    service: ModelService
    participant: Participant
    client: httpx.AsyncClient
    tokens: LocalTokenStore
    coordinator: Coordinator

    def headers(self, rollout_id: str, attempt: int = 1) -> dict[str, str]:
        return {"x-rollout-id": rollout_id, "x-rollout-attempt": str(attempt)}


@contextlib.asynccontextmanager
async def rig_for(
    log: EventLog, bus_config: BusConfig, tmp_path: Path, backend: Backend
) -> AsyncIterator[ModelRig]:
    """A model worker over ``backend``, registered as a participant, called over ASGI."""
    mlog = await EventLog.connect(bus_config, name="model-w0")
    tokens = LocalTokenStore(tmp_path / "tokens")
    participant = Participant(
        mlog,
        component="model",
        instance="model-w0",
        mode="exported",
        drain=False,
        group="model",
        lease_grace_s=0.5,
    )
    service = ModelService(mlog, tokens, backend, instance="model-w0", participant=participant)
    participant.hooks = service
    await participant.start()
    ledger = Ledger(tmp_path / "ledger")
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(service, return_token_ids=True)), base_url="http://model"
    )
    try:
        yield ModelRig(log, service, participant, client, tokens, Coordinator(log, ledger, tokens))
    finally:
        await client.aclose()
        await participant.stop()
        await mlog.close()
        ledger.close()
        tokens.close()


@pytest.fixture
async def rig(log: EventLog, bus_config: BusConfig, tmp_path: Path) -> AsyncIterator[ModelRig]:
    async with rig_for(log, bus_config, tmp_path, LocalBackend(seed=7, token_delay_s=0.0)) as r:
        yield r


@pytest.fixture
async def base_url(rig: ModelRig) -> AsyncIterator[str]:
    """The rig's model service, served by uvicorn on a free loopback port, with token ids on."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(create_app(rig.service, return_token_ids=True), log_level="warning", lifespan="off")
    )
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), task
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task


def client(base_url: str, rollout_id: str, attempt: int = 1, **kw: Any) -> AsyncOpenAI:
    """An SDK client whose calls carry rollcut identity through NeMo Gym's path prefix."""
    prefix = ng_path_id(Identity(rollout_id, attempt))
    return AsyncOpenAI(base_url=f"{base_url}/ng-rollout/{prefix}/v1", api_key="unused", **kw)


# --- the agent with a model and a counter resources server, all in process on the real bus ---

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
                "http://model": httpx.ASGITransport(app=create_app(model, return_token_ids=True)),
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


# --- a resources server as a participant, its coordinator beside it (tests/gym/test_resources.py) ---


class Rig:
    def __init__(
        self,
        log: EventLog,
        service: ResourcesService,
        client: httpx.AsyncClient,
        coordinator: Coordinator,
        participant: Participant,
    ) -> None:
        self.log, self.service, self.client, self.coordinator, self.participant = (
            log,
            service,
            client,
            coordinator,
            participant,
        )

    async def post(
        self, path: str, rollout: str, attempt: int, body: dict[str, Any] | None = None
    ) -> httpx.Response:
        return await self.client.post(
            path, json=body or {}, headers={"x-rollout-id": rollout, "x-rollout-attempt": str(attempt)}
        )

    async def boundary(self, rollout: str, env: str, revision: int) -> None:
        """What the agent records after a turn: the resources revision it has seen."""
        await self.log.append(
            AgentBoundary(
                component="agent",
                instance="a",
                rollout_id=rollout,
                attempt=1,
                record=AgentBoundaryRecord(turn=0, resources_revisions={env: revision}),
            )
        )

    async def counter_turn(self, rollout: str) -> None:
        """Dispatch, seed a counter session, add 1, and record the agent's boundary after it."""
        await self.log.dispatch(rollout, {}, instance="c")
        await self.post("/seed_session", rollout, 1)
        await self.post("/add", rollout, 1, {"n": 1})
        await self.boundary(rollout, "counter", 1)

    async def restore_from_checkpoint(self, rollout: str) -> int:
        """Checkpoint, tombstone attempt 1, open 2 from the cut, restore: returns the cut."""
        res = await self.coordinator.checkpoint(deadline_s=5)
        await self.log.supersede(
            rollout,
            1,
            instance="coordinator",
            checkpoint_id=res.record.checkpoint_id,
            from_cut=res.record.cut,
        )
        await self.service.restore(res.record.checkpoint_id, res.record.cut, rollouts=[rollout])
        return res.record.cut


@pytest.fixture
async def make_rig(log: EventLog, bus_config: BusConfig, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    opened: list[Any] = []

    async def make(env: Environment) -> Rig:
        rlog = await EventLog.connect(bus_config)
        needs_prepare = env.mode == "exported" or env.verification == "wait"
        participant = Participant(
            rlog,
            component="resources",
            instance=f"{env.name}-0",
            mode="exported" if needs_prepare else env.mode,
            drain=False,
        )  # type: ignore[arg-type]
        service = ResourcesService(rlog, env, instance=f"{env.name}-0", participant=participant)
        participant.hooks = service
        await participant.start()
        ledger = Ledger(tmp_path / f"ledger-{env.name}")
        tokens = LocalTokenStore(tmp_path / f"tokens-{env.name}")
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_resources_app(service)), base_url="http://res"
        )
        opened.append((rlog, participant, ledger, tokens, client))
        return Rig(log, service, client, Coordinator(log, ledger, tokens), participant)

    yield make
    for rlog, participant, ledger, tokens, client in opened:
        await client.aclose()
        await participant.stop()
        await rlog.close()
        ledger.close()
        tokens.close()
