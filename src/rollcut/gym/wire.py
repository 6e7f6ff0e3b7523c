"""The Gym wire protocol, written once: rollout identity, error kinds, and the domain errors.

Every Gym server here (model, resources, agent, environment) and every client
of them (the agent, the environment server, the collector) speaks the same
three things, and this module is the only place they are spelled:

- **Identity**: which physical execution ``(rollout_id, attempt)`` a call
  belongs to. rollcut's encodings: the ``X-Rollout-Id`` /
  ``X-Rollout-Attempt`` headers, or the path prefix
  ``/r/{rollout_id}/{attempt}``. NeMo Gym's: the body fields
  ``_ng_rollout_id`` / ``_ng_attempt_index``, or the path prefix
  ``/ng-rollout/<id>[-a<n>]``. NeMo Gym counts attempts from 0 and rollcut
  from 1: ``attempt = _ng_attempt_index + 1``, here and nowhere else. Encode
  with :func:`identity_headers` / :func:`ng_path_id`, decode with
  :func:`identity_from`; two encodings that disagree are refused.
- **Error kinds**: :class:`ErrorKind`, the ``code`` of OpenAI's
  ``{"error": {"message", "type", "param", "code"}}`` answer, each with one
  HTTP status (:func:`status_of`); ``type`` is OpenAI's class of that status
  (:func:`openai_type`), so OpenAI's clients branch on it as on OpenAI's.
- **Domain errors**: services raise :class:`GymError` with a kind, never an
  HTTP status. Only the FastAPI apps turn it into an answer; clients turn an
  answer back into the same error with :func:`error_from_response`, so both
  sides match on the enum, never on a string.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx

from .._errors import AdmissionClosedError, RollcutError, StaleAttemptError

__all__ = [
    "ATTEMPT_HEADER",
    "MESSAGES_ROUTE",
    "NG_ATTEMPT_INDEX",
    "NG_ROLLOUT_ID",
    "NG_ROLLOUT_INDEX",
    "NG_ROLLOUT_PREFIX",
    "NG_RUN_KEYS",
    "NG_TASK_INDEX",
    "PATH_PREFIX",
    "REVISION_HEADER",
    "ROLLOUT_HEADER",
    "SESSION_COOKIE",
    "ErrorKind",
    "GymError",
    "Identity",
    "anthropic_error_body",
    "error_body",
    "error_body_for",
    "error_from_response",
    "identity_from",
    "identity_headers",
    "ng_path_id",
    "openai_type",
    "session_cookie",
    "split_ng_path_id",
    "status_of",
]

ROLLOUT_HEADER = "x-rollout-id"
"""The header carrying a call's rollout id."""
ATTEMPT_HEADER = "x-rollout-attempt"
"""The header carrying a call's attempt number."""
PATH_PREFIX = "/r/{rollout_id}/{attempt}"
"""The path prefix that carries identity where headers cannot."""
NG_ROLLOUT_PREFIX = "ng-rollout"
"""NeMo Gym's path prefix segment: ``/ng-rollout/<id>[-a<n>]/...``."""
NG_ROLLOUT_ID = "_ng_rollout_id"
"""NeMo Gym's body field naming a rollout."""
NG_ATTEMPT_INDEX = "_ng_attempt_index"
"""NeMo Gym's body field naming an attempt, counted from 0 (rollcut's attempt minus one)."""
NG_TASK_INDEX = "_ng_task_index"
"""NeMo Gym's row field: which input row (task) a rollout came from."""
NG_ROLLOUT_INDEX = "_ng_rollout_index"
"""NeMo Gym's row field: which repeat of its task a rollout is."""
SESSION_COOKIE = "rollcut_session"
"""The cookie a resources server sets at ``/seed_session`` (NeMo Gym's session contract):
``<rollout_id>:<attempt>`` (characters a cookie carries unquoted); tool calls, ``/verify`` and
``/close_session`` find their session by it."""
REVISION_HEADER = "x-rollcut-revision"
"""The session revision a tool call reached, where the body is the tool's own answer (Gym-shaped servers)."""
NG_RUN_KEYS = frozenset({"responses_create_params", "response", "agent_ref", "reward"})
"""NeMo Gym's own fields of a run row; everything else in a row is the environment's."""
_NG_ATTEMPT = re.compile(r"^(?P<rid>.+)-a(?P<n>[0-9]+)$")
_ROLLOUT_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class ErrorKind(StrEnum):
    """What went wrong, by kind: the ``code`` of every error answer a Gym server here gives (its
    ``type`` is OpenAI's class of the status, :func:`openai_type`)."""

    PAYLOAD_TOO_LARGE = "payload_too_large"
    """The body is over the server's limit (``--max-body-bytes``); nothing of it was read further."""
    BAD_REQUEST = "bad_request"
    """The body is not what the route takes (not JSON, wrong shape, invalid fields)."""
    UNSUPPORTED = "unsupported"
    """A valid request asks for what this server does not do (``n`` above 1, ``top_logprobs``,
    a stored response); it says what to send instead."""
    MODEL_NOT_FOUND = "model_not_found"
    """The request names a model this server does not serve (OpenAI's own code for it)."""
    MISSING_IDENTITY = "missing_identity"
    BAD_IDENTITY = "bad_identity"
    STALE_ATTEMPT = "stale_attempt"
    RUN_TOKEN = "run_token"
    """An opaque agent's request without its run's token (or with another run's)."""
    UNKNOWN_ROLLOUT = "unknown_rollout"
    RETIRED = "retired"
    ATTEMPT_IN_USE = "attempt_in_use"
    ADMISSION_CLOSED = "admission_closed"
    STORAGE_UNAVAILABLE = "storage_unavailable"
    """The bus or a disk refused the write (out of room, failing); nothing was stored: retry later."""
    ENGINE_UNAVAILABLE = "engine_unavailable"
    """The inference engine behind the model server went away mid-call; the call was recorded as failed
    and is safe to send again (``Retry-After``)."""
    ENGINE_ERROR = "engine_error"
    """The inference engine failed the call or answered in a shape rollcut does not keep."""
    WORKER_UNAVAILABLE = "worker_unavailable"
    """The worker of this server that holds the rollout did not answer (it died and is restarting)."""
    BUS_LOST = "bus_lost"
    """The bus closed this server's connection for good (its identity was revoked: another process
    took its instance name): it stores nothing more and is exiting (``/healthz`` says so)."""
    AGENT_FAILED = "agent_failed"
    """An opaque agent's own process failed: it exited non-zero, or printed no answer."""
    FRESH_DISPATCH = "fresh_dispatch"
    NOT_CONTINUABLE = "not_continuable"
    REPLAY_MISMATCH = "replay_mismatch"
    NO_SESSION = "no_session"
    UNKNOWN_TOOL = "unknown_tool"
    NOT_FOUND = "not_found"
    """No route has this path."""
    METHOD_NOT_ALLOWED = "method_not_allowed"
    HTTP_ERROR = "http_error"
    """An answer that is not a Gym error (a proxy, a crashed handler, another server)."""


