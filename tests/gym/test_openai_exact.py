"""Where OpenAI is strict, the model server is too: each refusal is OpenAI's error as the official SDK
raises it (its class, ``type``, ``param`` and a ``code`` naming rollcut's kind), and nothing of a
refused request reaches the log. Where it answers, it answers as OpenAI does (a model by id, the
request's settings echoed on a Response), and token arrays a client echoes back never reach the prompt.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from rollcut.bus import ModelCallAdmitted, ModelCallCompleted
from rollcut.gym.wire import ErrorKind, GymError, error_body, error_from_response

from .conftest import ModelRig, client

HELLO = [{"role": "user", "content": "hello"}]
TRAINING_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "policy_segments")


async def _calls(rig: ModelRig, rollout_id: str) -> list[Any]:
    return [
        s.event
        async for s in rig.log.read(rollout_id=rollout_id)
        if isinstance(s.event, ModelCallAdmitted | ModelCallCompleted)
    ]


async def test_a_model_is_retrieved_by_id_and_an_unknown_one_is_model_not_found(base_url: str) -> None:
    sdk = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused")
    model = await sdk.models.retrieve("rollcut-local")
    assert model.id == "rollcut-local" and model.object == "model"
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk.models.retrieve("gpt-4o")
    assert missing.value.code == "model_not_found" and missing.value.type == "invalid_request_error"
    assert missing.value.param == "model"


async def test_a_call_naming_an_unknown_model_is_404_and_stores_nothing(rig: ModelRig, base_url: str) -> None:
    await rig.log.dispatch("u1", {"q": 1}, instance="collector")
    c = client(base_url, "u1")
    with pytest.raises(openai.NotFoundError) as chat:
        await c.chat.completions.create(model="gpt-4o", messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError) as responses:
        await c.responses.create(model="gpt-4o", input="hello")
    for err in (chat.value, responses.value):
        assert err.code == "model_not_found" and "gpt-4o" in err.message
    assert await _calls(rig, "u1") == []
    # naming none is the server's own model, and the answer says which
    named = await c.chat.completions.create(model="rollcut-local", messages=HELLO)  # type: ignore[arg-type]
    unnamed = await c.chat.completions.create(messages=HELLO, model=openai.omit)  # type: ignore[arg-type,call-overload]
    assert named.model == unnamed.model == "rollcut-local"


@pytest.mark.parametrize(
    ("settings", "param", "code"),
    [
        ({"n": 2}, "n", "unsupported"),
        ({"n": 0}, "n", "bad_request"),
        ({"max_tokens": -1}, "max_tokens", "bad_request"),
        ({"max_tokens": 0}, "max_tokens", "bad_request"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "bad_request"),
        ({"logprobs": True, "top_logprobs": 2}, "top_logprobs", "unsupported"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "bad_request"),
        ({"top_logprobs": 0}, "top_logprobs", "bad_request"),
    ],
)
async def test_chat_settings_rollcut_cannot_honour_are_refused_not_ignored(
    rig: ModelRig, base_url: str, settings: dict[str, Any], param: str, code: str
) -> None:
    await rig.log.dispatch("c1", {"q": 1}, instance="collector")
    with pytest.raises(openai.BadRequestError) as refused:
        await client(base_url, "c1").chat.completions.create(
            model="rollcut-local",
            messages=HELLO,  # type: ignore[arg-type]
            **settings,
        )
    err = refused.value
    assert (err.code, err.param, err.type) == (code, param, "invalid_request_error"), err.body
    assert await _calls(rig, "c1") == []


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({}, "input", "bad_request"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "bad_request"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "unsupported"),
        ({"input": "x", "background": True}, "background", "unsupported"),
        ({"input": "x", "top_logprobs": 3}, "top_logprobs", "unsupported"),
    ],
)
async def test_a_response_without_input_or_continued_from_a_stored_one_is_refused(
    rig: ModelRig, base_url: str, body: dict[str, Any], param: str, code: str
) -> None:
    await rig.log.dispatch("p1", {"q": 1}, instance="collector")
    with pytest.raises(openai.BadRequestError) as refused:
        await client(base_url, "p1").responses.create(model="rollcut-local", **body)
    assert (refused.value.code, refused.value.param) == (code, param), refused.value.body
    assert await _calls(rig, "p1") == []


async def test_a_response_echoes_the_request_settings_as_openai_does(rig: ModelRig, base_url: str) -> None:
    await rig.log.dispatch("e1", {"q": 1}, instance="collector")
    c = client(base_url, "e1")
    plain = await c.responses.create(model="rollcut-local", input="hello")
    assert plain.metadata == {} and plain.text is not None and plain.text.format.type == "text"
    assert plain.truncation == "disabled" and plain.top_logprobs == 0 and plain.background is False
    assert plain.model_extra is not None and plain.model_extra["store"] is False
    fmt = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": False}
    set_ = await c.responses.create(
        model="rollcut-local",
        input="hello again",
        metadata={"run": "7"},
        text={"format": fmt},  # type: ignore[typeddict-item]
        store=True,
        user="trainer",
    )
    assert set_.metadata == {"run": "7"} and set_.user == "trainer"
    assert set_.text is not None and set_.text.format.type == "json_schema"
    assert set_.model_extra is not None and set_.model_extra["store"] is False  # never stored here
    streamed = [e async for e in await c.responses.create(model="rollcut-local", input="s", stream=True)]
    done = streamed[-1].response  # type: ignore[union-attr]
    assert done.metadata == {} and done.text is not None and done.text.format.type == "text"


async def test_token_arrays_echoed_in_input_never_reach_the_prompt(rig: ModelRig, base_url: str) -> None:
    """The Agents SDK and LangChain copy earlier output items, token arrays and all, into the next
    request: the next call's prompt is what it is without them, and so is the call."""
    for rid in ("t-echo", "t-clean"):
        await rig.log.dispatch(rid, {"q": 1}, instance="collector")
    first = await client(base_url, "t-echo").responses.create(model="rollcut-local", input="hello")
    echoed = [item.model_dump(exclude_none=True) for item in first.output]
    assert "generation_token_ids" in echoed[0]  # what such a client copies
    clean = [
        {k: v for k, v in item.items() if not k.endswith(("_ids", "_probs", "_segments"))} for item in echoed
    ]
    follow = {"role": "user", "content": "and then?"}
    a = await client(base_url, "t-echo").responses.create(model="rollcut-local", input=[*echoed, follow])  # type: ignore[list-item]
    await client(base_url, "t-clean").responses.create(model="rollcut-local", input="hello")
    b = await client(base_url, "t-clean").responses.create(model="rollcut-local", input=[*clean, follow])  # type: ignore[list-item]
    assert a.output[0].prompt_token_ids == b.output[0].prompt_token_ids  # type: ignore[union-attr]
    [ca] = [e for e in await _calls(rig, "t-echo") if isinstance(e, ModelCallAdmitted)][1:]
    [cb] = [e for e in await _calls(rig, "t-clean") if isinstance(e, ModelCallAdmitted)][1:]
    assert ca.request_digest == cb.request_digest
    # chat: an assistant message carrying its token arrays is the same message without them
    chat = await client(base_url, "t-echo").chat.completions.create(model="rollcut-local", messages=HELLO)  # type: ignore[arg-type]
    message = chat.choices[0].message.model_dump(exclude_none=True)
    again = [*HELLO, message, follow]
    bare = [*HELLO, {k: v for k, v in message.items() if k not in TRAINING_FIELDS}, follow]
    x = await client(base_url, "t-echo").chat.completions.create(model="rollcut-local", messages=again)  # type: ignore[arg-type]
    y = await client(base_url, "t-clean").chat.completions.create(model="rollcut-local", messages=bare)  # type: ignore[arg-type]
    last = [
        [e for e in await _calls(rig, r) if isinstance(e, ModelCallAdmitted)][-1]
        for r in ("t-echo", "t-clean")
    ]
    assert last[0].request_digest == last[1].request_digest
    assert x.choices[0].message.prompt_token_ids == y.choices[0].message.prompt_token_ids  # type: ignore[attr-defined]


