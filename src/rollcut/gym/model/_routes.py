"""The model server's HTTP surface: OpenAI's ``/v1/chat/completions``, ``/v1/responses``,
``/v1/models``, and Anthropic's ``/v1/messages`` (``_messages``), one custody under all of them.

Bodies, stream chunks and stream events are OpenAI's own types (see
``_shapes``); errors are OpenAI's error shape with statuses the SDK maps
(409 for a stale attempt, 503 with ``Retry-After`` while a checkpoint holds
admission, which the SDK retries by itself).

Identity: rollcut's ``X-Rollout-*`` headers or ``/r/<rollout>/<attempt>``
prefix, or NeMo Gym's ``/ng-rollout/<id>[-a<n>]`` prefix (``gym/wire.py``).
With checkpointing on, a request without identity is refused (400): a call
that cannot be attributed cannot be recovered.

``return_token_ids``: every assistant message / output item carries
``prompt_token_ids``, ``generation_token_ids`` and ``generation_log_probs``,
read from the token store's record of the call, as NeMo Gym's vLLM model
server does with ``return_token_id_information``; a request's own
``return_token_ids`` (vLLM's name) overrides the server's switch either way.

Models: the server serves the names it was given (``--served-model-name``,
vLLM's flag; ``rollcut-local`` by default). A request naming another is a
404 ``model_not_found``, as OpenAI answers; a request naming none is served
by the first name, which every answer then reports.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..._metrics import Tally
from .._http import DEFAULT_MAX_BODY_BYTES, error_response, gym_app, identity_of, json_body, stats_routes
from ..wire import MESSAGES_ROUTE, ErrorKind, GymError, Identity, error_body
from ._answer import Answer, Tokens, refusal, sse
from ._logprobs import asks_logprobs, logprob_entries, refuse_without
from ._openai import UpstreamError, upstream_error
from ._plans import response_message
from ._requests import check_chat, check_responses, wants_training, without_training
from ._service import ModelService
from ._shapes import (
    DEFAULT_MODEL,
    chat_chunk,
    chat_completion,
    extension,
    model_entry,
    models_list,
    response_items,
    response_object,
    response_status,
    responses_input_to_chat,
)

__all__ = ["create_app"]


def create_app(
    service: ModelService,
    *,
    require_identity: bool = True,
    return_token_ids: bool = False,
    served_model_names: Sequence[str] = (DEFAULT_MODEL,),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The OpenAI-compatible FastAPI app over a model service, serving ``served_model_names``."""
    app = gym_app("rollcut policy model", max_body_bytes=max_body_bytes)
    served = tuple(served_model_names) or (DEFAULT_MODEL,)

    async def on_upstream(request: Request, exc: Exception) -> JSONResponse:
        # the call is recorded as failed; an engine that went away is waited for by the client's own
        # retry policy (the OpenAI SDK retries a 503 after Retry-After), a wrong answer is not retried
        assert isinstance(exc, UpstreamError)
        return error_response(upstream_error(exc), request.url.path)

    app.add_exception_handler(UpstreamError, on_upstream)

    def named(model: Any) -> str:
        """The served name a request asked for (the first when it names none), or a 404."""
        if model is None:
            return served[0]
        if model not in served:
            raise GymError(
                ErrorKind.MODEL_NOT_FOUND,
                f"The model `{model}` does not exist: this server serves {', '.join(served)}",
                param="model",
            )
        return str(model)

    async def identified(request: Request) -> tuple[Identity, dict[str, Any], Answer]:
        """Who calls, the request as the call is made of it (echoed token arrays dropped), and how
        the answer is shaped. The model stays as the request named it (or did not): the request's
        digest, and so the call's identity, is what it was before names were checked."""
        body = await json_body(request)
        answer = Answer(named(body.get("model")), wants_training(body, return_token_ids), service)
        body = without_training(body)
        try:
            return identity_of(request), body, answer
        except GymError as exc:
            if require_identity or exc.kind is not ErrorKind.MISSING_IDENTITY:
                raise
            return Identity("anonymous", 1), body, answer

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        ident, body, answer = await identified(request)
        check_chat(body)
        refuse_without(service.backend, body, "chat.completions")
        if body.get("stream"):
            return await _chat_stream(service, ident, body, answer)
        result = await service.call(ident, body)
        lps = await _entries(service, body, result.output_ids, result.plan.logprobs)
        return JSONResponse(chat_completion(result, await answer.training(result), answer.model, lps))

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        ident, body, answer = await identified(request)
        check_responses(body)
        chat_body = responses_input_to_chat(body)
        check_chat(chat_body)
        refuse_without(service.backend, body, "responses")
        if body.get("stream"):
            return await _responses_stream(service, ident, body, chat_body, answer)
        result = await service.call(ident, chat_body)
        lps = await _entries(service, body, result.output_ids, result.plan.logprobs)
        items = response_items(result, await answer.training(result), lps)
        usage = (len(result.plan.prompt_ids), len(result.output_ids))
        shaped = response_object(
            result.call_id, body, answer.model, items=items, status=response_status(result), usage=usage
        )
        return JSONResponse({**shaped, "rollcut": extension(result)})

    @app.post(MESSAGES_ROUTE)
    async def messages(request: Request) -> Any:
        # imported on the first Messages call: the ``anthropic`` SDK's types take 1.5 s to import,
        # and every model server (one per test stack, one per worker) would pay it at start
        from ._messages import messages_answer

        ident, body, answer = await identified(request)
        return await messages_answer(service, ident, body, answer)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return models_list(served)

    @app.get("/v1/models/{model:path}")
    async def model_by_name(model: str) -> dict[str, Any]:
        return model_entry(named(model))

    engine: Tally | None = getattr(service.backend, "stats", None)
    stats_routes(
        app,
        [service.stats, *([engine] if engine is not None else [])],
        lambda: {"instance": service.instance, "in_flight": len(service._inflight)},
    )

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def _entries(
    service: ModelService, body: dict[str, Any], ids: Sequence[int], logprobs: Sequence[float]
) -> list[dict[str, Any]] | None:
    """The log-prob entries of ``ids`` when the request asked for them (else None)."""
    return await logprob_entries(service.backend, ids, logprobs) if asks_logprobs(body) else None


