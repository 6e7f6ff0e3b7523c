"""The policy model on a real inference engine: custody, cuts and failures with the engine generating.

The engine is a real process (``tests/engine.py``): llama.cpp's server on a tiny model this suite
writes, or whatever ``ROLLCUT_ENGINE_*`` names. The model service runs in process on the real bus.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from rollcut.bus import (
    BusConfig,
    EventLog,
    ModelCallCompleted,
    ModelCallExcluded,
    ModelCallFailed,
    ModelCallPrefixCut,
)
from rollcut.gym.model.engine import Capabilities, EngineBackend, LlamaCpp
from rollcut.tokens import call_store

from ..engine import Engine
from ..helpers import until
from .conftest import ModelRig, rig_for


@pytest.fixture
async def erig(
    log: EventLog, bus_config: BusConfig, tmp_path: Path, engine: Engine
) -> AsyncIterator[ModelRig]:
    async with rig_for(log, bus_config, tmp_path, engine.backend()) as r:
        yield r


def sdk(rig: ModelRig, rollout: str, attempt: int = 1, retries: int = 0) -> AsyncOpenAI:
    """The official client, through the model app, as one rollout's attempt."""
    return AsyncOpenAI(
        base_url="http://model/v1",
        api_key="unused",
        http_client=rig.client,
        default_headers=rig.headers(rollout, attempt),
        max_retries=retries,
    )


async def events(log: EventLog, rollout: str) -> list[Any]:
    return [s.event async for s in log.read(rollout_id=rollout)]


async def test_an_engine_call_keeps_what_the_engine_tokenized_and_streamed(
    erig: ModelRig, engine: Engine
) -> None:
    await erig.log.dispatch("r1", {}, instance="collector")
    messages: list[Any] = [{"role": "user", "content": "the agent and the tool"}]
    before = engine.tokens_predicted()
    out = await sdk(erig, "r1").chat.completions.create(
        model="rollcut-local", messages=messages, max_tokens=40
    )
    msg = out.choices[0].message.model_dump()
    ids, lps = msg["generation_token_ids"], msg["generation_log_probs"]
    # what the engine generated is what is kept: as many ids as it counted, a log-prob for each
    assert len(ids) == out.usage.completion_tokens == engine.tokens_predicted() - before  # type: ignore[union-attr]
    assert 0 < len(ids) <= 40 and len(lps) == len(ids) and all(lp <= 0 for lp in lps)
    # the prompt ids are the engine's own tokenization of its own chat template
    async with httpx.AsyncClient(base_url=engine.url) as eng:
        backend = engine.backend()
        assert msg["prompt_token_ids"] == await backend.dialect.tokenize(eng, {"messages": messages})
        ended = out.choices[0].finish_reason == "stop"  # on the end token: in the ids, not in the text
        assert msg["content"] == await backend.dialect.detokenize(eng, ids[:-1] if ended else ids)
    done = [e for e in await events(erig.log, "r1") if isinstance(e, ModelCallCompleted)]
    record = await call_store(erig.tokens, erig.tokens.get, done[0].receipt)
    assert (record.output_ids, record.logprobs) == (ids, lps)


async def test_a_call_that_ends_on_the_end_token_keeps_it_with_its_log_prob_and_says_nothing_of_it(
    erig: ModelRig, engine: Engine
) -> None:
    await erig.log.dispatch("r1", {}, instance="collector")
    (eos,) = engine.no_eos
    out = await sdk(erig, "r1").chat.completions.create(
        model="rollcut-local",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=5,
        logit_bias={eos: 100},
    )
    msg = out.choices[0].message.model_dump()
    assert msg["generation_token_ids"] == [int(eos)] and len(msg["generation_log_probs"]) == 1
    assert msg["content"] == "" and out.choices[0].finish_reason == "stop"


