"""The agent's HTTP surface: POST /run, one rollout attempt per call."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .._http import DEFAULT_MAX_BODY_BYTES, gym_app, identity_of, json_body
from ._simple import SimpleAgent

__all__ = ["create_agent_app"]


def create_agent_app(agent: SimpleAgent, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The agent's FastAPI app: POST /run, one rollout attempt per call."""
    app = gym_app("rollcut simple agent", max_body_bytes=max_body_bytes)

    @app.post("/run")
    async def run(request: Request) -> Any:
        task = await json_body(request)
        ident = identity_of(request, task)
        if agent.participant is not None:
            async with agent.participant.gate.admit():
                return JSONResponse(await agent.run(ident, task))
        return JSONResponse(await agent.run(ident, task))

    @app.get("/rollcut/stats")
    async def stats() -> dict[str, Any]:
        return {"instance": agent.instance, **agent.stats, "running": len(agent._runs)}

    @app.get("/healthz")
    async def healthz() -> Any:
        # deep: the model server and every resources server this agent calls must answer
        urls = [agent.model_url, *agent.resources.values()]
        down = []
        for url in urls:
            try:
                if (await agent.http.get(f"{url.rstrip('/')}/healthz", timeout=2)).status_code != 200:
                    down.append(url)
            except httpx.HTTPError:
                down.append(url)
        if down:
            return JSONResponse({"status": "unavailable", "down": down}, status_code=503)
        return {"status": "ok"}

    return app
