"""Every route's shapes on every backend: chat, Responses and Messages (plain and streamed, tools,
structured outputs, log-probs, limits, stop strings, errors) through the official SDKs, against the
local backend and against a real engine (llama.cpp's server on the tiny model this suite writes),
so that a shape built for one backend cannot ship untested on another.

On the engine every call is greedy (``temperature`` 0): a stop string taken from one answer must
end the next answer to the same prompt at the same place. The local backend is deterministic by
construction and takes the same settings.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from rollcut.bus import BusConfig, EventLog, ModelCallCompleted
from rollcut.gym.model import LocalBackend, OpenAIBackend
from rollcut.gym.wire import Identity, ng_path_id

from ..engine import Engine
from .conftest import TOOLS, ModelRig, client, rig_for

GREEDY: dict[str, Any] = {"temperature": 0.0, "seed": 5}
ADD_NO_DESCRIPTION = {
    "name": "add",
    "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
}
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "word": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["n", "word"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One engine for the module's engine half (each test has its own namespace and token store)."""
    eng = Engine(tmp_path_factory.mktemp("engine")).start()
    try:
        yield eng
    finally:
        eng.kill()


@pytest.fixture(params=["local", "engine"])
async def rig(
    request: pytest.FixtureRequest, log: EventLog, bus_config: BusConfig, tmp_path: Path
) -> AsyncIterator[ModelRig]:
    """The model server over each backend in turn (``base_url`` serves this one over HTTP)."""
    if request.param == "local":
        backend: Any = LocalBackend(seed=7, token_delay_s=0.0)
    else:
        backend = request.getfixturevalue("tiny_engine").backend()
    async with rig_for(log, bus_config, tmp_path, backend) as r:
        yield r


def claude(base_url: str, rollout_id: str, attempt: int = 1) -> AsyncAnthropic:
    prefix = ng_path_id(Identity(rollout_id, attempt))
    return AsyncAnthropic(base_url=f"{base_url}/ng-rollout/{prefix}", api_key="unused", max_retries=0)


def _unique_stop(text: str) -> tuple[str, int]:
    """A three-character piece of ``text`` after its start whose first occurrence is where it is."""
    for i in range(1, len(text) - 3):
        piece = text[i : i + 3]
        if piece.strip() and text.find(piece) == i:
            return piece, i
    raise AssertionError(f"no stop string to take from {text!r}")


# --- log-probs ----------------------------------------------------------------------


async def test_chat_logprobs_name_each_generated_token_with_its_text_and_bytes(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("lp1", {}, instance="collector")
    body: dict[str, Any] = {
        "model": "rollcut-local",
        "messages": [{"role": "user", "content": "the agent and the tool"}],
        "max_tokens": 24,
        **GREEDY,
    }
    out = await client(base_url, "lp1").chat.completions.create(**body, logprobs=True)
    msg = out.choices[0].message
    ids, lps = msg.generation_token_ids, msg.generation_log_probs  # type: ignore[attr-defined]
    assert out.choices[0].logprobs is not None
    entries = out.choices[0].logprobs.content or []
    # one entry per generated token, its log-prob the one kept, its text the backend's own
    assert len(entries) == len(ids) == out.usage.completion_tokens > 0  # type: ignore[union-attr]
    assert [e.logprob for e in entries] == lps
    assert all(e.bytes is not None and bytes(e.bytes).decode("utf-8") == e.token for e in entries)
    assert "".join(e.token for e in entries) == msg.content  # an end token is no text
    # streamed: each content chunk carries its tokens' entries, the same as the plain answer's
    body["messages"] = [{"role": "user", "content": "the agent and the tool, streamed"}]
    plain = await client(base_url, "lp1").chat.completions.create(**body, logprobs=True)
    stream = await client(base_url, "lp1").chat.completions.create(**body, logprobs=True, stream=True)
    chunks = [c async for c in stream]
    streamed = [
        e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []
    ]
    assert plain.choices[0].logprobs is not None
    assert [(e.token, e.logprob) for e in streamed] == [
        (e.token, e.logprob) for e in plain.choices[0].logprobs.content or []
    ]
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == plain.choices[0].message.content
    )