async def test_a_cut_keeps_the_streamed_tokens_stops_the_engine_request_and_the_call_goes_on(
    erig: ModelRig, engine: Engine
) -> None:
    await erig.log.dispatch("r1", {}, instance="collector")
    backend = erig.service.backend
    assert isinstance(backend, EngineBackend) and backend.can_cut
    call = asyncio.ensure_future(
        sdk(erig, "r1").chat.completions.create(
            model="rollcut-local",
            messages=[{"role": "user", "content": "a long one"}],
            max_tokens=1200,
            logit_bias=engine.no_eos,  # no end before the budget: a generation long enough to cut
        )
    )
    await until(lambda: erig.service.stats["tokens_generated"] >= 20, what="20 tokens streamed")
    res = await erig.coordinator.checkpoint(deadline_s=10)
    out = (await call).choices[0].message.model_dump()
    cuts = [e for e in await events(erig.log, "r1") if isinstance(e, ModelCallPrefixCut)]
    assert len(cuts) == 1 and cuts[0].token_boundary >= 20
    k = cuts[0].token_boundary
    prefix = await call_store(erig.tokens, erig.tokens.get, cuts[0].receipt)
    # the durable prefix is exactly the start of what the call returned, ids and log-probs
    assert out["generation_token_ids"][:k] == prefix.output_ids and len(prefix.output_ids) == k
    assert out["generation_log_probs"][:k] == prefix.logprobs
    assert len(out["generation_token_ids"]) == len(out["generation_log_probs"]) == 1200
    # the engine's request was stopped at the cut and the rest asked for anew, once
    assert backend.stats["engine_aborts"] == 1 and backend.stats["engine_requests"] == 2
    assert res.record.checkpoint_id


async def test_an_engine_that_cannot_take_a_token_prompt_leaves_a_running_call_excluded(
    log: EventLog, bus_config: BusConfig, tmp_path: Path, engine: Engine
) -> None:
    class TextOnly(LlamaCpp):
        capabilities = Capabilities(
            token_prompt=False, streamed_ids=True, counts_tokens=True, tokenize_route=True
        )

    backend = EngineBackend(httpx.AsyncClient(base_url=engine.url, timeout=None), TextOnly())
    assert not backend.can_cut and "prefix_cut" not in backend.dispositions
    async with rig_for(log, bus_config, tmp_path, backend) as rig:
        await log.dispatch("r1", {}, instance="collector")
        call = asyncio.ensure_future(
            sdk(rig, "r1").chat.completions.create(
                model="rollcut-local",
                messages=[{"role": "user", "content": "x"}],
                max_tokens=1200,
                logit_bias=engine.no_eos,
            )
        )
        await until(lambda: rig.service.stats["tokens_generated"] >= 20, what="20 tokens streamed")
        await rig.coordinator.checkpoint(deadline_s=10)
        await call
        kinds = [type(e) for e in await events(log, "r1")]
        assert ModelCallExcluded in kinds and ModelCallPrefixCut not in kinds  # never a false prefix


async def test_the_engine_killed_mid_call_fails_the_call_and_the_clients_retry_completes_it(
    erig: ModelRig, engine: Engine
) -> None:
    await erig.log.dispatch("r1", {}, instance="collector")
    call = asyncio.ensure_future(
        sdk(erig, "r1", retries=5).chat.completions.create(
            model="rollcut-local",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=1200,
            logit_bias=engine.no_eos,
        )
    )
    await until(lambda: erig.service.stats["tokens_generated"] >= 20, what="20 tokens streamed")
    engine.kill()  # SIGKILL mid-call
    await until(lambda: erig.service.stats["calls_failed"] == 1, what="the call recorded as failed")
    restart = threading.Thread(target=engine.start)  # the engine comes back on its port
    restart.start()
    out = await call  # the SDK retried the 503 after its Retry-After
    restart.join()
    assert len(out.choices[0].message.model_dump()["generation_token_ids"]) == 1200
    evs = await events(erig.log, "r1")
    failed = [e for e in evs if isinstance(e, ModelCallFailed)]
    done = [e for e in evs if isinstance(e, ModelCallCompleted)]
    assert len(failed) == 1 and "lost the engine" in failed[0].error
    assert [d.call_id for d in done] == [failed[0].call_id]  # the same call, failed then completed


async def test_an_engine_that_drops_token_ids_fails_the_call_with_its_reason(
    log: EventLog, bus_config: BusConfig, tmp_path: Path
) -> None:
    eng = Engine(tmp_path, ascii_only=False)  # its byte tokens do not all end a UTF-8 character
    if eng.server is None:
        pytest.skip("needs the tiny llama.cpp model: an external engine's vocabulary is its own")
    eng.start()
    try:
        async with rig_for(log, bus_config, tmp_path, eng.backend()) as rig:
            await log.dispatch("r1", {}, instance="collector")
            with pytest.raises(openai.APIStatusError) as err:
                await sdk(rig, "r1").chat.completions.create(
                    model="rollcut-local",
                    messages=[{"role": "user", "content": "x"}],
                    max_tokens=400,
                    logit_bias=eng.no_eos,
                )
            assert err.value.status_code == 502 and "dropped their ids" in str(err.value)
            kinds = [type(e) for e in await events(log, "r1")]
            assert ModelCallFailed in kinds and ModelCallCompleted not in kinds
    finally:
        eng.kill()