_STATUS: dict[ErrorKind, int] = {
    ErrorKind.PAYLOAD_TOO_LARGE: 413,
    ErrorKind.BAD_REQUEST: 400,
    ErrorKind.UNSUPPORTED: 400,
    ErrorKind.MODEL_NOT_FOUND: 404,
    ErrorKind.MISSING_IDENTITY: 400,
    ErrorKind.BAD_IDENTITY: 400,
    ErrorKind.STALE_ATTEMPT: 409,
    ErrorKind.RUN_TOKEN: 403,
    ErrorKind.UNKNOWN_ROLLOUT: 409,
    ErrorKind.RETIRED: 409,
    ErrorKind.ATTEMPT_IN_USE: 409,
    ErrorKind.ADMISSION_CLOSED: 503,
    ErrorKind.STORAGE_UNAVAILABLE: 503,
    ErrorKind.WORKER_UNAVAILABLE: 503,
    ErrorKind.BUS_LOST: 503,
    ErrorKind.ENGINE_UNAVAILABLE: 503,
    ErrorKind.ENGINE_ERROR: 502,
    ErrorKind.AGENT_FAILED: 502,
    ErrorKind.FRESH_DISPATCH: 409,
    ErrorKind.NOT_CONTINUABLE: 409,
    ErrorKind.REPLAY_MISMATCH: 409,
    ErrorKind.NO_SESSION: 404,
    ErrorKind.UNKNOWN_TOOL: 404,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.METHOD_NOT_ALLOWED: 405,
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
    param: str | None = None
    """The request field at fault, as OpenAI's error names it (``max_tokens``, ``n``)."""
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

    @classmethod
    def stale(cls, exc: StaleAttemptError) -> GymError:
        """The fence has moved past this attempt: whatever it would do is refused (the one place a
        stale attempt becomes an answer)."""
        return cls(ErrorKind.STALE_ATTEMPT, str(exc), rollout_id=exc.rollout_id, attempt=exc.attempt)


def identity_headers(ident: Identity) -> dict[str, str]:
    """The headers that carry ``ident`` on a call to another Gym server."""
    return {ROLLOUT_HEADER: ident.rollout_id, ATTEMPT_HEADER: str(ident.attempt)}


def session_cookie(ident: Identity) -> str:
    """The value of :data:`SESSION_COOKIE` for a session."""
    return f"{ident.rollout_id}:{ident.attempt}"


def ng_path_id(ident: Identity) -> str:
    """The id NeMo Gym puts in ``/ng-rollout/<id>``: the rollout, ``-a<n>`` for attempts after the first."""
    return ident.rollout_id if ident.attempt == 1 else f"{ident.rollout_id}-a{ident.attempt - 1}"


def split_ng_path_id(path_id: str) -> Identity:
    """The reverse of :func:`ng_path_id` (rollcut's rollout ids never end in ``-a<digits>``)."""
    m = _NG_ATTEMPT.match(path_id)
    if m is None:
        return Identity(path_id, 1)
    return Identity(m["rid"], int(m["n"]) + 1)


_MAX_ATTEMPT = 1_000_000
"""The largest attempt number a call may name; a bigger one could not be stored (msgpack ints)."""

_DIGITS = re.compile(r"[0-9]{1,9}")


def _attempt(value: object, what: str, *, base: int) -> int:
    # plain ASCII digits or a JSON integer only: int() would also take "+1", "1_0", " 1", other scripts
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and _DIGITS.fullmatch(value):
        n = int(value)
    else:
        raise GymError(ErrorKind.BAD_IDENTITY, f"{what} must be an integer, got {str(value)[:40]!r}")
    if n < base or n - base + 1 > _MAX_ATTEMPT:
        raise GymError(ErrorKind.BAD_IDENTITY, f"{what} must be between {base} and {_MAX_ATTEMPT + base - 1}")
    return n - base + 1


def identity_from(
    headers: Mapping[str, str],
    rollout_id: str | None = None,
    attempt: str | None = None,
    *,
    body: Mapping[str, Any] | None = None,
    ng_path: str | None = None,
    cookie: str | None = None,
) -> Identity:
    """The identity of a call, from every encoding it carries; they must agree.

    Sources: rollcut's path prefix values (``rollout_id``, ``attempt``), NeMo
    Gym's path id (``ng_path``), the ``X-Rollout-*`` headers, NeMo Gym's
    body fields; and, only when none of those is given, a resources session's
    cookie (a client that keeps cookies would otherwise send one run's session
    along with the next run's explicit identity).
    """
    found: list[tuple[str, Identity]] = []
    if rollout_id and attempt:
        found.append(("path /r/...", Identity(rollout_id, _attempt(attempt, "the path's attempt", base=1))))
    if ng_path:
        found.append((f"path /{NG_ROLLOUT_PREFIX}/...", split_ng_path_id(ng_path)))
    rid, att = headers.get(ROLLOUT_HEADER), headers.get(ATTEMPT_HEADER)
    if rid or att:
        if not rid or not att:
            raise GymError(ErrorKind.BAD_IDENTITY, "send both X-Rollout-Id and X-Rollout-Attempt, or neither")
        found.append(("headers", Identity(rid, _attempt(att, "X-Rollout-Attempt", base=1))))
    if body is not None and body.get(NG_ROLLOUT_ID) is not None:
        ng_rid = body[NG_ROLLOUT_ID]
        if not isinstance(ng_rid, str):
            raise GymError(ErrorKind.BAD_IDENTITY, f"{NG_ROLLOUT_ID} must be a string, got {ng_rid!r}")
        index = body.get(NG_ATTEMPT_INDEX, 0)
        found.append(("body", Identity(ng_rid, _attempt(index, NG_ATTEMPT_INDEX, base=0))))
    if cookie and not found:  # ambient state: it identifies a call only when nothing explicit does
        crid, _, catt = cookie.partition(":")
        if not crid or not catt:
            raise GymError(ErrorKind.BAD_IDENTITY, f"the {SESSION_COOKIE} cookie is not <rollout>:<attempt>")
        found.append(("cookie", Identity(crid, _attempt(catt, "the session cookie's attempt", base=1))))
    if not found:
        raise GymError(
            ErrorKind.MISSING_IDENTITY,
            "this server checkpoints its calls: send X-Rollout-Id and X-Rollout-Attempt headers, "
            f"call /r/{{rollout_id}}/{{attempt}}/... or /{NG_ROLLOUT_PREFIX}/<id>/..., "
            f"or put {NG_ROLLOUT_ID} (and {NG_ATTEMPT_INDEX}) in the body",
        )
    for where, ident in found:
        if not _ROLLOUT_ID.match(ident.rollout_id):
            raise GymError(
                ErrorKind.BAD_IDENTITY,
                f"rollout id {ident.rollout_id!r} ({where}) must be 1-128 of A-Z a-z 0-9 _ - "
                "(it names subjects on the bus)",
            )
    first = found[0][1]
    for where, other in found[1:]:
        if other != first:
            raise GymError(
                ErrorKind.BAD_IDENTITY,
                f"conflicting identity: {found[0][0]} says {first.rollout_id}/{first.attempt}, "
                f"{where} says {other.rollout_id}/{other.attempt}",
            )
    return first


_OPENAI_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


def openai_type(status: int) -> str:
    """OpenAI's error ``type`` for a status: ``invalid_request_error`` for a request it refuses,
    ``server_error`` for one the server failed, and its own names for 401, 403 and 429."""
    return _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}

