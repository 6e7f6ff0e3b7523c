"""An in-process model server on the real bus, called over ASGI."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rollcut.bus import BusConfig, EventLog
from rollcut.gym.model import LocalBackend, ModelService, create_app
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


@pytest.fixture
async def rig(log: EventLog, bus_config: BusConfig, tmp_path: Path) -> AsyncIterator[ModelRig]:
    mlog = await EventLog.connect(bus_config, name="model-w0")
    tokens = LocalTokenStore(tmp_path / "tokens")
    backend = LocalBackend(seed=7, token_delay_s=0.0)
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
