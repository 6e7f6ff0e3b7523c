"""What the model server reads from a request, checked before anything runs.

Only the fields the server (and its backends) read are typed; any other
OpenAI field passes through untouched. A body of the wrong shape is a 400
``bad_request`` naming the field (``$.messages[0].role``, and OpenAI's
``param``), never a crash in a backend halfway through a call. Limits are
OpenAI's (``max_tokens`` at least 1, ``n`` from 1 to 128, ``top_logprobs``
0-20); what is valid for OpenAI but not done here (``n`` above 1,
``top_logprobs``, a stored or continued response) is a 400 ``unsupported``
that says why, never an answer that silently does less.

Token arrays a trainer's client copied from earlier output into the next
request (``prompt_token_ids``, ``generation_token_ids``,
``generation_log_probs``, ``policy_segments`` on a message or input item)
are dropped by :func:`without_training` before the request is digested or
planned: they never reach the prompt, and a client that echoes them makes
the same call as one that does not.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta

from ..wire import ErrorKind, GymError

__all__ = [
    "TRAINING_FIELDS",
    "check_chat",
    "check_responses",
    "checked",
    "requested_limit",
    "wants_training",
    "without_training",
]

TRAINING_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "policy_segments")
"""The token fields an answer carries for a trainer; echoed back in a request, they are dropped."""

_Positive = Annotated[int, Meta(ge=1)]
_TopLogprobs = Annotated[int, Meta(ge=0, le=20)]


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


class _Asked(msgspec.Struct, kw_only=True):
    """What Chat Completions and Responses both take, the same way: the model, streaming, sampling,
    log-probs, token ids and the tool choice."""

    model: str | None = None
    stream: bool | None = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: _TopLogprobs | None = None
    return_token_ids: bool | None = None
    tool_choice: Literal["none", "auto", "required"] | _ToolChoice | None = None


class _Chat(_Asked, kw_only=True):
    messages: list[_Message]
    tools: list[_Tool] | None = None
    stream_options: _StreamOptions | None = None
    stop: str | list[str] | None = None
    max_tokens: _Positive | None = None
    max_completion_tokens: _Positive | None = None
    n: Annotated[int, Meta(ge=1, le=128)] | None = None
    logprobs: bool | None = None
    response_format: _ResponseFormat | None = None


class _Responses(_Asked, kw_only=True):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    max_output_tokens: _Positive | None = None
    metadata: dict[str, str] | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    parallel_tool_calls: bool | None = None
    text: _Text | None = None


_AT = re.compile(r"at `\$\.([A-Za-z_]+)")


_S = TypeVar("_S", bound=msgspec.Struct)


def checked(body: dict[str, Any], shape: type[_S], route: str) -> _S:
    """``body`` as ``shape``, or a 400 naming the field (``param``: the top-level one at fault)."""
    try:
        return msgspec.convert(body, shape)
    except msgspec.ValidationError as exc:
        at = _AT.search(str(exc))
        missing = re.search(r"missing required field `([A-Za-z_]+)`", str(exc))
        param = at[1] if at else missing[1] if missing else None
        raise GymError(ErrorKind.BAD_REQUEST, f"{route}: {exc}", param=param) from exc


def _unsupported(route: str, param: str, why: str) -> GymError:
    return GymError(ErrorKind.UNSUPPORTED, f"{route}: {param}: {why}", param=param)


def check_chat(body: dict[str, Any]) -> None:
    """A ``/v1/chat/completions`` body the server can run, or a 400 naming what is wrong."""
    route = "/v1/chat/completions"
    checked(body, _Chat, route)
    if (body.get("n") or 1) > 1:
        raise _unsupported(
            route,
            "n",
            f"{body['n']} choices asked; every choice is its own recorded call here, so send "
            "n requests (each is custodied and restored on its own)",
        )
    if body.get("top_logprobs"):
        raise _unsupported(
            route,
            "top_logprobs",
            "the token store keeps each sampled token's log-prob, not the "
            "alternatives, so a call served again from the log could not answer it; use logprobs",
        )
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        raise GymError(
            ErrorKind.BAD_REQUEST, f"{route}: top_logprobs needs logprobs: true", param="top_logprobs"
        )
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        declared = {(t.get("function") or {}).get("name") for t in body.get("tools") or []}
        if name not in declared:
            raise GymError(
                ErrorKind.BAD_REQUEST,
                f"{route}: tool_choice names {name!r}, which is not among the tools",
                param="tool_choice",
            )


def check_responses(body: dict[str, Any]) -> None:
    """A ``/v1/responses`` body the server can run, or a 400 naming what is wrong.

    ``input`` is required: a response here is never continued from a stored one
    (``previous_response_id``, ``conversation``), since nothing is kept to
    continue from but the event log, whose unit is the attempt, not the response."""
    route = "/v1/responses"
    checked(body, _Responses, route)
    for param in ("previous_response_id", "conversation"):
        if body.get(param):
            raise _unsupported(
                route, param, "responses are not stored here; send the whole input (store: false)"
            )
    if body.get("background"):
        raise _unsupported(route, "background", "a response runs while its request waits")
    if body.get("top_logprobs"):
        raise _unsupported(
            route, "top_logprobs", "the token store keeps each sampled token's log-prob, not the alternatives"
        )


def requested_limit(body: dict[str, Any]) -> int | None:
    """The most tokens a checked request lets the call generate: ``max_tokens``, else
    ``max_completion_tokens``, else ``max_output_tokens`` (each at least 1 once checked); None if
    it sets none. One reading for every backend, so a 0 is never taken for "no limit"."""
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def wants_training(body: dict[str, Any], default: bool) -> bool:
    """Whether an answer carries the token arrays: the request's ``return_token_ids`` (vLLM's name for
    the same switch), else the server's ``--return-token-ids``."""
    asked = body.get("return_token_ids")
    return default if asked is None else bool(asked)


def _strip(item: Any) -> Any:
    if isinstance(item, dict) and any(k in item for k in TRAINING_FIELDS):
        return {k: v for k, v in item.items() if k not in TRAINING_FIELDS}
    return item


def without_training(body: dict[str, Any]) -> dict[str, Any]:
    """The request without token arrays echoed into its ``messages`` or ``input`` items, and without
    ``return_token_ids`` (how the answer is shaped is not what the call is)."""
    out = {k: v for k, v in body.items() if k != "return_token_ids"}
    for key in ("messages", "input"):
        if isinstance(out.get(key), list):
            out[key] = [_strip(item) for item in out[key]]
    return out
