"""The agent's HTTP surface: POST /run, one rollout attempt per call."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from .._http import (
    DEFAULT_MAX_BODY_BYTES,
    deep_health,
    gym_app,
    identity_of,
    json_body,
    run_admitted,
    stats_routes,
)
from ._simple import SimpleAgent

__all__ = ["create_agent_app"]


def create_agent_app(agent: SimpleAgent, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The agent's FastAPI app: POST /run, one rollout attempt per call."""
    app = gym_app("rollcut simple agent", max_body_bytes=max_body_bytes)

    @app.post("/run")
    async def run(request: Request) -> Any:
        task = await json_body(request)
        ident = identity_of(request, task)
        return await run_admitted(agent.participant, lambda: agent.run(ident, task))

    stats_routes(app, [agent.stats], lambda: {"instance": agent.instance, "running": len(agent._runs)})

    @app.get("/healthz")
    async def healthz() -> Any:
        return await deep_health(agent.http, [agent.model_url, *agent.resources.values()])

    return app
