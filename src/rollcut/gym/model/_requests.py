"""What the model server reads from a request, checked before anything runs.

Only the fields the server (and its backends) read are typed; any other
OpenAI field passes through untouched. A body of the wrong shape is a 400
``bad_request`` naming the field (``$.messages[0].role``), never a crash in a
backend halfway through a call.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..wire import ErrorKind, GymError

__all__ = ["check_chat", "check_responses"]


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    function: _Function
    id: str | None = None
    type: str = "function"


class _Part(msgspec.Struct):
    type: str | None = None
    text: str | None = None


class _Message(msgspec.Struct):
    role: str
    content: str | list[_Part | str] | None = None
    tool_calls: list[_ToolCall] | None = None


class _Parameters(msgspec.Struct):
    properties: dict[str, dict[str, Any]] | None = None


class _FunctionDef(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: _Parameters | None = None


class _Tool(msgspec.Struct):
    function: _FunctionDef
    type: str = "function"


class _NamedFunction(msgspec.Struct):
    name: str


class _ToolChoice(msgspec.Struct):
    type: str
    function: _NamedFunction | None = None
    name: str | None = None


class _JsonSchema(msgspec.Struct):
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class _ResponseFormat(msgspec.Struct):
    type: str
    json_schema: _JsonSchema | None = None


class _TextFormat(msgspec.Struct):
    type: str
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class _Text(msgspec.Struct):
    format: _TextFormat | None = None


class _StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class _Chat(msgspec.Struct):
    messages: list[_Message]
    tools: list[_Tool] | None = None
    model: str | None = None
    stream: bool | None = None
    stream_options: _StreamOptions | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    seed: int | None = None
    logprobs: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    tool_choice: Literal["none", "auto", "required"] | _ToolChoice | None = None
    response_format: _ResponseFormat | None = None


class _Responses(msgspec.Struct):
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    model: str | None = None
    stream: bool | None = None
    max_output_tokens: int | None = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    parallel_tool_calls: bool | None = None
    tool_choice: Literal["none", "auto", "required"] | _ToolChoice | None = None
    text: _Text | None = None


def _check(body: dict[str, Any], shape: type[msgspec.Struct], route: str) -> None:
    try:
        msgspec.convert(body, shape)
    except msgspec.ValidationError as exc:
        raise GymError(ErrorKind.BAD_REQUEST, f"{route}: {exc}") from exc


def check_chat(body: dict[str, Any]) -> None:
    """A ``/v1/chat/completions`` body the server can run, or a 400 naming what is wrong."""
    _check(body, _Chat, "/v1/chat/completions")
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        declared = {(t.get("function") or {}).get("name") for t in body.get("tools") or []}
        if name not in declared:
            raise GymError(
                ErrorKind.BAD_REQUEST,
                f"/v1/chat/completions: tool_choice names {name!r}, which is not among the tools",
            )


def check_responses(body: dict[str, Any]) -> None:
    """A ``/v1/responses`` body the server can run, or a 400 naming what is wrong."""
    _check(body, _Responses, "/v1/responses")