MESSAGES_ROUTE = "/v1/messages"
"""Anthropic's Messages route: its refusals are in Anthropic's error shape, every other route's in
OpenAI's (:func:`error_body_for`)."""


def anthropic_error_body(err: GymError) -> dict[str, Any]:
    """Anthropic's error shape, ``{"type": "error", "error": {"type", "message"}}``: ``type`` its class
    of the status (``invalid_request_error``, ``not_found_error``, ``overloaded_error`` for a 503 the
    SDK retries, ``api_error`` for another 5xx). Its shape has no code, so the message leads with
    rollcut's kind."""
    kind = _ANTHROPIC_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": f"{err.kind}: {err}"}}


def error_body_for(path: str, err: GymError) -> dict[str, Any]:
    """The refusal in the shape of the API ``path`` belongs to: Anthropic's on its Messages route,
    OpenAI's everywhere else."""
    return anthropic_error_body(err) if path.endswith(MESSAGES_ROUTE) else error_body(err)


def error_body(err: GymError) -> dict[str, Any]:
    """OpenAI's error shape, ``{"error": {"message", "type", "param", "code"}}``: ``type`` OpenAI's
    class of the status (what OpenAI's own clients branch on), ``code`` rollcut's kind."""
    return {
        "error": {
            "message": str(err),
            "type": openai_type(err.status),
            "param": err.param,
            "code": str(err.kind),
        }
    }


_KINDS = frozenset(k.value for k in ErrorKind)


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
    # the kind is the code; an older rollcut put it in ``type`` too, read as a fallback
    kind = (
        next((k for k in (err.get("code"), err.get("type")) if k in _KINDS), None)
        if isinstance(err, dict)
        else None
    )
    if kind is not None:
        return GymError(ErrorKind(kind), prefix + str(err.get("message", "")), retry_after_s=retry_after)
    text = str(err.get("message")) if isinstance(err, dict) else resp.text[:300]
    return GymError(ErrorKind.HTTP_ERROR, f"{prefix}{resp.status_code} {text}", status=resp.status_code)
