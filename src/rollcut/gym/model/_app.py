"""The OpenAI-compatible HTTP surface Gym agents call.

Identity: ``X-Rollout-Id`` and ``X-Rollout-Attempt`` headers, or the path
prefix ``/r/{rollout_id}/{attempt}``. With checkpointing on, a request without
it is refused (400): a call that cannot be attributed cannot be recovered.
rollcut's own fields ride in a ``rollcut`` object (call id, receipt, whether
it was served from the log, the token ids) that OpenAI clients ignore.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from .._http import gym_app, identity_of
from ..wire import GymError, Identity, error_body
from ._local import decode, response_message
from ._service import CallResult, ModelService

__all__ = ["create_app"]


def _extension(result: CallResult) -> dict[str, Any]:
    return {
        "call_id": result.call_id,
        "receipt_id": result.receipt.receipt_id,
        "receipt_digest": result.receipt.digest,
        "served_from_log": result.served_from_log,
        "continued_from": result.continued_from,
        "prompt_token_ids": result.plan.prompt_ids,
        "output_token_ids": result.output_ids,
    }


def _chat_body(result: CallResult, body: dict[str, Any]) -> dict[str, Any]:
    msg = response_message(result.plan, result.output_ids)
    choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": result.plan.finish_reason}
    if body.get("logprobs"):
        choice["logprobs"] = {
            "content": [
                {"token": decode([t]), "logprob": lp}
                for t, lp in zip(result.output_ids, result.plan.logprobs, strict=False)
            ]
        }
    n_in, n_out = len(result.plan.prompt_ids), len(result.output_ids)
    return {
        "id": result.call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or "rollcut-local",
        "choices": [choice],
        "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
        "rollcut": _extension(result),
    }


def _responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """Map a /v1/responses request onto the chat shape the backend plans from."""
    items = body.get("input")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    for it in items if isinstance(items, list) else []:
        if it.get("type") == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": it.get("call_id"), "content": it.get("output")})
        elif it.get("type") == "function_call":
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
        else:
            messages.append({"role": it.get("role", "user"), "content": it.get("content")})
    tools = [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in body.get("tools") or []
        if t.get("type") == "function"
    ]
    out: dict[str, Any] = {"messages": messages, "tools": tools, "model": body.get("model")}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    return out


def create_app(service: ModelService, *, require_identity: bool = True) -> FastAPI:
    """The OpenAI-compatible FastAPI app over a model service."""
    app = gym_app("rollcut policy model")

    async def identified(
        request: Request, rollout_id: str | None, attempt: str | None
    ) -> tuple[Identity, dict[str, Any]]:
        body = await request.json()
        try:
            return identity_of(request, rollout_id, attempt), body
        except GymError:
            if require_identity:
                raise
            return Identity("anonymous", 1), body

    @app.post("/v1/chat/completions")
    @app.post("/r/{rollout_id}/{attempt}/v1/chat/completions")
    async def chat(request: Request, rollout_id: str | None = None, attempt: str | None = None) -> Any:
        ident, body = await identified(request, rollout_id, attempt)
        if body.get("stream"):
            return await _stream(service, ident, body)
        return JSONResponse(_chat_body(await service.call(ident, body), body))

    @app.post("/v1/responses")
    @app.post("/r/{rollout_id}/{attempt}/v1/responses")
    async def responses(request: Request, rollout_id: str | None = None, attempt: str | None = None) -> Any:
        ident, body = await identified(request, rollout_id, attempt)
        result = await service.call(ident, _responses_to_chat(body))
        msg = response_message(result.plan, result.output_ids)
        if msg.get("tool_calls"):
            output = [
                {
                    "type": "function_call",
                    "call_id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                }
                for c in msg["tool_calls"]
            ]
        else:
            output = [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": msg["content"]}],
                }
            ]
        n_in, n_out = len(result.plan.prompt_ids), len(result.output_ids)
        return JSONResponse(
            {
                "id": result.call_id,
                "object": "response",
                "status": "completed",
                "model": body.get("model") or "rollcut-local",
                "output": output,
                "usage": {"input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out},
                "rollcut": _extension(result),
            }
        )

    @app.get("/rollcut/stats")
    async def stats() -> dict[str, Any]:
        return {"instance": service.instance, **service.stats, "in_flight": len(service._inflight)}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> Any:
        from fastapi.responses import PlainTextResponse

        lines = [
            f'rollcut_model_{k}_total{{instance="{service.instance}"}} {v}' for k, v in service.stats.items()
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    return app


async def _stream(service: ModelService, ident: Identity, body: dict[str, Any]) -> Any:
    queue: asyncio.Queue[int | None] = asyncio.Queue()
    # content streams token by token when the plan is known to be text; otherwise it is held to the end
    hold = not service.backend.plans_ahead or bool((await service.backend.start(body)).tool_calls)

    async def on_token(tok: int) -> None:
        await queue.put(tok)

    task = asyncio.ensure_future(service.call(ident, body, on_token=on_token))  # custody runs to the end
    task.add_done_callback(lambda _: queue.put_nowait(None))
    first = asyncio.ensure_future(queue.get())
    await asyncio.wait([first, task], return_when=asyncio.FIRST_COMPLETED)
    if task.done() and task.exception() is not None and not first.done():
        first.cancel()
        exc = task.exception()
        assert exc is not None
        raise exc  # a GymError becomes its answer in the app's handler
    created, model = int(time.time()), body.get("model") or "rollcut-local"

    def chunk(call_id: str, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        payload = {
            "id": call_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **extra,
        }
        return f"data: {json.dumps(payload)}\n\n"

    async def events() -> AsyncIterator[str]:
        yield chunk("pending", {"role": "assistant"})
        tok = await first
        while tok is not None:
            if not hold:
                yield chunk("pending", {"content": decode([tok])})
            tok = await queue.get()
        try:
            result = await task  # the completed event is durable before the last chunk leaves
        except GymError as exc:
            yield f"data: {json.dumps(error_body(exc))}\n\n"
            return
        msg = response_message(result.plan, result.output_ids)
        if msg.get("tool_calls"):
            delta: dict[str, Any] = {
                "tool_calls": [dict(c, index=i) for i, c in enumerate(msg["tool_calls"])]
            }
        else:
            delta = {"content": msg["content"]} if hold else {}
        n_in, n_out = len(result.plan.prompt_ids), len(result.output_ids)
        yield chunk(
            result.call_id,
            delta,
            result.plan.finish_reason,
            usage={"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
            rollcut=_extension(result),
        )
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
