"""Anthropic's Messages API on the model server: ``POST /v1/messages``, plain and streamed.

NeMo Gym's model servers all serve it (``SimpleResponsesAPIModel.messages``,
mapped to and from Responses), so that Anthropic-native harnesses such as
Claude Code run against any backend; here it is one more way into the same
call: the request is mapped to the Responses input the other routes plan
from, the call runs under the same custody (admitted, token record durable,
completed, cut at a checkpoint, continued on restore, served from the log
on a retry), and the answer is built as the ``anthropic`` SDK's own types
and dumped from them, as the OpenAI routes are built from ``openai``'s.

The mapping (the facts are Anthropic's API reference and NeMo Gym's
``anthropic_converter.py``; docs/nemo-gym.md has the table):

- ``system`` (a string or text blocks) is the instructions; ``text`` blocks
  are message text; an assistant's ``tool_use`` block is a function call and
  a user's ``tool_result`` block its output (text content only);
  ``thinking`` and ``redacted_thinking`` blocks are dropped (no backend here
  reads reasoning back), every other block (images, documents, server tools)
  is refused, not dropped;
- ``max_tokens`` (required, at least 1) is the generation's budget,
  ``stop_sequences`` its stop strings, ``tools``/``tool_choice`` (``auto``,
  ``any``, ``tool``, ``none``) the function tools and how they are chosen;
- the answer's ``stop_reason`` is ``max_tokens`` for a generation cut by its
  budget, ``tool_use`` for one that called tools, else ``end_turn``;
- with token data on (``--return-token-ids``, or the request's
  ``return_token_ids``), the Message carries ``prompt_token_ids``,
  ``generation_token_ids`` and ``generation_log_probs`` as the other routes
  do (on ``message_delta`` when streamed), and rollcut's ``rollcut`` object.

A streamed answer is a real stream: text deltas leave as tokens come when the
plan is known to be text; tool calls come whole at the end, as on the chat
route. Refusals are Anthropic's error shape (``gym.wire.anthropic_error_body``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import msgspec
from anthropic.types import (
    Message,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStopEvent,
)
from fastapi.responses import JSONResponse, StreamingResponse
from msgspec import Meta

from ..wire import MESSAGES_ROUTE as ROUTE
from ..wire import ErrorKind, GymError, Identity, anthropic_error_body
from ._answer import Answer, Tokens, refusal
from ._openai import UpstreamError
from ._plans import response_message
from ._requests import check_chat, checked
from ._service import CallResult, ModelService
from ._shapes import Training, extension, responses_input_to_chat

__all__ = ["message_object", "messages_answer", "to_chat"]


class _Message(msgspec.Struct):
    # "system": a system message in the conversation (Claude Code sends one under its
    # mid-conversation-system beta); kept where it stands, as the chat shape's system message
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class _Tool(msgspec.Struct):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None


class _ToolChoice(msgspec.Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class _Request(msgspec.Struct):
    model: str
    max_tokens: Annotated[int, Meta(ge=1)]
    messages: list[_Message]
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoice | None = None
    metadata: dict[str, Any] | None = None


_DROPPED = frozenset({"thinking", "redacted_thinking"})


def _bad(message: str, kind: ErrorKind = ErrorKind.BAD_REQUEST) -> GymError:
    return GymError(kind, f"{ROUTE}: {message}")


def _text(content: Any, where: str) -> str:
    """A tool result's content as text: a string, or text blocks joined."""
    if isinstance(content, str):
        return content
    parts = []
    for i, block in enumerate(content if isinstance(content, list) else []):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else block
            raise _bad(f"{where}.content[{i}]: a {kind!r} block in a tool result", ErrorKind.UNSUPPORTED)
        parts.append(str(block.get("text", "")))
    return "\n".join(parts)


def _flusher(items: list[dict[str, Any]], text: list[str], role: str) -> Any:
    """What moves the text gathered so far into a message item (before a tool block, and at the end)."""

    def flush() -> None:
        if text:
            items.append({"type": "message", "role": role, "content": "".join(text)})
            text.clear()

    return flush


