"""The openai backend: custody around an upstream, and the dispositions it can honestly give.

The upstream is a small in-process stand-in for vLLM (what is not under test);
the bus and token store are real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from rollcut.bus import BusConfig, EventLog, ModelCallCompleted
from rollcut.gym.model import ModelService, OpenAIBackend, create_app, encode
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, Participant
from rollcut.tokens import LocalTokenStore


def upstream_app(*, with_ids: bool, gate: asyncio.Event | None = None) -> FastAPI:
    app = FastAPI()
    seen: list[dict[str, Any]] = []
    app.state.seen = seen

    @app.post("/v1/chat/completions")
    async def chat(body: dict[str, Any]) -> dict[str, Any]:
        seen.append(body)
        if gate is not None:
            await gate.wait()  # a generation that takes as long as the test says
        lp = [{"token": f"token_id:{100 + i}" if with_ids else "x", "logprob": -0.1 * i} for i in range(5)]
        return {
            "id": "up-1",
            "object": "chat.completion",
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hello"},
                    "finish_reason": "stop",
                    "logprobs": {"content": lp},
                }
            ],
        }

    return app


@pytest.fixture
async def make(bus_config: BusConfig, tmp_path: Path) -> AsyncIterator[Any]:
    opened: list[Any] = []

    async def build(app: FastAPI) -> tuple[ModelService, httpx.AsyncClient, Participant, LocalTokenStore]:
        mlog = await EventLog.connect(bus_config)
        tokens = LocalTokenStore(tmp_path / f"tokens{len(opened)}")
        upstream = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://upstream")
        participant = Participant(mlog, component="model", instance="up-w0", mode="exported", drain=False)
        service = ModelService(
            mlog, tokens, OpenAIBackend(upstream), instance="up-w0", participant=participant
        )
        participant.hooks = service
        await participant.start()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(service)), base_url="http://m"
        )
        opened.append((mlog, tokens, upstream, participant, client))
        return service, client, participant, tokens

    yield build
    for mlog, tokens, upstream, participant, client in opened:
        await client.aclose()
        await upstream.aclose()
        await participant.stop()
        await mlog.close()
        tokens.close()


H = {"x-rollout-id": "r1", "x-rollout-attempt": "1"}
BODY = {"messages": [{"role": "user", "content": "hi"}], "stream": False}


async def test_upstream_token_ids_are_kept_in_custody(log: EventLog, make: Any) -> None:
    app = upstream_app(with_ids=True)
    _, client, _, tokens = await make(app)
    await log.dispatch("r1", {}, instance="c")
    out = (await client.post("/v1/chat/completions", json=BODY, headers=H)).json()
    assert out["choices"][0]["message"]["content"] == "hello"
    assert app.state.seen[0]["logprobs"] is True and app.state.seen[0]["return_tokens_as_token_ids"] is True
    [done] = [s.event async for s in log.read(rollout_id="r1") if isinstance(s.event, ModelCallCompleted)]
    rec = tokens.get(done.receipt)
    assert rec.output_ids == [100, 101, 102, 103, 104] and rec.prompt_ids == [1, 2, 3]
    assert done.policy_version == "upstream" and rec.logprobs[1] == pytest.approx(-0.1)


async def test_upstream_without_ids_is_recorded_as_byte_tokens(log: EventLog, make: Any) -> None:
    _, client, _, tokens = await make(upstream_app(with_ids=False))
    await log.dispatch("r1", {}, instance="c")
    await client.post("/v1/chat/completions", json=BODY, headers=H)
    [done] = [s.event async for s in log.read(rollout_id="r1") if isinstance(s.event, ModelCallCompleted)]
    assert done.policy_version == "upstream+bytes"
    assert tokens.get(done.receipt).output_ids == encode("hello")


async def test_a_running_upstream_call_is_excluded_never_cut(
    log: EventLog, make: Any, tmp_path: Path
) -> None:
    gate = asyncio.Event()
    service, client, _, tokens = await make(upstream_app(with_ids=True, gate=gate))
    await log.dispatch("r1", {}, instance="c")
    call = asyncio.ensure_future(client.post("/v1/chat/completions", json=BODY, headers=H))
    for _ in range(200):  # bounded: until the upstream call is running
        if any(f.state == "generating" for f in service._inflight.values()):
            break
        await asyncio.sleep(0.01)
    with Ledger(tmp_path / "ledger") as led:
        coord = Coordinator(log, led, tokens)
        [info] = await coord.discover()
        reply = await coord.call(info, "prepare", "ck-up", time.time() + 5)
        assert reply.ok and [c.disposition for c in reply.calls or []] == ["excluded"]
        assert (await coord.call(info, "abort", "ck-up", time.time() + 5)).ok
    gate.set()
    assert (await call).status_code == 200
    kinds = [type(s.event).__name__ async for s in log.read(rollout_id="r1") if s.event.component == "model"]
    assert kinds == ["ModelCallAdmitted", "ModelCallExcluded", "ModelCallCompleted"]
