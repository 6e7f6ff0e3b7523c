"""Clients nobody here wrote, against the model server over HTTP: LiteLLM (its ``openai/`` and
``hosted_vllm/`` providers) and LangChain's ``ChatOpenAI`` (chat completions and the Responses API,
tools bound). Each parses the answers as its own objects, and every call it made is in custody: a
completed call on the log whose token record is what the answer carried."""

from __future__ import annotations

import os
from typing import Any

import pytest

from rollcut.bus import ModelCallCompleted
from rollcut.gym.wire import Identity, ng_path_id

from .conftest import TOOLS, ModelRig

HELLO = [{"role": "user", "content": "hello"}]


def prefixed(base_url: str, rollout_id: str) -> str:
    return f"{base_url}/ng-rollout/{ng_path_id(Identity(rollout_id, 1))}/v1"


async def completed(rig: ModelRig, rollout_id: str) -> list[ModelCallCompleted]:
    return [
        s.event async for s in rig.log.read(rollout_id=rollout_id) if isinstance(s.event, ModelCallCompleted)
    ]


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm"])
async def test_litellm_calls_are_answered_and_in_custody(rig: ModelRig, base_url: str, provider: str) -> None:
    rid = f"litellm-{provider}"
    await rig.log.dispatch(rid, {"q": 1}, instance="collector")
    common: dict[str, Any] = {"api_base": prefixed(base_url, rid), "api_key": "unused"}
    # imported by the tests that use them, not at collection: every pytest worker collects every module
    # and LiteLLM alone costs seconds of CPU to import
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price list from GitHub
    import litellm

    plain = await litellm.acompletion(model=f"{provider}/rollcut-local", messages=HELLO, **common)
    assert plain.choices[0].message.content and plain.choices[0].finish_reason == "stop"
    tooled = await litellm.acompletion(
        model=f"{provider}/rollcut-local",
        messages=[{"role": "user", "content": "use a tool"}],
        tools=TOOLS,
        **common,
    )
    [call] = tooled.choices[0].message.tool_calls
    assert call.function.name == "add"
    done = await completed(rig, rid)
    assert len(done) == 2 and plain.id == done[0].call_id
    assert len(rig.tokens.get(done[0].receipt).output_ids) == plain.usage.completion_tokens


@pytest.mark.parametrize("responses", [False, True])
async def test_langchain_chat_openai_with_tools_bound(rig: ModelRig, base_url: str, responses: bool) -> None:
    rid = f"langchain-{'responses' if responses else 'chat'}"
    await rig.log.dispatch(rid, {"q": 1}, instance="collector")
    import langchain_openai  # at use: see the LiteLLM test

    model = langchain_openai.ChatOpenAI(
        model="rollcut-local", base_url=prefixed(base_url, rid), api_key="unused", use_responses_api=responses
    )
    plain = await model.ainvoke("hello")
    assert (
        plain.text
        and plain.response_metadata.get("model_name", plain.response_metadata.get("model")) == "rollcut-local"
    )
    tooled = await model.bind_tools([TOOLS[0]]).ainvoke("use a tool")
    assert [c["name"] for c in tooled.tool_calls] == ["add"]
    assert len(await completed(rig, rid)) == 2
    streamed = "".join([str(c.text) async for c in model.astream("stream it")])
    assert streamed