async def _chat_stream(
    service: ModelService, ident: Identity, body: dict[str, Any], answer: Answer
) -> StreamingResponse:
    tokens = Tokens(service, ident, body)
    await tokens.started()
    _, call_id = service.call_identity(ident, body)
    created, model = int(time.time()), answer.model
    # content streams token by token when the plan is known to be text; tool calls come whole at the end
    hold = not service.backend.streams_text(body)
    with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    wants = asks_logprobs(body)  # once, not at every token

    async def events() -> AsyncIterator[str]:
        yield sse(chat_chunk(call_id, created, model, {"role": "assistant", "content": ""}))
        async for tok, text, lp in tokens:
            if not hold:
                lps = await logprob_entries(service.backend, [tok], [lp]) if wants else None
                yield sse(chat_chunk(call_id, created, model, {"content": text}, logprobs=lps))
        try:
            result = await tokens.task  # the completed event is durable before the last chunk leaves
        except (GymError, UpstreamError) as exc:
            yield sse(error_body(refusal(exc)))
            return
        msg = response_message(result.plan, result.output_ids)
        # sent whole at the end: a reply that may be a tool call, and one that streamed nothing (the
        # same call again, answered from what it produced)
        whole = hold or not tokens.came
        delta: dict[str, Any] = (
            {"tool_calls": msg["tool_calls"]}
            if msg.get("tool_calls")
            else ({"content": msg["content"]} if whole else {})
        )
        # a reply sent whole carries its tokens' log-probs there
        held = await _entries(service, body, result.output_ids, result.plan.logprobs) if whole else None
        final = chat_chunk(
            call_id,
            created,
            model,
            delta,
            result.plan.finish_reason,
            extra={"rollcut": extension(result)},
            logprobs=held if "content" in delta else None,
        )
        fields = await answer.training(result)
        if fields is not None:  # on the last delta, as they sit on the message of a plain completion
            final["choices"][0]["delta"].update(fields.fields())
        yield sse(final)
        if with_usage:
            usage = (len(result.plan.prompt_ids), len(result.output_ids))
            yield sse(chat_chunk(call_id, created, model, {}, usage=usage))
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def _responses_stream(
    service: ModelService, ident: Identity, body: dict[str, Any], chat_body: dict[str, Any], answer: Answer
) -> StreamingResponse:
    tokens = Tokens(service, ident, chat_body)
    await tokens.started()
    _, call_id = service.call_identity(ident, chat_body)
    created_at = time.time()
    hold = not service.backend.streams_text(chat_body)
    wants = asks_logprobs(body)  # once, not at every token
    seq = iter(range(1 << 30))
    msg_id = f"msg_{call_id}"

    def event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\n" + sse({"type": kind, "sequence_number": next(seq), **fields})

    def shell(
        status: str, items: list[dict[str, Any]], usage: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        return response_object(
            call_id, body, answer.model, items=items, status=status, usage=usage, created_at=created_at
        )

    async def events() -> AsyncIterator[str]:
        yield event("response.created", response=shell("in_progress", []))
        yield event("response.in_progress", response=shell("in_progress", []))
        if not hold:
            item = {
                "type": "message",
                "id": msg_id,
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.output_item.added", output_index=0, item=item)
            yield event(
                "response.content_part.added", item_id=msg_id, output_index=0, content_index=0, part=part
            )
            async for tok, text, lp in tokens:
                lps = await logprob_entries(service.backend, [tok], [lp]) if wants else []
                yield event(
                    "response.output_text.delta",
                    item_id=msg_id,
                    output_index=0,
                    content_index=0,
                    delta=text,
                    logprobs=[_delta_logprob(e) for e in lps],
                )
        else:
            async for _ in tokens:
                pass
        try:
            result = await tokens.task
        except (GymError, UpstreamError) as exc:
            err = refusal(exc)
            yield event("error", message=str(err), code=str(err.kind), param=None)
            return
        whole = await _entries(service, body, result.output_ids, result.plan.logprobs)
        items = response_items(result, await answer.training(result), whole)
        for index, done in enumerate(items):
            if done["type"] == "message":
                full = done["content"][0]
                at = {"item_id": done["id"], "output_index": index, "content_index": 0}
                lps = [_delta_logprob(e) for e in whole or []]
                if hold:
                    item = {**done, "status": "in_progress", "content": []}
                    yield event("response.output_item.added", output_index=index, item=item)
                    part = {**full, "text": "", "logprobs": []}
                    yield event("response.content_part.added", **at, part=part)
                if hold or not tokens.came:  # sent whole: held, or the same call answered from the log
                    yield event("response.output_text.delta", **at, delta=full["text"], logprobs=lps)
                yield event("response.output_text.done", **at, text=full["text"], logprobs=lps)
                yield event("response.content_part.done", **at, part=full)
            else:
                yield event(
                    "response.output_item.added",
                    output_index=index,
                    item={**done, "arguments": "", "status": "in_progress"},
                )
                yield event(
                    "response.function_call_arguments.delta",
                    item_id=done["id"],
                    output_index=index,
                    delta=done["arguments"],
                )
                yield event(
                    "response.function_call_arguments.done",
                    item_id=done["id"],
                    output_index=index,
                    arguments=done["arguments"],
                )
            yield event("response.output_item.done", output_index=index, item=done)
        usage = (len(result.plan.prompt_ids), len(result.output_ids))
        status = response_status(result)  # response.completed, or response.incomplete at the limit
        yield event(f"response.{status}", response=shell(status, items, usage))

    return StreamingResponse(events(), media_type="text/event-stream")


def _delta_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    """A stream event's log-prob: the entry without ``bytes`` (the events' type has none)."""
    return {"token": entry["token"], "logprob": entry["logprob"], "top_logprobs": []}
