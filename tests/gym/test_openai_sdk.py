"""The model server speaks OpenAI exactly: the official ``openai`` SDK drives it over HTTP and parses
every body, chunk, event and error into its own types."""

from __future__ import annotations

import json
import time
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from rollcut.bus import ModelCallCompleted

from .conftest import TOOLS, ModelRig, client

RESPONSES_TOOLS = [{"type": "function", "name": "add", "parameters": TOOLS[0]["function"]["parameters"]}]


async def test_chat_completion_parses_and_carries_the_stored_tokens(rig: ModelRig, base_url: str) -> None:
    await rig.log.dispatch("r1", {"q": 1}, instance="collector")
    out = await client(base_url, "r1").chat.completions.create(
        model="rollcut-local", messages=[{"role": "user", "content": "hello"}], logprobs=True
    )
    assert (
        isinstance(out, ChatCompletion) and out.object == "chat.completion" and out.model == "rollcut-local"
    )
    msg = out.choices[0].message
    assert msg.role == "assistant" and msg.content and out.choices[0].finish_reason == "stop"
    assert out.usage is not None and out.usage.completion_tokens == len(msg.generation_token_ids)  # type: ignore[attr-defined]
    [stored] = [
        s.event async for s in rig.log.read(rollout_id="r1") if isinstance(s.event, ModelCallCompleted)
    ]
    record = rig.tokens.get(stored.receipt)
    assert msg.prompt_token_ids == record.prompt_ids  # type: ignore[attr-defined]
    assert msg.generation_token_ids == record.output_ids  # type: ignore[attr-defined]
    assert msg.generation_log_probs == record.logprobs  # type: ignore[attr-defined]
    assert out.choices[0].logprobs is not None and len(out.choices[0].logprobs.content or []) == len(
        record.output_ids
    )


async def test_chat_tool_call_and_tool_result_round_trip(rig: ModelRig, base_url: str) -> None:
    await rig.log.dispatch("r2", {"q": 2}, instance="collector")
    c = client(base_url, "r2")
    messages: list[Any] = [{"role": "user", "content": "add something"}]
    first = await c.chat.completions.create(model="rollcut-local", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    [call] = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls" and call.type == "function"
    assert call.function.name == "add" and isinstance(json.loads(call.function.arguments), dict)
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": json.dumps({"total": 3})}]
    second = await c.chat.completions.create(model="rollcut-local", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert second.choices[0].message.tool_calls or second.choices[0].message.content


async def test_chat_stream_parses_chunk_by_chunk_to_the_same_text(rig: ModelRig, base_url: str) -> None:
    await rig.log.dispatch("r3", {"q": 3}, instance="collector")
    c = client(base_url, "r3")
    body: dict[str, Any] = {
        "model": "rollcut-local",
        "messages": [{"role": "user", "content": "stream please"}],
    }
    stream = await c.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len({ch.id for ch in chunks}) == 1, "one id for the whole stream"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].usage is not None and not chunks[-1].choices
    again = await c.chat.completions.create(**body)  # the same call again: answered from the log
    assert again.choices[0].message.content == text and again.id == chunks[0].id


async def test_stop_and_max_tokens(rig: ModelRig, base_url: str) -> None:
    await rig.log.dispatch("r4", {"q": 4}, instance="collector")
    c = client(base_url, "r4")
    full = await c.chat.completions.create(model="rollcut-local", messages=[{"role": "user", "content": "x"}])
    text = full.choices[0].message.content or ""
    cut = await c.chat.completions.create(
        model="rollcut-local", messages=[{"role": "user", "content": "x"}], max_tokens=5
    )
    assert (
        cut.choices[0].finish_reason == "length"
        and cut.usage is not None
        and cut.usage.completion_tokens == 5
    )
    word = text.split()[2]
    stopped = await c.chat.completions.create(
        model="rollcut-local", messages=[{"role": "user", "content": "x"}], stop=[word]
    )
    assert stopped.choices[0].message.content == text[: text.find(word)]


async def test_responses_text_and_function_call_parse(rig: ModelRig, base_url: str) -> None:
    await rig.log.dispatch("r5", {"q": 5}, instance="collector")
    c = client(base_url, "r5")
    plain = await c.responses.create(model="rollcut-local", input="hello there")
    assert isinstance(plain, Response) and plain.status == "completed" and plain.output_text
    assert plain.usage is not None and plain.usage.output_tokens > 0
    assert plain.output[0].generation_token_ids  # type: ignore[union-attr]
    tooled = await c.responses.create(model="rollcut-local", input="use a tool", tools=RESPONSES_TOOLS)  # type: ignore[arg-type]
    [call] = [o for o in tooled.output if o.type == "function_call"]
    assert call.name == "add" and tooled.tools[0].name == "add"  # type: ignore[union-attr]
    follow = await c.responses.create(
        model="rollcut-local",
        input=[
            {"role": "user", "content": "use a tool"},
            call.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"total": 3})},
        ],
        tools=RESPONSES_TOOLS,  # type: ignore[arg-type]
    )
    assert follow.status == "completed" and follow.output


async def test_responses_stream_events_parse_and_end_in_the_completed_response(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("r6", {"q": 6}, instance="collector")
    c = client(base_url, "r6")
    stream = await c.responses.create(model="rollcut-local", input="stream it", stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and text == events[-1].response.output_text  # type: ignore[union-attr]
    tool_stream = await c.responses.create(
        model="rollcut-local", input="tool", tools=RESPONSES_TOOLS, stream=True
    )  # type: ignore[arg-type]
    tool_events = [e async for e in tool_stream]
    done = [e for e in tool_events if e.type == "response.function_call_arguments.done"]
    assert done and json.loads(done[0].arguments) is not None


async def test_models_route_lists_the_model(base_url: str) -> None:
    models = await AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused").models.list()
    assert [m.id for m in models.data] == ["rollcut-local"]


async def test_refusals_are_openai_errors_with_their_status(rig: ModelRig, base_url: str) -> None:
    await rig.log.dispatch("r7", {"q": 7}, instance="collector")
    await rig.log.supersede("r7", 1, instance="coordinator")
    with pytest.raises(openai.ConflictError) as stale:
        await client(base_url, "r7", attempt=1).chat.completions.create(
            model="rollcut-local", messages=[{"role": "user", "content": "late"}]
        )
    assert stale.value.code == "stale_attempt" and stale.value.status_code == 409
    with pytest.raises(openai.BadRequestError) as missing:
        await AsyncOpenAI(base_url=f"{base_url}/v1", api_key="u").chat.completions.create(
            model="rollcut-local", messages=[{"role": "user", "content": "who am I"}]
        )
    assert missing.value.code == "missing_identity"
    rig.participant.gate.close("ck-x", until=time.time() + 60)
    try:
        with pytest.raises(openai.InternalServerError) as closed:
            await client(base_url, "r7", attempt=2, max_retries=0).chat.completions.create(
                model="rollcut-local", messages=[{"role": "user", "content": "during a checkpoint"}]
            )
    finally:
        rig.participant.gate.open()
    assert closed.value.status_code == 503 and closed.value.code == "admission_closed"
    assert int(closed.value.response.headers["retry-after"]) >= 1
