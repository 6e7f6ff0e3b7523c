"""The FastAPI side of the wire protocol: the one place domain errors become HTTP answers.

How servers call each other is ``_client``; what they write for a call, ``_writes``."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .._errors import AdmissionClosedError, StorageError
from .._metrics import CONTENT_TYPE, Tally, exposition
from .._tracing import FASTAPI_TELEMETRY, TraceContext
from ..participants import Participant
from ._peers import PeerRouter
from .wire import (
    NG_ROLLOUT_PREFIX,
    SESSION_COOKIE,
    ErrorKind,
    GymError,
    Identity,
    error_body_for,
    identity_from,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "BodyLimit",
    "IdentityPrefix",
    "error_response",
    "gym_app",
    "identity_of",
    "json_body",
    "run_admitted",
    "stats_routes",
]


def error_response(err: GymError, path: str = "") -> JSONResponse:
    """The answer for a refused call: the API's error shape (Anthropic's on ``/v1/messages``, OpenAI's
    elsewhere: :func:`~rollcut.gym.wire.error_body_for`), the kind's status, Retry-After if any."""
    headers = {"Retry-After": f"{max(1, round(err.retry_after_s))}"} if err.retry_after_s else None
    return JSONResponse(error_body_for(path, err), status_code=err.status, headers=headers)


_PREFIXES = (
    re.compile(r"^/r/(?P<rollout_id>[^/]+)/(?P<attempt>[^/]+)(?P<rest>/.*)$"),
    re.compile(rf"^/{NG_ROLLOUT_PREFIX}/(?P<ng>[^/]+)(?:/training-token-capture)?(?P<rest>/.*)$"),
)


class IdentityPrefix:
    """Strips an identity path prefix (``/r/<rollout>/<attempt>`` or ``/ng-rollout/<id>``) and keeps
    what it said for :func:`identity_of`, so every route serves both the plain and prefixed paths."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            for pattern in _PREFIXES:
                m = pattern.match(scope.get("path", ""))
                if m is not None:
                    found = {k: v for k, v in m.groupdict().items() if k != "rest"}
                    state = {**scope.get("state", {}), "identity_prefix": found}
                    rest = m["rest"]
                    scope = {**scope, "path": rest, "raw_path": rest.encode(), "state": state}
                    break
        await self.app(scope, receive, send)


class BusHealth:
    """``/healthz`` answers ``503 bus_lost`` once the server's bus connection is gone for good (its
    identity revoked): it stores nothing more, and a health check that said ok would keep traffic
    coming to it while it exits (the app's ``state.bus_lost``: the reason, or None)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and scope.get("path") == "/healthz":
            lost = getattr(scope["app"].state, "bus_lost", None)
            why = lost() if lost is not None else None
            if why:
                await error_response(GymError(ErrorKind.BUS_LOST, why), "/healthz")(scope, receive, send)
                return
        await self.app(scope, receive, send)


STORAGE_RETRY_AFTER_S = 30.0
"""The Retry-After of a ``storage_unavailable`` answer: room is made by an operator, not in a moment."""

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""The largest request body a Gym server reads, unless told otherwise (``--max-body-bytes``)."""


class BodyLimit:
    """Refuses a request body over ``limit`` bytes with 413 in the API's error shape: by its
    Content-Length before reading anything, else as soon as the bytes received pass the limit.
    Nothing oversized reaches a handler, the log, or the event loop's memory."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        total, more = 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body"))
        body, replayed = b"".join(chunks), False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return dict(await receive())
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        err = GymError(ErrorKind.PAYLOAD_TOO_LARGE, f"the body is over the {self.limit}-byte limit")
        await error_response(err, scope.get("path", ""))(scope, receive, send)


def gym_app(title: str, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """A FastAPI app whose routes raise domain errors and never build error answers themselves;
    identity path prefixes are understood on every route, bodies are bounded, and a request for a
    rollout another worker owns goes to that worker (:mod:`rollcut.gym._peers`)."""
    app = FastAPI(title=title, version="1", telemetry=FASTAPI_TELEMETRY)
    app.add_middleware(TraceContext)  # innermost: in the worker that owns the rollout
    app.add_middleware(IdentityPrefix)
    app.add_middleware(PeerRouter)  # inside the body limit, outside the prefix: forwards as sent
    app.add_middleware(BodyLimit, limit=max_body_bytes)
    app.add_middleware(BusHealth)  # outermost: a server that lost its bus says so before anything

    async def on_gym_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, GymError)
        return error_response(exc, request.url.path)

    async def on_admission_closed(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AdmissionClosedError)
        return error_response(GymError.admission_closed(exc), request.url.path)

    async def on_storage(request: Request, exc: Exception) -> JSONResponse:
        # the write did not happen, so the same call is safe to send again once room is made
        assert isinstance(exc, StorageError)
        err = GymError(ErrorKind.STORAGE_UNAVAILABLE, str(exc), retry_after_s=STORAGE_RETRY_AFTER_S)
        return error_response(err, request.url.path)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        # the framework's own refusals (no such route, wrong method, a typed parameter that does not
        # parse) in the same shape as every other refusal, so one client parser reads them all
        path = request.url.path
        if isinstance(exc, RequestValidationError):
            return error_response(GymError(ErrorKind.BAD_REQUEST, f"invalid request: {exc.errors()}"), path)
        assert isinstance(exc, StarletteHTTPException)
        kind = {404: ErrorKind.NOT_FOUND, 405: ErrorKind.METHOD_NOT_ALLOWED}.get(exc.status_code)
        return error_response(GymError(kind or ErrorKind.BAD_REQUEST, str(exc.detail)), path)

    app.add_exception_handler(GymError, on_gym_error)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_http)
    app.add_exception_handler(AdmissionClosedError, on_admission_closed)
    app.add_exception_handler(StorageError, on_storage)
    return app


