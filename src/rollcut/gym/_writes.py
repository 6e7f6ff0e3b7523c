"""What a Gym server writes for a call: the envelope every event of the call shares, and the append
that turns a fence's refusal into the error the caller gets (write before act)."""

from __future__ import annotations

from typing import TypedDict

from .._errors import EventTooLargeError, FenceError, StaleAttemptError
from ..bus import Component, Event, EventLog
from .wire import ErrorKind, GymError, Identity

__all__ = ["Envelope", "append_or_refuse", "envelope"]


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


async def append_or_refuse(log: EventLog, event: Event) -> int:
    """Append (write before act); a fence refusal becomes the error the caller gets."""
    try:
        return await log.append(event)
    except StaleAttemptError as exc:
        raise GymError.stale(exc) from exc
    except FenceError as exc:  # e.g. a rollout that was never dispatched
        raise GymError(ErrorKind.UNKNOWN_ROLLOUT, str(exc)) from exc
    except EventTooLargeError as exc:  # the caller's input, too large to keep: refused, nothing stored
        raise GymError(
            ErrorKind.PAYLOAD_TOO_LARGE,
            f"this call's record would be {exc.size} bytes, over the {exc.limit} one record may hold",
        ) from exc
