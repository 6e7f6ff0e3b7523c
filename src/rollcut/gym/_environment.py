"""The environment server: one /run per task, the episode as a framework sees it.

It drives the agent's /run (which seeds, loops, verifies and closes), then
records the episode's outcome as ``rollout.completed`` (result digest and
reward) before answering: the boundary between "the episode finished" and
"the framework accepted the result" (``result.accepted``, the collector's).
"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .._tracing import SpanKind, of_attempt, span
from ..bus import EventLog, RolloutCompleted, input_digest
from ._client import gym_client
from ._http import DEFAULT_MAX_BODY_BYTES, error_response, gym_app, identity_of, json_body, stats_routes
from ._stats import ENVIRONMENT_STATS, tally
from ._writes import append_or_refuse
from .wire import error_from_response, identity_headers

__all__ = ["create_environment_app"]


def create_environment_app(
    log: EventLog,
    *,
    instance: str,
    agent_url: str,
    http: httpx.AsyncClient | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The environment server's FastAPI app: POST /run drives the agent and records the completion."""
    app = gym_app("rollcut environment", max_body_bytes=max_body_bytes)
    client = http or gym_client(600)
    stats = tally(ENVIRONMENT_STATS)

    @app.post("/run")
    async def run(request: Request) -> Any:
        ident = identity_of(request)
        task = await json_body(request)
        stats.inc("episodes")
        with span("rollcut.episode", SpanKind.SERVER, of_attempt(ident)):  # collector -> here -> agent
            resp = await client.post(
                f"{agent_url.rstrip('/')}/run", json=task, headers=identity_headers(ident)
            )
        if resp.status_code != 200:  # the agent's refusal, passed on in the same shape
            return error_response(error_from_response(resp))
        result = resp.json()
        await append_or_refuse(  # a retired or superseded attempt's completion: 409, never a 500
            log,
            RolloutCompleted(
                component="environment",
                instance=instance,
                rollout_id=ident.rollout_id,
                attempt=ident.attempt,
                result_digest=input_digest(result),
                reward=float(result.get("reward") or 0.0),
            ),
        )
        stats.inc("completed")
        return JSONResponse({**result, "rollout_id": ident.rollout_id, "attempt": ident.attempt})

    stats_routes(app, [stats], lambda: {"instance": instance})

    @app.get("/healthz")
    async def healthz() -> Any:
        # deep: a framework waits on this after a crash, and an episode needs the agent (and what
        # the agent needs) up, not just this process
        try:
            down = (await client.get(f"{agent_url.rstrip('/')}/healthz", timeout=2)).status_code != 200
        except httpx.HTTPError:
            down = True
        if down:
            return JSONResponse({"status": "agent unavailable"}, status_code=503)
        return {"status": "ok"}

    return app