async def json_body(request: Request, *, empty_ok: bool = False) -> dict[str, Any]:
    """The request's JSON object; anything else is a 400 ``bad_request`` in the API's shape."""
    raw = await request.body()
    if not raw and empty_ok:
        return {}
    # one pass of msgspec's decoder instead of the stdlib's parse plus a trial encode: it refuses what
    # no UTF-8 record can hold (a lone surrogate escape) and numbers out of range, and bounds depth
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        why = f"the body is not JSON, or holds text that is not valid Unicode: {exc}"
        raise GymError(ErrorKind.BAD_REQUEST, why) from exc
    except RecursionError as exc:  # the decoder recurses per level: a deep body must not be a 500
        raise GymError(ErrorKind.BAD_REQUEST, "the body is JSON nested too deeply") from exc
    if not isinstance(body, dict):
        raise GymError(ErrorKind.BAD_REQUEST, "the body must be a JSON object")
    try:  # what the log will store it as: JSON allows integers msgpack cannot hold
        msgspec.msgpack.encode(body)
    except OverflowError as exc:
        raise GymError(ErrorKind.BAD_REQUEST, f"the body holds a number out of range: {exc}") from exc
    return body


def identity_of(request: Request, body: Mapping[str, Any] | None = None) -> Identity:
    """The identity of an incoming call, from its path prefix, headers and (NeMo Gym) body fields."""
    prefix: dict[str, str] = getattr(request.state, "identity_prefix", None) or {}
    return identity_from(
        request.headers,
        prefix.get("rollout_id"),
        prefix.get("attempt"),
        body=body,
        ng_path=prefix.get("ng"),
        cookie=request.cookies.get(SESSION_COOKIE),
    )


async def run_admitted(
    participant: Participant | None, run: Callable[[], Awaitable[dict[str, Any]]]
) -> JSONResponse:
    """An agent's ``/run``, admitted like any accepted work: refused (503) while a checkpoint holds it."""
    if participant is None:
        return JSONResponse(await run())
    async with participant.gate.admit():
        return JSONResponse(await run())


def stats_routes(app: FastAPI, tallies: list[Tally], stats: Callable[[], dict[str, Any]]) -> None:
    """``/rollcut/stats`` (this worker's counters by stat name, plus what ``stats`` adds: who it is,
    what runs now; the peer router sums the workers') and ``/metrics`` (Prometheus' text format,
    every worker's), both read from the same ``tallies``."""

    @app.get("/rollcut/stats")
    async def get_stats() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for t in tallies:
            out.update(t.snapshot())
        renewals = getattr(app.state, "identity_renewals", None)  # set where a bus identity is held
        if renewals is not None:
            out["identity_renewals"] = renewals()
        return {**stats(), **out}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(exposition(tallies), media_type=CONTENT_TYPE)
