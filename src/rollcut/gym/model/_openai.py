"""The ``openai`` backend: any OpenAI-compatible upstream (vLLM, SGLang, llama.cpp).

rollcut keeps custody; the upstream generates. It asks for log-probs, and for
token ids where the upstream can give them (vLLM's
``return_tokens_as_token_ids``: tokens come back as ``"token_id:123"``).
Without ids it stores the byte-level encoding of the text and says so in the
record's policy version suffix (``+bytes``).

It cannot cut a generation at a token boundary (an upstream holds its KV
cache and sampling state), so it declares only the dispositions it can give:
at a cut, a running call is ``excluded``, never a false prefix.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import httpx

from ..._errors import RollcutError
from ..wire import ErrorKind, GymError
from ._backend import Plan
from ._bytes import encode, render_prompt

if TYPE_CHECKING:
    from ...tokens import TokenRecord

__all__ = ["ENGINE_RETRY_AFTER_S", "OpenAIBackend", "UpstreamError", "upstream_error"]

CLIENT_ERRORS = frozenset({400, 413, 422})
"""An upstream's answers that refuse the request as it was asked (not a route or server fault)."""

ENGINE_RETRY_AFTER_S = 1.0
"""The Retry-After of an ``engine_unavailable`` answer: an engine restarts in seconds."""


class UpstreamError(RollcutError):
    """The upstream model server failed a call."""

    def __init__(self, message: str, *, lost: bool = False, client_error: bool = False) -> None:
        super().__init__(message)
        self.lost = lost  # it went away (the same call is safe to send again), not: it answered wrongly
        self.client_error = client_error  # it refused the request as asked (sending it again cannot help)


def upstream_error(exc: UpstreamError) -> GymError:
    """The answer for a call the engine failed: 503 and Retry-After when it went away; 400 when it
    refused the request itself (a 4xx: a prompt longer than its context, a limit it does not take),
    so a client's retry policy does not send it again; else 502."""
    if exc.lost:
        return GymError(ErrorKind.ENGINE_UNAVAILABLE, str(exc), retry_after_s=ENGINE_RETRY_AFTER_S)
    if exc.client_error:
        return GymError(ErrorKind.BAD_REQUEST, str(exc))
    return GymError(ErrorKind.ENGINE_ERROR, str(exc))


class OpenAIBackend:
    """Any OpenAI-compatible upstream generates; rollcut keeps custody (no cuts)."""

    name = "openai"
    can_cut = False
    plans_ahead = False
    dispositions: tuple[str, ...] = ("never_started", "completed", "failed", "excluded")

    def __init__(
        self, client: httpx.AsyncClient, *, model: str | None = None, policy_version: str = "upstream"
    ) -> None:
        self.client = client
        self.model = model
        self.policy_version = policy_version
        self.last_policy_version: str | None = None

    async def start(self, body: dict[str, Any]) -> Plan:
        req = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        req.update({"stream": False, "logprobs": True, "return_tokens_as_token_ids": True})
        if self.model:
            req["model"] = self.model
        try:
            resp = await self.client.post("/v1/chat/completions", json=req)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream unreachable: {exc!r}", lost=True) from exc
        if resp.status_code != 200:
            raise UpstreamError(
                f"upstream answered {resp.status_code}: {resp.text[:300]}",
                client_error=resp.status_code in CLIENT_ERRORS,
            )
        out = resp.json()
        choice = out["choices"][0]
        msg = choice.get("message") or {}
        content_lp = ((choice.get("logprobs") or {}).get("content")) or []
        ids: list[int] = []
        for item in content_lp:
            tok = str(item.get("token", ""))
            if not tok.startswith("token_id:"):
                ids = []
                break
            ids.append(int(tok.split(":", 1)[1]))
        version = self.policy_version
        if not ids:  # no ids from this upstream: keep a faithful, reversible stand-in
            ids = encode(msg.get("content") or "")
            version += "+bytes"
        logprobs = [float(i.get("logprob", 0.0)) for i in content_lp][: len(ids)]
        prompt_ids = out.get("prompt_token_ids") or encode(render_prompt(body.get("messages") or []))
        self.last_policy_version = version
        return Plan(
            prompt_ids=list(prompt_ids),
            output_ids=ids,
            logprobs=logprobs,
            finish_reason=choice.get("finish_reason") or "stop",
            text=msg.get("content"),
            tool_calls=msg.get("tool_calls") or [],
        )

    async def generate(self, plan: Plan, *, start: int = 0) -> AsyncGenerator[int, None]:
        for tok in plan.output_ids[start:]:
            yield tok

    async def adopt_prefix(self, plan: Plan, record: TokenRecord) -> bool:
        return False  # never continues a prefix: it never made one

    def streams_text(self, body: dict[str, Any]) -> bool:
        return False  # the upstream answers whole

    def piece(self, plan: Plan, index: int) -> str:
        return ""

    def interrupt(self, plan: Plan) -> None:
        """Never cuts, so never interrupts."""
