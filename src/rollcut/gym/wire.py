"""The Gym wire protocol, written once: rollout identity, error kinds, and the domain errors.

Every Gym server here (model, resources, agent, environment) and every client
of them (the agent, the environment server, the collector) speaks the same
three things, and this module is the only place they are spelled:

- **Identity**: which physical execution ``(rollout_id, attempt)`` a call
  belongs to. Encodings: the ``X-Rollout-Id`` / ``X-Rollout-Attempt``
  headers, or the path prefix ``/r/{rollout_id}/{attempt}``. Encode with
  :func:`identity_headers`, decode with :func:`identity_from`.
- **Error kinds**: :class:`ErrorKind`, the ``type`` of an OpenAI-style
  ``{"error": {"type", "message"}}`` answer, each with one HTTP status
  (:func:`status_of`).
- **Domain errors**: services raise :class:`GymError` with a kind, never an
  HTTP status. Only the FastAPI apps turn it into an answer; clients turn an
  answer back into the same error with :func:`error_from_response`, so both
  sides match on the enum, never on a string.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx

from .._errors import AdmissionClosedError, RollcutError

__all__ = [
    "ATTEMPT_HEADER",
    "PATH_PREFIX",
    "ROLLOUT_HEADER",
    "ErrorKind",
    "GymError",
    "Identity",
    "error_body",
    "error_from_response",
    "identity_from",
    "identity_headers",
    "status_of",
]

ROLLOUT_HEADER = "x-rollout-id"
"""The header carrying a call's rollout id."""
ATTEMPT_HEADER = "x-rollout-attempt"
"""The header carrying a call's attempt number."""
PATH_PREFIX = "/r/{rollout_id}/{attempt}"
"""The path prefix that carries identity where headers cannot."""


class ErrorKind(StrEnum):
    """The ``type`` of every error answer a Gym server here gives."""

    MISSING_IDENTITY = "missing_identity"
    BAD_IDENTITY = "bad_identity"
    STALE_ATTEMPT = "stale_attempt"
    UNKNOWN_ROLLOUT = "unknown_rollout"
    RETIRED = "retired"
    ATTEMPT_IN_USE = "attempt_in_use"
    ADMISSION_CLOSED = "admission_closed"
    FRESH_DISPATCH = "fresh_dispatch"
    NOT_CONTINUABLE = "not_continuable"
    REPLAY_MISMATCH = "replay_mismatch"
    NO_SESSION = "no_session"
    UNKNOWN_TOOL = "unknown_tool"
    HTTP_ERROR = "http_error"
    """An answer that is not a Gym error (a proxy, a crashed handler, another server)."""


_STATUS: dict[ErrorKind, int] = {
    ErrorKind.MISSING_IDENTITY: 400,
    ErrorKind.BAD_IDENTITY: 400,
    ErrorKind.STALE_ATTEMPT: 409,
    ErrorKind.UNKNOWN_ROLLOUT: 409,
    ErrorKind.RETIRED: 409,
    ErrorKind.ATTEMPT_IN_USE: 409,
    ErrorKind.ADMISSION_CLOSED: 503,
    ErrorKind.FRESH_DISPATCH: 409,
    ErrorKind.NOT_CONTINUABLE: 409,
    ErrorKind.REPLAY_MISMATCH: 409,
    ErrorKind.NO_SESSION: 404,
    ErrorKind.UNKNOWN_TOOL: 404,
    ErrorKind.HTTP_ERROR: 502,
}

# what a continuing agent must do when a server refuses a re-issued operation: never mix histories
_NEEDS_FRESH_DISPATCH = frozenset(
    {ErrorKind.FRESH_DISPATCH, ErrorKind.NOT_CONTINUABLE, ErrorKind.REPLAY_MISMATCH}
)


def status_of(kind: ErrorKind) -> int:
    """The HTTP status an error of this kind is answered with."""
    return _STATUS[kind]


@dataclass(frozen=True)
class Identity:
    """One physical execution of a rollout: the key of every session on every server."""

    rollout_id: str
    attempt: int


class GymError(RollcutError):
    """A call a Gym server refuses, by kind; the HTTP status follows from the kind.

    ``status`` is set only for :attr:`ErrorKind.HTTP_ERROR`, where it is the
    status the foreign answer really had.
    """

    kind: ErrorKind
    status: int
    retry_after_s: float | None = None
    rollout_id: str | None = None
    attempt: int | None = None

    def __init__(
        self, kind: ErrorKind, message: str, *, status: int | None = None, **coordinates: object
    ) -> None:
        super().__init__(
            message, kind=kind, status=status_of(kind) if status is None else status, **coordinates
        )

    @property
    def needs_fresh_dispatch(self) -> bool:
        """The rollout cannot continue from its cut; start the next attempt from its input."""
        return self.kind in _NEEDS_FRESH_DISPATCH

    @classmethod
    def admission_closed(cls, exc: AdmissionClosedError) -> GymError:
        """A checkpoint holds admission: retryable, and the call was not admitted."""
        return cls(ErrorKind.ADMISSION_CLOSED, str(exc), retry_after_s=exc.retry_after_s)


def identity_headers(ident: Identity) -> dict[str, str]:
    """The headers that carry ``ident`` on a call to another Gym server."""
    return {ROLLOUT_HEADER: ident.rollout_id, ATTEMPT_HEADER: str(ident.attempt)}


def identity_from(
    headers: Mapping[str, str], rollout_id: str | None = None, attempt: str | None = None
) -> Identity:
    """The identity of a call: the path prefix's values if given, else the headers."""
    rid = rollout_id or headers.get(ROLLOUT_HEADER)
    att = attempt or headers.get(ATTEMPT_HEADER)
    if not rid or not att:
        raise GymError(
            ErrorKind.MISSING_IDENTITY,
            "this server checkpoints its calls: send X-Rollout-Id and X-Rollout-Attempt headers "
            "(or call /r/{rollout_id}/{attempt}/...)",
        )
    try:
        return Identity(rid, int(att))
    except ValueError as exc:
        raise GymError(
            ErrorKind.BAD_IDENTITY, f"X-Rollout-Attempt must be an integer, got {att!r}", rollout_id=rid
        ) from exc


def error_body(err: GymError) -> dict[str, Any]:
    """The OpenAI-style body of an error answer."""
    return {"error": {"type": str(err.kind), "message": str(err)}}


def error_from_response(resp: httpx.Response, *, where: str = "") -> GymError:
    """The error a Gym server's answer carries (the reverse of :func:`error_body`).

    Whatever the answer is (JSON of another shape, plain text, an unknown
    type), the result is a :class:`GymError`; unknown kinds become
    :attr:`ErrorKind.HTTP_ERROR` with the answer's own status.
    """
    err: Any = None
    if resp.headers.get("content-type", "").startswith("application/json"):
        try:
            body = resp.json()
        except ValueError:
            body = None
        err = body.get("error") if isinstance(body, dict) else None
    prefix = f"{where}: " if where else ""
    retry = resp.headers.get("retry-after")
    retry_after = float(retry) if retry and retry.replace(".", "", 1).isdigit() else None
    if isinstance(err, dict) and err.get("type") in ErrorKind.__members__.values():
        return GymError(
            ErrorKind(err["type"]), prefix + str(err.get("message", "")), retry_after_s=retry_after
        )
    text = str(err.get("message")) if isinstance(err, dict) else resp.text[:300]
    return GymError(ErrorKind.HTTP_ERROR, f"{prefix}{resp.status_code} {text}", status=resp.status_code)
