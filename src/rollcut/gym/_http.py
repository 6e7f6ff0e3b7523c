"""The FastAPI side of the wire protocol: the one place domain errors become HTTP answers."""

from __future__ import annotations

from typing import TypedDict

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from .._errors import AdmissionClosedError, FenceError, StaleAttemptError
from ..bus import Component, Event, EventLog
from .wire import ErrorKind, GymError, Identity, error_body, identity_from

__all__ = ["Envelope", "append_or_refuse", "envelope", "error_response", "gym_app", "identity_of"]


class Envelope(TypedDict):
    """The fields every event a Gym server writes for one call shares."""

    component: Component
    instance: str
    rollout_id: str
    attempt: int


def envelope(component: Component, instance: str, ident: Identity) -> Envelope:
    """Who writes (``component``, ``instance``) for which execution (``ident``)."""
    return {
        "component": component,
        "instance": instance,
        "rollout_id": ident.rollout_id,
        "attempt": ident.attempt,
    }


def error_response(err: GymError) -> JSONResponse:
    """The answer for a refused call: OpenAI's error shape, the kind's status, Retry-After if any."""
    headers = {"Retry-After": f"{max(1, round(err.retry_after_s))}"} if err.retry_after_s else None
    return JSONResponse(error_body(err), status_code=err.status, headers=headers)


def gym_app(title: str) -> FastAPI:
    """A FastAPI app whose routes raise domain errors and never build error answers themselves."""
    app = FastAPI(title=title, version="1")

    async def on_gym_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, GymError)
        return error_response(exc)

    async def on_admission_closed(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AdmissionClosedError)
        return error_response(GymError.admission_closed(exc))

    app.add_exception_handler(GymError, on_gym_error)
    app.add_exception_handler(AdmissionClosedError, on_admission_closed)
    return app


def identity_of(request: Request, rollout_id: str | None = None, attempt: str | None = None) -> Identity:
    """The identity of an incoming call (path prefix values, else headers)."""
    return identity_from(request.headers, rollout_id, attempt)


async def append_or_refuse(log: EventLog, event: Event) -> int:
    """Append (write before act); a fence refusal becomes the error the caller gets."""
    try:
        return await log.append(event)
    except StaleAttemptError as exc:
        raise GymError(
            ErrorKind.STALE_ATTEMPT, str(exc), rollout_id=exc.rollout_id, attempt=exc.attempt
        ) from exc
    except FenceError as exc:  # e.g. a rollout that was never dispatched
        raise GymError(ErrorKind.UNKNOWN_ROLLOUT, str(exc)) from exc
