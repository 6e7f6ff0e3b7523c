"""OpenAI's bodies, built with OpenAI's own types.

Every answer of the model server is constructed as the official ``openai``
pydantic model (``ChatCompletion``, ``ChatCompletionChunk``, ``Response`` and
the Responses stream events) and dumped from it, so a body the SDK cannot
parse cannot leave the server. Two things ride on top, as OpenAI's models
allow extra fields:

- the training data NeMo Gym's vLLM model server adds when asked
  (``return_token_id_information``): ``prompt_token_ids``,
  ``generation_token_ids`` and ``generation_log_probs`` on the assistant
  message (chat) or on each output item (responses), read from the token
  store's record of the call;
- rollcut's own ``rollcut`` object (call id, receipt, whether it was served
  from the log), which OpenAI clients ignore.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import msgspec

from ..._hidden import aiohttp_hidden
from ...tokens import TokenRecord
from ._plans import response_message
from ._service import DEFAULT_MODEL, CallResult

with aiohttp_hidden():  # openai's aiohttp client is never used here (:mod:`rollcut._hidden`)
    from openai.types import CompletionUsage, Model
    from openai.types.chat import (
        ChatCompletion,
        ChatCompletionChunk,
        ChatCompletionMessage,
        ChatCompletionMessageFunctionToolCall,
    )
    from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
    from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
    from openai.types.chat.chat_completion_chunk import (
        ChoiceDelta,
        ChoiceDeltaToolCall,
        ChoiceDeltaToolCallFunction,
    )
    from openai.types.chat.chat_completion_chunk import ChoiceLogprobs as ChunkLogprobs
    from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob
    from openai.types.responses import (
        FunctionTool,
        Response,
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
        ResponseUsage,
    )
    from openai.types.responses.response import IncompleteDetails
    from openai.types.responses.response_output_text import Logprob as OutputLogprob
    from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

_L = TypeVar("_L", ChoiceLogprobs, ChunkLogprobs)

__all__ = [
    "DEFAULT_MODEL",
    "Training",
    "chat_chunk",
    "chat_completion",
    "extension",
    "model_entry",
    "models_list",
    "response_items",
    "response_object",
    "response_status",
]


@dataclass(frozen=True)
class Training:
    """A call's training data, as NeMo Gym's vLLM model server attaches it."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    policy_segments: list[dict[str, Any]]

    @classmethod
    def of(cls, record: TokenRecord) -> Training:
        """From the token store's record: a reused or continued call returns exactly what was stored."""
        segments = [msgspec.structs.asdict(s) for s in record.spans()]
        return cls(list(record.prompt_ids), list(record.output_ids), list(record.logprobs), segments)

    def fields(self) -> dict[str, Any]:
        """NeMo Gym's three fields, and rollcut's ``policy_segments`` (which policy version generated
        which stretch of the generation: ``{version, start, end, reprefilled}``)."""
        return {
            "prompt_token_ids": self.prompt_token_ids,
            "generation_token_ids": self.generation_token_ids,
            "generation_log_probs": self.generation_log_probs,
            "policy_segments": self.policy_segments,
        }


def extension(result: CallResult) -> dict[str, Any]:
    """rollcut's own fields on an answer: the call, its receipt, whether it came from the log."""
    return {
        "call_id": result.call_id,
        "receipt_id": result.receipt.receipt_id,
        "receipt_digest": result.receipt.digest,
        "receipt_count": result.receipt.count,
        "served_from_log": result.served_from_log,
        "continued_from": result.continued_from,
        "started_over": result.started_over,
    }


