"""What every Gym server here shares: call identity, and errors as HTTP answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from .._errors import FenceError, RollcutError, StaleAttemptError

__all__ = ["CallError", "Identity", "append_or_refuse", "error_of", "error_response", "identity_of"]


class CallError(RollcutError):
    """A call the server refuses; carries the HTTP status and an OpenAI-style error type."""

    def __init__(self, status: int, kind: str, message: str, retry_after_s: float | None = None) -> None:
        self.status = status
        self.kind = kind
        self.retry_after_s = retry_after_s
        super().__init__(message)


@dataclass(frozen=True)
class Identity:
    rollout_id: str
    attempt: int


def identity_of(request: Request, rollout_id: str | None = None, attempt: str | None = None) -> Identity:
    rid = rollout_id or request.headers.get("x-rollout-id")
    att = attempt or request.headers.get("x-rollout-attempt")
    if not rid or not att:
        raise CallError(
            400,
            "missing_identity",
            "this server checkpoints its calls: send X-Rollout-Id and X-Rollout-Attempt headers "
            "(or call /r/{rollout_id}/{attempt}/...)",
        )
    try:
        return Identity(rid, int(att))
    except ValueError as exc:
        raise CallError(400, "bad_identity", f"X-Rollout-Attempt must be an integer, got {att!r}") from exc


def error_response(exc: CallError) -> JSONResponse:
    headers = {"Retry-After": f"{max(1, round(exc.retry_after_s))}"} if exc.retry_after_s else None
    return JSONResponse(
        {"error": {"type": exc.kind, "message": str(exc)}}, status_code=exc.status, headers=headers
    )


def error_of(resp: Any) -> dict[str, str]:
    """The ``{"type", "message"}`` of a Gym server's error answer (the reverse of error_response);
    a non-JSON answer (a proxy, a crashed handler) becomes ``http_error``."""
    err = None
    if resp.headers.get("content-type", "").startswith("application/json"):
        body = resp.json()
        err = body.get("error") if isinstance(body, dict) else None
    return err or {"type": "http_error", "message": resp.text[:300]}


async def append_or_refuse(log: Any, event: Any) -> int:
    """Append (write before act); a fence refusal becomes the HTTP answer the caller gets."""
    try:
        return await log.append(event)
    except StaleAttemptError as exc:
        raise CallError(409, "stale_attempt", str(exc)) from exc
    except FenceError as exc:  # e.g. a rollout that was never dispatched
        raise CallError(409, "unknown_rollout", str(exc)) from exc
