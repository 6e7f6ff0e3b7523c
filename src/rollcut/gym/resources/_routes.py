"""Gym resources routes: ``/seed_session``, one route per tool, ``/verify``, ``/aggregate_metrics``.

Two contracts on the same routes, both always on:

- **rollcut's**: identity in the ``X-Rollout-*`` headers (or a path prefix) on
  every call; ``/seed_session`` takes the environment's seed arguments,
  ``/verify`` the task's expectation plus ``answer``, and ``/close_session``
  retires the session.
- **NeMo Gym's**: ``/seed_session`` takes the run row (``responses_create_params``
  plus the environment's own fields, identity in ``_ng_*`` fields or the
  ``/ng-rollout/<id>`` prefix) and sets the session cookie; tool routes and
  ``/verify`` find the session by that cookie; ``/verify`` takes
  ``{responses_create_params, response, ...}`` and returns it with ``reward``;
  ``/aggregate_metrics`` takes ``{verify_responses}``.

The environment's fields of a NeMo Gym row: its ``seed`` object if it has
one, else every field that is not NeMo Gym's own (``NG_RUN_KEYS``, ``_ng_*``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .._http import DEFAULT_MAX_BODY_BYTES, gym_app, identity_of, json_body, stats_routes
from ..wire import (
    NG_RUN_KEYS,
    REVISION_HEADER,
    SESSION_COOKIE,
    session_cookie,
)
from ._metrics import aggregate_metrics, verify_responses
from ._service import ResourcesService

__all__ = ["create_resources_app", "final_text", "task_fields"]


def task_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The environment's own fields of a NeMo Gym run or verify row."""
    return {k: v for k, v in body.items() if k not in NG_RUN_KEYS and not k.startswith("_ng_")}


def final_text(response: Any) -> str:
    """The last assistant text of a Responses ``response`` (what a verifier grades)."""
    text = ""
    for item in response.get("output") or [] if isinstance(response, dict) else []:
        if isinstance(item, dict) and item.get("type") == "message" and item.get("role") == "assistant":
            parts = item.get("content") or []
            text = (
                "".join(p.get("text", "") for p in parts if isinstance(p, dict))
                if isinstance(parts, list)
                else ""
            )
    return text


def create_resources_app(
    service: ResourcesService, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> FastAPI:
    """The resources FastAPI app: /seed_session, one route per tool, /verify, /close_session."""
    app = gym_app(f"rollcut resources: {service.env.name}", max_body_bytes=max_body_bytes)

    @app.post("/seed_session")
    async def seed_session(request: Request) -> Any:
        body = await json_body(request, empty_ok=True)
        ident = identity_of(request, body)
        args = body
        # a NeMo Gym run row: the environment's fields seed it (a NeMo Gym server takes it whole)
        if "responses_create_params" in body and not service.env.whole_rows:
            fields = task_fields(body)
            args = fields["seed"] if isinstance(fields.get("seed"), dict) else fields
        resp = JSONResponse(await service.seed(ident, args))
        resp.set_cookie(SESSION_COOKIE, session_cookie(ident), httponly=True, samesite="lax")
        return resp

    @app.post("/verify")
    async def verify(request: Request) -> Any:
        body = await json_body(request, empty_ok=True)
        ident = identity_of(request)
        if "response" not in body or "responses_create_params" not in body or service.env.whole_rows:
            return JSONResponse(await service.verify(ident, body))
        fields = task_fields(body)
        args = {**fields, **(fields.get("verify") or {}), "answer": final_text(body["response"])}
        verdict = await service.verify(ident, args)
        return JSONResponse({**body, **verdict, "reward": float(verdict.get("reward") or 0.0)})

    @app.post("/aggregate_metrics")
    async def aggregate(request: Request) -> Any:
        return aggregate_metrics(verify_responses(await json_body(request, empty_ok=True)))

    @app.get("/reverify_mode")
    async def reverify_mode() -> str:
        # NeMo Gym's ReverifyMode: can `gym eval reverify` run /verify again on a finished row alone?
        return service.env.reverify_mode

    @app.post("/close_session")
    async def close_session(request: Request) -> Any:
        return JSONResponse(await service.close(identity_of(request)))

    stats_routes(
        app,
        [service.stats],
        lambda: {
            "instance": service.instance,
            "env": service.env.name,
            "mode": service.env.mode,
            "sessions": len(service.sessions),
            "verifying": service.verifying,
        },
    )

    @app.get("/tools")
    async def tools() -> list[dict[str, Any]]:
        return service.env.tool_schemas()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/{tool}")
    async def tool(tool: str, request: Request) -> Any:
        body = await json_body(request, empty_ok=True)
        out = await service.tool(identity_of(request), tool, body)
        if not service.env.bare_answers:
            return JSONResponse(out)
        # a Gym-shaped server answers the tool's response model itself, as it did before the port
        headers = {
            REVISION_HEADER: str(out["revision"]),
            "x-rollcut-served-from-log": str(out["served_from_log"]),
        }
        return JSONResponse(out["result"], headers=headers)

    return app