def _dump(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(mode="json", exclude_none=True)
    return out


def _message(result: CallResult) -> dict[str, Any]:
    msg: dict[str, Any] = response_message(result.plan, result.output_ids)
    return msg


def _usage(result: CallResult) -> tuple[int, int]:
    return len(result.plan.prompt_ids), len(result.output_ids)


# --- chat completions ----------------------------------------------------------------


def _logprobs(kind: type[_L], entries: list[dict[str, Any]] | None) -> _L | None:
    """A choice's ``logprobs`` as ``kind`` (a completion's or a chunk's: the same fields)."""
    if entries is None:
        return None
    return kind(content=[ChatCompletionTokenLogprob.model_validate(e) for e in entries])


def _with_bytes(entry: dict[str, Any]) -> dict[str, Any]:
    """A Responses log-prob, whose ``bytes`` may not be null: a token whose own bytes the backend
    cannot say is given the UTF-8 of the text it reports (what vLLM reports for every token)."""
    if entry["bytes"] is not None:
        return entry
    return {**entry, "bytes": list(str(entry["token"]).encode("utf-8"))}


def chat_completion(
    result: CallResult,
    training: Training | None,
    model: str = DEFAULT_MODEL,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ``ChatCompletion`` for a finished call, reporting the served name ``model``, with the
    ``logprobs`` entries (``_logprobs``) when the request asked for them."""
    msg = _message(result)
    n_in, n_out = _usage(result)
    completion = ChatCompletion(
        id=result.call_id,
        object="chat.completion",
        created=int(time.time()),
        model=model,
        choices=[
            Choice(
                index=0,
                finish_reason=result.plan.finish_reason,  # type: ignore[arg-type]
                logprobs=_logprobs(ChoiceLogprobs, logprobs),
                message=ChatCompletionMessage(
                    role="assistant",
                    content=msg.get("content"),
                    tool_calls=[
                        ChatCompletionMessageFunctionToolCall.model_validate(c)
                        for c in msg.get("tool_calls") or []
                    ]
                    or None,
                ),
            )
        ],
        usage=CompletionUsage(prompt_tokens=n_in, completion_tokens=n_out, total_tokens=n_in + n_out),
    )
    out = _dump(completion)
    if logprobs is not None:  # as dumped, but ``bytes: null`` kept where a token's bytes are unknown
        out["choices"][0]["logprobs"]["content"] = logprobs
    if training is not None:
        out["choices"][0]["message"].update(training.fields())
    out["rollcut"] = extension(result)
    return out


def chat_chunk(
    call_id: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish: str | None = None,
    usage: tuple[int, int] | None = None,
    extra: dict[str, Any] | None = None,
    logprobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One ``ChatCompletionChunk`` (``usage``: the final usage-only chunk, no choices; ``logprobs``:
    the entries of the tokens this chunk carries)."""
    chunk = ChatCompletionChunk(
        id=call_id,
        object="chat.completion.chunk",
        created=created,
        model=model,
        choices=[]
        if usage is not None
        else [
            ChunkChoice(
                index=0,
                delta=ChoiceDelta(
                    role=delta.get("role"),
                    content=delta.get("content"),
                    tool_calls=[
                        ChoiceDeltaToolCall(
                            index=i,
                            id=c["id"],
                            type="function",
                            function=ChoiceDeltaToolCallFunction(**c["function"]),
                        )
                        for i, c in enumerate(delta.get("tool_calls") or [])
                    ]
                    or None,
                ),
                finish_reason=finish,  # type: ignore[arg-type]
                logprobs=_logprobs(ChunkLogprobs, logprobs),
            )
        ],
        usage=CompletionUsage(prompt_tokens=usage[0], completion_tokens=usage[1], total_tokens=sum(usage))
        if usage is not None
        else None,
    )
    out = _dump(chunk)
    if logprobs is not None and out["choices"]:  # ``bytes: null`` kept, as in a plain completion
        out["choices"][0]["logprobs"]["content"] = logprobs
    if extra:
        out.update(extra)
    return out


def model_entry(name: str) -> dict[str, Any]:
    """``GET /v1/models/{name}``: one served model, as OpenAI's ``Model``."""
    return _dump(Model(id=name, created=0, object="model", owned_by="rollcut"))


def models_list(names: Sequence[str]) -> dict[str, Any]:
    """``GET /v1/models``: every name this server serves."""
    return {"object": "list", "data": [model_entry(n) for n in names]}


# --- responses --------------------------------------------------------------------------


def response_items(
    result: CallResult, training: Training | None, logprobs: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The output items of a finished call: one message (its text's ``logprobs`` when the request's
    ``include`` asked for them), or one item per function call."""
    msg = _message(result)
    items: list[Any]
    if msg.get("tool_calls"):
        items = [
            ResponseFunctionToolCall(
                type="function_call",
                id=f"fc_{c['id']}",
                call_id=c["id"],
                name=c["function"]["name"],
                arguments=c["function"]["arguments"],
                status="completed",
            )
            for c in msg["tool_calls"]
        ]
    else:
        items = [
            ResponseOutputMessage(
                type="message",
                id=f"msg_{result.call_id}",
                role="assistant",
                status=response_status(result),
                content=[
                    ResponseOutputText(
                        type="output_text",
                        text=msg.get("content") or "",
                        annotations=[],
                        logprobs=[]
                        if logprobs is None
                        else [OutputLogprob.model_validate(_with_bytes(e)) for e in logprobs],
                    )
                ],
            )
        ]
    out = [_dump(i) for i in items]
    if training is not None:
        for item in out:
            item.update(training.fields())
    return out


_TEXT_DEFAULT = {"format": {"type": "text"}}


def response_object(
    call_id: str,
    body: dict[str, Any],
    model: str = DEFAULT_MODEL,
    *,
    items: list[dict[str, Any]],
    status: str = "completed",
    usage: tuple[int, int] | None = None,
    created_at: float | None = None,
) -> dict[str, Any]:
    """The ``Response``: the request's settings echoed (OpenAI's defaults where it set none), the
    output items, the usage. ``store`` is always false: nothing here can be fetched back by id or
    continued from (``previous_response_id`` is refused), whatever the request asked."""
    tools = [
        FunctionTool(
            type="function",
            name=t["name"],
            description=t.get("description"),
            parameters=t.get("parameters"),
            strict=t.get("strict"),
        )
        for t in body.get("tools") or []
        if isinstance(t, dict) and t.get("type") == "function" and t.get("name")
    ]
    response = Response(
        id=call_id,
        object="response",
        created_at=created_at if created_at is not None else time.time(),
        model=model,
        status=status,  # type: ignore[arg-type]
        # a generation that hit max_output_tokens: OpenAI's only reason a text answer stops short
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
        output=[],
        parallel_tool_calls=bool(body.get("parallel_tool_calls", True)),
        tool_choice=body.get("tool_choice") or "auto",
        tools=tools,  # type: ignore[arg-type]
        instructions=body.get("instructions"),
        max_output_tokens=body.get("max_output_tokens"),
        temperature=body.get("temperature", 1.0),
        top_p=body.get("top_p", 1.0),
        metadata=body.get("metadata") or {},
        text=body.get("text") or _TEXT_DEFAULT,  # type: ignore[arg-type]
        top_logprobs=body.get("top_logprobs") or 0,
        truncation=body.get("truncation") or "disabled",
        background=False,
        reasoning=body.get("reasoning"),
        user=body.get("user"),
        max_tool_calls=body.get("max_tool_calls"),
        prompt_cache_key=body.get("prompt_cache_key"),
        safety_identifier=body.get("safety_identifier"),
        service_tier="default",
        completed_at=time.time() if status == "completed" else None,
        usage=ResponseUsage(
            input_tokens=usage[0],
            output_tokens=usage[1],
            total_tokens=sum(usage),
            input_tokens_details=InputTokensDetails.model_validate(
                {"cached_tokens": 0, "cache_write_tokens": 0}
            ),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        )
        if usage is not None
        else None,
    )
    out = _dump(response)
    out["output"] = items  # already dumped from their own types, with any training fields
    out["store"] = False  # OpenAI's field; the SDK's type has no attribute for it
    return out


def responses_input_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A ``/v1/responses`` request as the chat shape the backend plans from."""
    items = body.get("input")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    for it in items if isinstance(items, list) else []:
        if not isinstance(it, dict):
            continue
        kind = it.get("type")
        if kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": it.get("call_id"), "content": it.get("output")})
        elif kind == "function_call":
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": it.get("call_id"),
                            "type": "function",
                            "function": {"name": it.get("name"), "arguments": it.get("arguments")},
                        }
                    ],
                }
            )
        elif kind == "reasoning":
            continue
        else:
            messages.append({"role": it.get("role", "user"), "content": _text_of(it.get("content"))})
    tools = [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in body.get("tools") or []
        if isinstance(t, dict) and t.get("type") == "function"
    ]
    out: dict[str, Any] = {"messages": messages, "tools": tools, "model": body.get("model")}
    for key in ("max_output_tokens", "temperature", "top_p", "seed"):
        if body.get(key) is not None:
            out["max_tokens" if key == "max_output_tokens" else key] = body[key]
    choice = _chat_tool_choice(body.get("tool_choice"))
    if choice is not None:
        out["tool_choice"] = choice
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        out["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    return out


def _chat_tool_choice(choice: Any) -> Any:
    """A Responses ``tool_choice`` in the chat shape: the mode as it is, a named function as
    ``{"type": "function", "function": {"name": …}}``."""
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _text_of(content: Any) -> Any:
    """Responses content parts (``input_text``/``output_text``) as the chat shape's text."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content


def response_status(result: CallResult) -> Literal["completed", "incomplete"]:
    """``incomplete`` when the generation ran into its token limit, else ``completed``."""
    return "incomplete" if result.plan.finish_reason == "length" else "completed"
