"""What an agent loop is given for one attempt: the run context.

The Simple Agent runs one of two loops (chat completions, or NeMo Gym's
Responses API rows). A loop gets a :class:`RunContext` and nothing else: the
attempt's identity and where it starts (the lineage's last boundary at its cut),
the servers it talks to, and the three things it may do through the agent
(send a call, record a boundary, check for retirement). It never reaches into
the agent's private state, so the agent and its loops import one way only.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ..._tracing import CHAT_ATTRS, TOOL_ATTRS, SpanKind, of_attempt, span
from ...bus import AgentBoundaryRecord
from ..wire import REVISION_HEADER, ErrorKind, GymError, Identity

__all__ = ["AgentLoop", "RunContext", "Upstreams", "tool_output"]


@dataclass(frozen=True)
class Upstreams:
    """What every run of one agent talks to: the policy model, the resources servers by
    environment, the client that reaches them, and the system prompt it starts a chat with."""

    model_url: str
    resources: dict[str, str]
    http: httpx.AsyncClient
    system_prompt: str


@dataclass(frozen=True)
class RunContext:
    """One attempt's run, as a loop sees it."""

    ident: Identity
    start: AgentBoundaryRecord | None
    """The lineage's last boundary at the cut this attempt continues from; None from the input."""
    upstreams: Upstreams
    send: Callable[[str, dict[str, Any], dict[str, str] | None], Awaitable[httpx.Response]]
    """POST with identity (and a session's cookies), waiting out a checkpoint's closed admission;
    a refusal the rollout cannot continue past raises ``FreshDispatchNeeded``."""
    boundary: Callable[[AgentBoundaryRecord], Awaitable[None]]
    """A completed nonterminal turn: on the log, then parked there if a checkpoint asks."""
    check_retired: Callable[[], None]
    """Raises ``GymError(RETIRED)`` once the rollout was retired."""
    count: Callable[[str], None]
    """Adds one to one of the agent's counters."""

    @property
    def model_url(self) -> str:
        return self.upstreams.model_url

    @property
    def resources(self) -> dict[str, str]:
        return self.upstreams.resources

    @property
    def http(self) -> httpx.AsyncClient:
        return self.upstreams.http

    @property
    def system_prompt(self) -> str:
        return self.upstreams.system_prompt

    async def post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """:attr:`send`, its JSON answer."""
        answer: dict[str, Any] = (await self.send(url, body, None)).json()
        return answer

    async def chat(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """A model call (:meth:`post` to chat completions or responses), as a ``chat {model}`` client
        span with the usage and finish reasons the answer gives."""
        attrs = {**CHAT_ATTRS, "gen_ai.request.model": body.get("model"), **of_attempt(self.ident)}
        with span(f"chat {body['model']}" if body.get("model") else "chat", SpanKind.CLIENT, attrs) as s:
            out = await self.post(url, body)
            if s.is_recording():
                usage = out.get("usage") or {}
                reasons = [c.get("finish_reason") for c in out.get("choices") or []] or [out.get("status")]
                if not body.get("model") and out.get("model"):
                    s.update_name(f"chat {out['model']}")
                    s.set_attribute("gen_ai.request.model", str(out["model"]))
                s.set_attributes(
                    {
                        "gen_ai.response.model": str(out.get("model")),
                        "gen_ai.response.id": str(out.get("id")),
                        "gen_ai.response.finish_reasons": [str(r) for r in reasons],
                        "gen_ai.usage.input_tokens": int(
                            usage.get("prompt_tokens", usage.get("input_tokens", 0))
                        ),
                        "gen_ai.usage.output_tokens": int(
                            usage.get("completion_tokens", usage.get("output_tokens", 0))
                        ),
                    }
                )
            return out

    async def answer_tool(
        self,
        url: str,
        arguments: str | None,
        cookies: dict[str, str] | None = None,
        *,
        call_id: str | None = None,
    ) -> tuple[str, int | None]:
        """A model's tool call, its arguments as the model wrote them (JSON text): what the model
        reads back, and the session's revision if the server reported one. Arguments that are not
        JSON are answered to the model as an error, as a refused call is; nothing is sent."""
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return json.dumps({"error": f"Invalid tool call arguments: {exc!r}"}), None
        answer = await self.tool(url, args, cookies, call_id=call_id)
        return (answer, None) if isinstance(answer, str) else tool_output(answer)

    async def answer_tools(
        self,
        res_url: str,
        calls: list[tuple[str, str | None, str]],
        revisions: dict[str, int],
        env: str,
        cookies: dict[str, str] | None = None,
    ) -> list[tuple[str, str]]:
        """A turn's tool calls, ``(name, arguments, call_id)``, answered in order: each call's id and
        what the model reads back; ``revisions[env]`` moves to the newest revision the server
        reported (what the turn's boundary records)."""
        out = []
        for name, arguments, call_id in calls:
            answer, revision = await self.answer_tool(
                f"{res_url}/{name}", arguments, cookies, call_id=call_id
            )
            if revision is not None:
                revisions[env] = revision
            out.append((call_id, answer))
        return out

    async def tool(
        self,
        url: str,
        args: dict[str, Any],
        cookies: dict[str, str] | None = None,
        *,
        call_id: str | None = None,
    ) -> httpx.Response | str:
        """A tool call (an ``execute_tool {name}`` span): the resources server's answer, or, when it
        refused the call's arguments or name (a model's mistake, not the episode's end), the refusal
        as the model will read it."""
        name = url.rsplit("/", 1)[-1]
        attrs = {
            **TOOL_ATTRS,
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            **of_attempt(self.ident),
        }
        with span(f"execute_tool {name}", SpanKind.INTERNAL, attrs):
            try:
                return await self.send(url, args, cookies)
            except GymError as exc:
                if exc.kind not in (ErrorKind.BAD_REQUEST, ErrorKind.UNKNOWN_TOOL):
                    raise
                return json.dumps({"error": str(exc)})


AgentLoop = Callable[[RunContext, dict[str, Any]], Awaitable[dict[str, Any]]]
"""One way of running an attempt (chat completions, or the Responses API): the run's answer."""


def tool_output(resp: Any) -> tuple[str, int | None]:
    """What the model sees of a tool's answer, and the session revision if the server reports one.

    A rollcut resources server answers ``{result, revision, served_from_log}``: the model sees the
    result only, so a call answered from the log reads exactly as the original did."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and {"result", "revision"} <= body.keys():
        return json.dumps(body["result"]), int(body["revision"])
    revision = resp.headers.get(REVISION_HEADER)  # a Gym-shaped server: its own answer, as it is
    return resp.text, int(revision) if revision and revision.isdigit() else None
