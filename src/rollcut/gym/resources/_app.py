"""Gym resources routes: /seed_session, one route per tool, /verify, /close_session."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .._http import gym_app, identity_of
from ._service import ResourcesService

__all__ = ["create_resources_app"]


def create_resources_app(service: ResourcesService) -> FastAPI:
    """The resources FastAPI app: /seed_session, one route per tool, /verify, /close_session."""
    app = gym_app(f"rollcut resources: {service.env.name}")

    async def body_of(request: Request) -> dict[str, Any]:
        raw = await request.body()
        return (await request.json()) if raw else {}

    async def answer(request: Request, fn: Any, *args: Any) -> Any:
        ident = identity_of(request)
        return JSONResponse(await fn(ident, *args, await body_of(request)))

    @app.post("/seed_session")
    async def seed_session(request: Request) -> Any:
        return await answer(request, service.seed)

    @app.post("/verify")
    async def verify(request: Request) -> Any:
        return await answer(request, service.verify)

    @app.post("/close_session")
    async def close_session(request: Request) -> Any:
        return JSONResponse(await service.close(identity_of(request)))

    @app.get("/rollcut/stats")
    async def stats() -> dict[str, Any]:
        return {
            "instance": service.instance,
            "env": service.env.name,
            **service.stats,
            "sessions": len(service.sessions),
        }

    @app.get("/tools")
    async def tools() -> list[dict[str, Any]]:
        return service.env.tool_schemas()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/{tool}")
    async def tool(tool: str, request: Request) -> Any:
        return await answer(request, service.tool, tool)

    return app