async def test_a_request_can_ask_for_no_token_arrays(rig: ModelRig, base_url: str) -> None:
    """A client that is not a trainer turns them off per request (the server's switch is on here)."""
    await rig.log.dispatch("n1", {"q": 1}, instance="collector")
    c = client(base_url, "n1")
    lean = await c.chat.completions.create(
        model="rollcut-local",
        messages=HELLO,  # type: ignore[arg-type]
        extra_body={"return_token_ids": False},
    )
    assert lean.choices[0].message.content and "generation_token_ids" not in (
        lean.choices[0].message.model_extra or {}
    )
    item = (
        await c.responses.create(model="rollcut-local", input="x", extra_body={"return_token_ids": False})
    ).output[0]
    assert "generation_token_ids" not in (item.model_extra or {})
    full = await c.chat.completions.create(model="rollcut-local", messages=HELLO)  # type: ignore[arg-type]
    assert "generation_token_ids" in (full.choices[0].message.model_extra or {})


def test_the_error_kind_is_the_code_and_an_older_server_s_type_still_reads() -> None:
    import httpx

    err = GymError(ErrorKind.STALE_ATTEMPT, "late", rollout_id="r", attempt=1)
    body = error_body(err)["error"]
    assert (body["type"], body["code"]) == ("invalid_request_error", "stale_attempt")
    assert error_body(GymError(ErrorKind.ENGINE_ERROR, "x"))["error"]["type"] == "server_error"
    assert error_body(GymError(ErrorKind.RUN_TOKEN, "x"))["error"]["type"] == "permission_error"
    new = httpx.Response(409, json=error_body(err))
    old = httpx.Response(409, json={"error": {"message": "late", "type": "stale_attempt", "code": None}})
    assert error_from_response(new).kind is error_from_response(old).kind is ErrorKind.STALE_ATTEMPT