async def test_responses_include_output_text_logprobs_plain_and_streamed(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("lp2", {}, instance="collector")
    c = client(base_url, "lp2")
    args: dict[str, Any] = {
        "model": "rollcut-local",
        "input": "the counter value",
        "max_output_tokens": 20,
        "include": ["message.output_text.logprobs"],
        **{k: v for k, v in GREEDY.items() if k != "seed"},
    }
    out = await c.responses.create(**args)
    [message] = [o for o in out.output if o.type == "message"]
    [text] = message.content  # type: ignore[union-attr]
    assert text.type == "output_text" and text.logprobs is not None
    assert len(text.logprobs) == out.usage.output_tokens > 0  # type: ignore[union-attr]
    assert "".join(lp.token for lp in text.logprobs) == text.text
    assert [lp.logprob for lp in text.logprobs] == message.generation_log_probs  # type: ignore[union-attr]
    events = [
        e async for e in await c.responses.create(**{**args, "input": "the counter, streamed"}, stream=True)
    ]
    deltas = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert deltas and [(d.token, d.logprob) for d in deltas] == [(d.token, d.logprob) for d in done.logprobs]
    # not asked: none given
    plain = await c.responses.create(**{k: v for k, v in args.items() if k != "include"})
    assert all(not t.logprobs for o in plain.output if o.type == "message" for t in o.content)  # type: ignore[union-attr]


async def test_a_backend_that_cannot_name_its_tokens_refuses_logprobs_in_openais_shape(
    log: EventLog, bus_config: BusConfig, tmp_path: Path
) -> None:
    """The ``openai`` proxy's upstream ids come back without text: asked for log-probs it refuses
    before anything is generated (nothing to reach: the upstream here does not exist)."""
    nowhere = OpenAIBackend(httpx.AsyncClient(base_url="http://127.0.0.1:9"))
    async with rig_for(log, bus_config, tmp_path, nowhere) as r:
        await r.log.dispatch("lp3", {}, instance="collector")
        sdk = AsyncOpenAI(base_url="http://model/v1", api_key="u", http_client=r.client, max_retries=0)
        hdrs = r.headers("lp3")
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(
                model="rollcut-local",
                messages=[{"role": "user", "content": "x"}],
                logprobs=True,
                extra_headers=hdrs,
            )
        assert refused.value.code == "unsupported" and "logprobs" in str(refused.value)
        with pytest.raises(openai.BadRequestError):
            await sdk.responses.create(
                model="rollcut-local", input="x", include=["message.output_text.logprobs"], extra_headers=hdrs
            )
        assert [
            s async for s in r.log.read(rollout_id="lp3") if isinstance(s.event, ModelCallCompleted)
        ] == []


# --- limits and stop strings -----------------------------------------------------------


async def test_a_response_at_its_token_limit_is_incomplete_plain_and_streamed(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("lim1", {}, instance="collector")
    c = client(base_url, "lim1")
    out = await c.responses.create(
        model="rollcut-local", input="say a lot", max_output_tokens=4, temperature=0
    )
    assert out.status == "incomplete" and out.incomplete_details is not None
    assert out.incomplete_details.reason == "max_output_tokens" and out.usage.output_tokens == 4  # type: ignore[union-attr]
    assert out.output[0].status == "incomplete"  # type: ignore[union-attr]
    events = [
        e
        async for e in await c.responses.create(
            model="rollcut-local",
            input="say a lot, streamed",
            max_output_tokens=4,
            temperature=0,
            stream=True,
        )
    ]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]
    roomy = await c.responses.create(
        model="rollcut-local", input="hello", max_output_tokens=400, temperature=0
    )
    assert roomy.status == "completed" and roomy.incomplete_details is None


async def test_a_message_stopped_by_a_stop_sequence_names_it_plain_streamed_and_served_again(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("stop1", {}, instance="collector")
    base: dict[str, Any] = {
        "model": "rollcut-local",
        "max_tokens": 40,
        "extra_body": {"temperature": 0.0},  # the SDK has no argument for it any more; the API has
        "messages": [{"role": "user", "content": "the agent, the tool"}],
    }
    first = await claude(base_url, "stop1").messages.create(**base)
    text = first.content[0].text  # type: ignore[union-attr]
    stop, at = _unique_stop(text)
    stopped = await claude(base_url, "stop1").messages.create(**base, stop_sequences=["zzzq", stop])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == text[:at]  # type: ignore[union-attr]
    again = await claude(base_url, "stop1").messages.create(**base, stop_sequences=["zzzq", stop])
    assert again.id == stopped.id and again.model_extra["rollcut"]["served_from_log"]  # type: ignore[index]
    assert (again.stop_reason, again.stop_sequence) == ("stop_sequence", stop)
    async with claude(base_url, "stop1").messages.stream(
        **{**base, "messages": [{"role": "user", "content": "the agent, the tool"}]}, stop_sequences=[stop]
    ) as s:
        final = await s.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    plain = await claude(base_url, "stop1").messages.create(**{**base, "max_tokens": 3})
    assert plain.stop_reason == "max_tokens" and plain.stop_sequence is None


# --- tools and structured outputs ----------------------------------------------------


async def test_tool_calls_on_every_route_parse_a_tool_without_a_description_included(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("tool1", {}, instance="collector")
    chat = await client(base_url, "tool1").chat.completions.create(
        model="rollcut-local",
        messages=[{"role": "user", "content": "add"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        max_tokens=200,
    )
    [call] = chat.choices[0].message.tool_calls or []
    assert chat.choices[0].finish_reason == "tool_calls" and call.function.name == "add"  # type: ignore[union-attr]
    assert isinstance(json.loads(call.function.arguments), dict)  # type: ignore[union-attr]
    msg = await claude(base_url, "tool1").messages.create(
        model="rollcut-local",
        max_tokens=200,
        messages=[{"role": "user", "content": "add, the Anthropic way"}],
        tools=[ADD_NO_DESCRIPTION],  # type: ignore[list-item]
        tool_choice={"type": "any"},
    )
    [use] = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and use.name == "add" and isinstance(use.input, dict)


async def test_structured_outputs_follow_their_schema_on_chat_and_responses(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("json1", {}, instance="collector")
    c = client(base_url, "json1")
    chat = await c.chat.completions.create(
        model="rollcut-local",
        messages=[{"role": "user", "content": "a number and a word"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "pick", "schema": SCHEMA, "strict": True},
        },
        max_tokens=80,
    )
    picked = json.loads(chat.choices[0].message.content or "")
    assert set(picked) == {"n", "word"} and isinstance(picked["n"], int) and picked["word"] in ("yes", "no")
    resp = await c.responses.create(
        model="rollcut-local",
        input="a number and a word, again",
        text={"format": {"type": "json_schema", "name": "pick", "schema": SCHEMA, "strict": True}},
        max_output_tokens=80,
    )
    again = json.loads(resp.output_text)
    assert set(again) == {"n", "word"} and again["word"] in ("yes", "no")


# --- errors -------------------------------------------------------------------------------


async def test_client_errors_are_4xx_in_each_apis_own_shape_and_store_nothing(
    rig: ModelRig, base_url: str
) -> None:
    await rig.log.dispatch("err1", {}, instance="collector")
    with pytest.raises(openai.NotFoundError) as unknown:
        await client(base_url, "err1").chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "x"}]
        )
    assert unknown.value.code == "model_not_found"
    with pytest.raises(anthropic.NotFoundError):
        await claude(base_url, "err1").messages.create(
            model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(anthropic.BadRequestError) as bad:
        await claude(base_url, "err1").messages.create(
            model="rollcut-local", max_tokens=0, messages=[{"role": "user", "content": "x"}]
        )
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    # a budget no engine has: refused as the request's fault, never a 5xx a client retries
    if not isinstance(rig.service.backend, LocalBackend):
        with pytest.raises(anthropic.BadRequestError) as budget:
            await claude(base_url, "err1").messages.create(
                model="rollcut-local",
                max_tokens=10**12,
                messages=[{"role": "user", "content": "x"}],
                timeout=60,  # the SDK refuses a budget this large without one
            )
        assert budget.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    # a prompt longer than any context this server's engine has
    huge = " ".join(["the agent"] * 40_000)
    if isinstance(rig.service.backend, LocalBackend):
        return  # the local backend has no context to overflow
    with pytest.raises(anthropic.BadRequestError) as long:
        await claude(base_url, "err1").messages.create(
            model="rollcut-local", max_tokens=5, messages=[{"role": "user", "content": huge}]
        )
    assert long.value.status_code == 400 and long.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as long_chat:
        await client(base_url, "err1").chat.completions.create(
            model="rollcut-local", messages=[{"role": "user", "content": huge}], max_tokens=5
        )
    assert long_chat.value.status_code == 400
    done = [s async for s in rig.log.read(rollout_id="err1") if isinstance(s.event, ModelCallCompleted)]
    assert done == []