def _items(messages: list[_Message]) -> list[dict[str, Any]]:
    """The conversation as Responses input items, in block order: text gathers into a message, a
    tool use is a function call, a tool result its output."""
    items: list[dict[str, Any]] = []
    for m, message in enumerate(messages):
        if isinstance(message.content, str):
            items.append({"type": "message", "role": message.role, "content": message.content})
            continue
        text: list[str] = []
        flush = _flusher(items, text, message.role)

        for b, block in enumerate(message.content):
            kind, where = block.get("type"), f"messages[{m}].content[{b}]"
            if kind == "text":
                text.append(str(block.get("text", "")))
            elif kind == "tool_use" and message.role == "assistant":
                flush()
                arguments = json.dumps(block.get("input") or {}, separators=(",", ":"))
                call_id, name = block.get("id"), block.get("name")
                if not isinstance(call_id, str) or not isinstance(name, str):
                    raise _bad(f"{where}: a tool_use block needs a string id and name")
                items.append(
                    {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
                )
            elif kind == "tool_result" and message.role == "user":
                flush()
                if not isinstance(block.get("tool_use_id"), str):
                    raise _bad(f"{where}: a tool_result block needs a string tool_use_id")
                output = _text(block.get("content", ""), where)
                items.append(
                    {"type": "function_call_output", "call_id": block["tool_use_id"], "output": output}
                )
            elif kind not in _DROPPED:
                raise _bad(
                    f"{where}: a {kind!r} block in a {message.role} message is not served here (text, "
                    "tool_use, tool_result and thinking blocks are)",
                    ErrorKind.UNSUPPORTED,
                )
        flush()
    return items


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A checked Messages request as the chat shape the backend plans from (via Responses input,
    as NeMo Gym maps it), or a 400 in Anthropic's shape naming what is wrong."""
    req = checked(body, _Request, ROUTE)
    system = req.system
    if isinstance(system, list):
        system = "\n".join(str(b.get("text", "")) for b in system if b.get("type") == "text")
    responses: dict[str, Any] = {"input": _items(req.messages), "max_output_tokens": req.max_tokens}
    if system:
        responses["instructions"] = system
    responses["tools"] = [
        {"type": "function", "name": t.name, "description": t.description, "parameters": t.input_schema}
        for t in req.tools or []
    ]
    choice = req.tool_choice
    if choice is not None:
        if choice.type == "tool" and not choice.name:
            raise _bad("tool_choice of type 'tool' needs a name")
        modes = {"auto": "auto", "any": "required", "none": "none"}
        responses["tool_choice"] = (
            {"type": "function", "name": choice.name} if choice.type == "tool" else modes[choice.type]
        )
        if choice.disable_parallel_tool_use:
            responses["parallel_tool_calls"] = False
    for key in ("model", "temperature", "top_p"):
        if body.get(key) is not None:
            responses[key] = body[key]
    chat = responses_input_to_chat(responses)
    if req.stop_sequences:
        chat["stop"] = list(req.stop_sequences)
    if req.top_k is not None:
        chat["top_k"] = req.top_k
    check_chat(chat)
    return chat


def _blocks(result: CallResult) -> tuple[list[dict[str, Any]], str]:
    """The answer's content blocks and its stop reason (``stop_sequence`` when a stop string the
    backend names ended it)."""
    msg = response_message(result.plan, result.output_ids)
    blocks: list[dict[str, Any]] = []
    calls = msg.get("tool_calls") or []
    if msg.get("content") or not calls:
        blocks.append({"type": "text", "text": msg.get("content") or ""})
    for call in calls:
        try:
            given = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            given = None
        # Anthropic's tool input is an object; a model's arguments that are not one are kept whole
        tool_input = given if isinstance(given, dict) else {"arguments": call["function"]["arguments"]}
        blocks.append(
            {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": tool_input}
        )
    reason = "max_tokens" if result.plan.finish_reason == "length" else "tool_use" if calls else "end_turn"
    if reason == "end_turn" and result.plan.stop_sequence is not None:
        reason = "stop_sequence"
    return blocks, reason


def _stopped_by(reason: str, result: CallResult) -> str | None:
    return result.plan.stop_sequence if reason == "stop_sequence" else None


def _extras(result: CallResult, training: Training | None) -> dict[str, Any]:
    return {**(training.fields() if training is not None else {}), "rollcut": extension(result)}


def _dump(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = model.model_dump(mode="json", exclude_none=True)
    return out


def message_object(result: CallResult, model: str, training: Training | None) -> dict[str, Any]:
    """The ``Message`` of a finished call, as the ``anthropic`` SDK's own type."""
    blocks, reason = _blocks(result)
    message = Message.model_validate(
        {
            "id": f"msg_{result.call_id}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": reason,
            "stop_sequence": _stopped_by(reason, result),
            "usage": {"input_tokens": len(result.plan.prompt_ids), "output_tokens": len(result.output_ids)},
        }
    )
    return {**_dump(message), **_extras(result, training)}


async def messages_answer(
    service: ModelService, ident: Identity, body: dict[str, Any], answer: Answer
) -> JSONResponse | StreamingResponse:
    """``POST /v1/messages``: the call under custody, answered as a Message or its event stream."""
    chat = to_chat(body)
    if body.get("stream"):
        return await _stream(service, ident, chat, answer)
    result = await service.call(ident, chat)
    return JSONResponse(message_object(result, answer.model, await answer.training(result)))


def _event(model: Any) -> str:
    data = _dump(model)
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n"


async def _stream(
    service: ModelService, ident: Identity, chat: dict[str, Any], answer: Answer
) -> StreamingResponse:
    tokens = Tokens(service, ident, chat)
    await tokens.started()  # a call refused before it ran is an error answer, not a stream
    _, call_id = service.call_identity(ident, chat)
    hold = not service.backend.streams_text(chat)

    async def events() -> AsyncIterator[str]:
        shell = Message.model_validate(
            {
                "id": f"msg_{call_id}",
                "type": "message",
                "role": "assistant",
                "model": answer.model,
                "content": [],
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }
        )
        yield _event(RawMessageStartEvent(type="message_start", message=shell))
        index = 0
        if not hold:
            start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            yield _event(RawContentBlockStartEvent.model_validate(start))
        async for _, text, _ in tokens:
            if not hold:
                delta = {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                }
                yield _event(RawContentBlockDeltaEvent.model_validate(delta))
        try:
            result = await tokens.task  # the completed event is durable before the last event leaves
        except (GymError, UpstreamError) as exc:
            yield "event: error\ndata: " + json.dumps(anthropic_error_body(refusal(exc))) + "\n\n"
            return
        blocks, reason = _blocks(result)
        if not hold:
            said = "".join(b["text"] for b in blocks if b["type"] == "text")
            if not tokens.came and said:  # the same call again, answered from the log: its text whole
                delta = {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": said},
                }
                yield _event(RawContentBlockDeltaEvent.model_validate(delta))
            yield _event(RawContentBlockStopEvent(type="content_block_stop", index=0))
            blocks, index = [b for b in blocks if b["type"] != "text"], 1
        for block in blocks:
            whole = block["type"] == "text"
            empty = block if whole else {**block, "input": {}}
            start = {
                "type": "content_block_start",
                "index": index,
                "content_block": {**empty, "text": ""} if whole else empty,
            }
            yield _event(RawContentBlockStartEvent.model_validate(start))
            piece = (
                {"type": "text_delta", "text": block["text"]}
                if whole
                else {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            )
            delta = {"type": "content_block_delta", "index": index, "delta": piece}
            yield _event(RawContentBlockDeltaEvent.model_validate(delta))
            yield _event(RawContentBlockStopEvent(type="content_block_stop", index=index))
            index += 1
        end = RawMessageDeltaEvent.model_validate(
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": _stopped_by(reason, result)},
                "usage": {
                    "input_tokens": len(result.plan.prompt_ids),
                    "output_tokens": len(result.output_ids),
                },
            }
        )
        data = {**_dump(end), **_extras(result, await answer.training(result))}
        yield f"event: message_delta\ndata: {json.dumps(data)}\n\n"
        yield _event(RawMessageStopEvent(type="message_stop"))

    return StreamingResponse(events(), media_type="text/event-stream")
