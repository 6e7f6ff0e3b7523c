"""The opaque agent server's HTTP surface: Gym's ``POST /run``, and the relay under ``/r/<rid>/<n>/<token>``.

``/r/<rollout>/<attempt>/<token>/v1/...`` is the agent's OpenAI base URL and
``/r/<rollout>/<attempt>/<token>/tools/<env>/...`` its tool server. The path
names the attempt (so a server with several workers routes it to the one that
runs it) and ``<token>`` proves it: the run's own secret, handed to its program
only, checked by the relay (``403 run_token`` otherwise). A request without it
is refused whatever it names, so a program that learns another rollout's ids
cannot act as that rollout. Headers are the agent's own (it needs no change but
its base URL). Replays are answered while a checkpoint is being taken; /run
itself is admitted like any agent's.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from .._client import deep_health
from .._http import DEFAULT_MAX_BODY_BYTES, gym_app, identity_of, json_body, run_admitted, stats_routes
from .._normalise import normalised_route, request_digest
from ..wire import ErrorKind, GymError, Identity
from ._exchange import Outgoing
from ._launcher import OpaqueAgent

__all__ = ["create_opaque_app"]

_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def _path_identity(request: Request) -> Identity:
    prefix: dict[str, str] = getattr(request.state, "identity_prefix", None) or {}
    if "rollout_id" not in prefix:
        raise GymError(
            ErrorKind.MISSING_IDENTITY, "the relay takes the rollout from its path: /r/<rollout>/<attempt>"
        )
    return identity_of(request)


def _plain(rest: str) -> str:
    """A relayed path is forwarded only as it is written: no ``.`` or ``..`` segment (decoded from
    ``%2f`` or not), no empty one, no backslash. Otherwise ``/v1/..%2f..%2fmetrics`` would reach the
    model server's own routes (and be journaled as an exchange)."""
    segments = rest.split("/")
    if any(seg in ("", ".", "..") for seg in segments[:-1]) or segments[-1] in (".", "..") or "\\" in rest:
        raise GymError(ErrorKind.BAD_REQUEST, f"the relay forwards plain paths only, not {rest!r}")
    return rest


def create_opaque_app(agent: OpaqueAgent, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The app: /run, the relay routes, /rollcut/stats and a deep /healthz."""
    app = gym_app("rollcut opaque agent", max_body_bytes=max_body_bytes)
    relay = agent.relay

    async def relayed(
        request: Request, target: str, path: str, route_path: str, token: str | None
    ) -> Response:
        ident = _path_identity(request)
        if token is None or not relay.run_of(ident).authorised(token):
            relay.run_of(ident)  # an attempt not running here is stale, whatever is sent with it
            raise GymError(ErrorKind.RUN_TOKEN, "the relay answers a run's requests under its token only")
        url, env = relay.upstream(target, path)
        query = request.url.query
        url = f"{url}?{query}" if query else url
        route = normalised_route(route_path, query)  # without the token: the same route in every attempt
        body = await request.body()
        ctype = request.headers.get("content-type", "")
        digest = request_digest(request.method, route, body, ctype, relay.normalise)
        method = request.method.upper()
        return await relay.handle(ident, Outgoing(method, route, digest, url, env, body, ctype))

    @app.post("/run")
    async def run(request: Request) -> Any:
        task = await json_body(request)
        ident = identity_of(request, task)
        return await run_admitted(agent.participant, lambda: agent.run(ident, task))

    @app.api_route("/{token}/v1/{rest:path}", methods=_METHODS)
    async def model(token: str, rest: str, request: Request) -> Response:
        path = f"/v1/{_plain(rest)}"
        return await relayed(request, "model", path, path, token)

    @app.api_route("/{token}/tools/{env}/{rest:path}", methods=_METHODS)
    async def tools(token: str, env: str, rest: str, request: Request) -> Response:
        path = _plain(rest)
        return await relayed(request, env, f"/{path}", f"/tools/{env}/{path}", token)

    @app.api_route("/v1/{rest:path}", methods=_METHODS)
    async def model_without_token(rest: str, request: Request) -> Response:
        return await relayed(request, "model", "", "", None)

    @app.api_route("/tools/{env}/{rest:path}", methods=_METHODS)
    async def tools_without_token(env: str, rest: str, request: Request) -> Response:
        return await relayed(request, env, "", "", None)

    stats_routes(
        app,
        [agent.stats, relay.stats],
        lambda: {
            "instance": agent.instance,
            "capability": str(agent.capability),
            "on_divergence": relay.on_divergence,
            "running": len(relay.runs),
        },
    )

    @app.get("/healthz")
    async def healthz() -> Any:
        return await deep_health(agent.http, [relay.model_url, *relay.resources.values()])

    return app
