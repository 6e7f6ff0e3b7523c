"""The agent's HTTP surface: POST /run, one rollout attempt per call; NeMo Gym's agent routes
``/v1/responses`` (the loop alone, in a session the caller seeded) and ``/aggregate_metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from .._client import deep_health
from .._http import DEFAULT_MAX_BODY_BYTES, gym_app, identity_of, json_body, run_admitted, stats_routes
from ..resources import aggregate_metrics, verify_responses
from ..wire import ErrorKind, GymError
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

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        # NeMo Gym's agent route: the loop alone on a Responses request (the caller seeded the
        # session and verifies after), under the caller's attempt like /run
        params = await json_body(request)
        if not isinstance(params.get("input"), str | list):
            raise GymError(ErrorKind.BAD_REQUEST, "/v1/responses: input must be a string or a list of items")
        ident = identity_of(request, params)
        return await run_admitted(agent.participant, lambda: agent.responses(ident, params))

    @app.post("/aggregate_metrics")
    async def aggregate(request: Request) -> Any:
        # NeMo Gym's agent default: the same aggregation as its resources servers', computed here
        return aggregate_metrics(verify_responses(await json_body(request, empty_ok=True)))

    stats_routes(app, [agent.stats], lambda: {"instance": agent.instance, "running": len(agent._runs)})

    @app.get("/healthz")
    async def healthz() -> Any:
        return await deep_health(agent.http, [agent.model_url, *agent.resources.values()])

    return app
