"""Anthropic's Messages API on the model server, driven by the official ``anthropic`` SDK: its own
types parse every body and stream event (and its stream helper accumulates them), each call is in
custody as on the OpenAI routes, and each refusal is Anthropic's error as the SDK raises it."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import pytest
from anthropic import AsyncAnthropic
from anthropic.types import Message

from rollcut.bus import ModelCallAdmitted, ModelCallCompleted
from rollcut.gym.wire import Identity, ng_path_id

from .conftest import ModelRig

HELLO: list[Any] = [{"role": "user", "content": "hello"}]
ADD = {
    "name": "add",
    "description": "add n",
    "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
}


def claude(base_url: str, rollout_id: str, attempt: int = 1, **kw: Any) -> AsyncAnthropic:
    """An SDK client whose calls carry rollcut identity through NeMo Gym's path prefix (the SDK
    appends ``/v1/messages`` to the base URL, as Claude Code does to ``ANTHROPIC_BASE_URL``)."""
    prefix = ng_path_id(Identity(rollout_id, attempt))
    return AsyncAnthropic(base_url=f"{base_url}/ng-rollout/{prefix}", api_key="unused", **kw)


async def _stored(rig: ModelRig, rollout_id: str, kind: type) -> list[Any]:
    return [s.event async for s in rig.log.read(rollout_id=rollout_id) if isinstance(s.event, kind)]


async def test_a_message_parses_as_anthropic_s_own_type_and_carries_the_stored_tokens(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("a1", {"q": 1}, instance="collector")
    out = await claude(base_url, "a1").messages.create(
        model="rollcut-local", max_tokens=1000, system="Be brief.", messages=HELLO
    )
    assert isinstance(out, Message) and out.role == "assistant" and out.model == "rollcut-local"
    assert out.stop_reason == "end_turn" and out.content[0].type == "text" and out.content[0].text
    [done] = await _stored(rig, "a1", ModelCallCompleted)
    record = rig.tokens.get(done.receipt)
    extra = out.model_extra or {}
    assert (
        extra["generation_token_ids"] == record.output_ids and extra["prompt_token_ids"] == record.prompt_ids
    )
    assert out.usage.output_tokens == len(record.output_ids) and out.id == f"msg_{done.call_id}"
    # the same request again in the same attempt is the same call, answered from what it produced
    again = await claude(base_url, "a1").messages.create(
        model="rollcut-local", max_tokens=1000, system="Be brief.", messages=HELLO
    )
    assert again.id == out.id and again.content == out.content
    assert len(await _stored(rig, "a1", ModelCallCompleted)) == 1


async def test_a_system_message_mid_conversation_is_kept_where_it_stands(
    rig: ModelRig, base_url: str
) -> None:
    """Claude Code sends one (its mid-conversation-system beta): it is part of the prompt, in place."""
    await rig.log.dispatch("a6", {"q": 6}, instance="collector")
    turns: list[Any] = [*HELLO, {"role": "system", "content": "Agents available: none."}]
    with_it = await claude(base_url, "a6").messages.create(
        model="rollcut-local", max_tokens=1000, messages=turns
    )
    without = await claude(base_url, "a6").messages.create(
        model="rollcut-local", max_tokens=1000, messages=HELLO
    )
    extra = [m.model_extra or {} for m in (with_it, without)]
    assert len(extra[0]["prompt_token_ids"]) > len(extra[1]["prompt_token_ids"])


async def test_a_tool_use_round_trip_and_a_cut_by_max_tokens(rig: ModelRig, base_url: str) -> None:
    await rig.log.dispatch("a2", {"q": 2}, instance="collector")
    c = claude(base_url, "a2")
    first = await c.messages.create(
        model="rollcut-local",
        max_tokens=1000,
        messages=[{"role": "user", "content": "use a tool"}],
        tools=[ADD],  # type: ignore[list-item]
        tool_choice={"type": "any"},
    )
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and use.name == "add" and isinstance(use.input, dict)
    follow = await c.messages.create(
        model="rollcut-local",
        max_tokens=1000,
        messages=[
            {"role": "user", "content": "use a tool"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},  # type: ignore[misc]
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "3"}]},
        ],
        tools=[ADD],  # type: ignore[list-item]
    )
    assert follow.content and follow.stop_reason in ("tool_use", "end_turn")
    cut = await c.messages.create(
        model="rollcut-local", max_tokens=3, messages=[{"role": "user", "content": "long"}]
    )
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3


async def test_a_stream_is_anthropic_s_events_and_accumulates_to_the_stored_answer(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("a3", {"q": 3}, instance="collector")
    c = claude(base_url, "a3")
    async with c.messages.stream(model="rollcut-local", max_tokens=1000, messages=HELLO) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    plain = await claude(base_url, "a3").messages.create(
        model="rollcut-local", max_tokens=1000, messages=HELLO
    )
    assert [(b.type, b.text) for b in final.content] == [(b.type, b.text) for b in plain.content]  # type: ignore[union-attr]
    assert final.id == plain.id  # the stream's call, served again
    assert final.stop_reason == plain.stop_reason == "end_turn"
    assert final.usage.output_tokens == plain.usage.output_tokens
    tooled = c.messages.stream(
        model="rollcut-local",
        max_tokens=1000,
        messages=[{"role": "user", "content": "tool"}],
        tools=[ADD],  # type: ignore[list-item]
    )
    async with tooled as stream:
        message = await stream.get_final_message()
    assert message.stop_reason == "tool_use" and any(b.type == "tool_use" for b in message.content)


@pytest.mark.parametrize(
    ("change", "error", "kind"),
    [
        ({"model": "claude-sonnet-4-6"}, anthropic.NotFoundError, "not_found_error"),
        ({"max_tokens": 0}, anthropic.BadRequestError, "invalid_request_error"),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            anthropic.BadRequestError,
            "invalid_request_error",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                            }
                        ],
                    }
                ]
            },
            anthropic.BadRequestError,
            "invalid_request_error",
        ),
    ],
)
async def test_refusals_are_anthropic_s_errors_and_store_nothing(
    rig: ModelRig, base_url: str, change: dict[str, Any], error: type[Exception], kind: str
) -> None:
    await rig.log.dispatch("a4", {"q": 4}, instance="collector")
    body: dict[str, Any] = {"model": "rollcut-local", "max_tokens": 16, "messages": HELLO, **change}
    with pytest.raises(error) as refused:
        await claude(base_url, "a4").messages.create(**body)
    assert isinstance(refused.value, anthropic.APIStatusError)
    shape = refused.value.body
    assert isinstance(shape, dict) and shape["type"] == "error" and shape["error"]["type"] == kind, shape
    assert await _stored(rig, "a4", ModelCallAdmitted) == []


async def test_a_stale_attempt_and_a_checkpoint_are_refused_as_on_the_other_routes(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("a5", {"q": 5}, instance="collector")
    await rig.log.supersede("a5", 1, instance="coordinator")
    with pytest.raises(anthropic.ConflictError) as stale:
        await claude(base_url, "a5", max_retries=0).messages.create(
            model="rollcut-local", max_tokens=8, messages=HELLO
        )
    assert "stale_attempt" in stale.value.message
    rig.participant.gate.close("ck-m", until=time.time() + 60)
    try:
        with pytest.raises(anthropic.InternalServerError) as closed:
            await claude(base_url, "a5", attempt=2, max_retries=0).messages.create(
                model="rollcut-local", max_tokens=8, messages=HELLO
            )
    finally:
        rig.participant.gate.open()
    assert closed.value.status_code == 503 and closed.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert int(closed.value.response.headers["retry-after"]) >= 1
