"""What every agent rollcut runs does with an attempt before and around its loop.

Shared by the Simple Agent (whose loop rollcut sees) and the opaque agent's
launcher (whose loop it does not): an attempt is claimed once, a continued
attempt finds the cut it continues from, and a call to a server a checkpoint
holds closed is sent again once it reopens instead of failing the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from .._errors import StaleAttemptError
from ..bus import AttemptClaimed, EventLog
from ..replay import AttemptView, AttemptViews
from .wire import ErrorKind, GymError, Identity, error_from_response, identity_headers

__all__ = [
    "FreshDispatchNeeded",
    "admission_backoff",
    "claim_attempt",
    "post_waiting",
    "sent_when_admitted",
    "view_of",
]


class FreshDispatchNeeded(GymError):
    """A re-issued operation met a different logged one: the rollout must start over from its input."""

    def __init__(self, why: str) -> None:
        super().__init__(ErrorKind.FRESH_DISPATCH, why)


async def view_of(views: AttemptViews, ident: Identity) -> AttemptView:
    """What attempt ``ident`` starts from (:func:`rollcut.replay.attempt_view`), read once per
    attempt. An attempt the fence has moved past is refused as stale: its run would only write
    what the server refuses."""
    try:
        return await views.get(ident.rollout_id, ident.attempt)
    except StaleAttemptError as exc:
        raise GymError.stale(exc) from exc


async def claim_attempt(log: EventLog, instance: str, ident: Identity, *, running_here: bool) -> None:
    """An attempt runs once. Posting it again (a framework retrying a failed /run) would start it
    over from its input and redo everything it completed; the fence cannot see that, since the
    attempt is legitimately open, so the agent refuses: open the next attempt instead."""
    if running_here:
        raise GymError(ErrorKind.ATTEMPT_IN_USE, f"{ident.rollout_id}/{ident.attempt} is running here")
    already = f"{ident.rollout_id}/{ident.attempt} has already run; continue it as the next attempt"
    # model calls with no claim before them: a run that did not claim (an older rollcut)
    if await log.last_on(log.subjects.event(ident.rollout_id, ident.attempt, "model", "*")):
        raise GymError(ErrorKind.ATTEMPT_IN_USE, already)
    # only an open attempt of a dispatched rollout is claimed: a claim is on the log for good
    state = await log.fence_state(ident.rollout_id)
    if state is None:
        raise GymError(ErrorKind.UNKNOWN_ROLLOUT, f"rollout {ident.rollout_id} was never dispatched")
    if not state.open or state.attempt != ident.attempt:
        raise GymError.stale(
            StaleAttemptError(ident.rollout_id, ident.attempt, state.attempt if state.open else None)
        )
    # the claim, atomically, before anything is seeded: of concurrent runs of one attempt, on any
    # worker or agent process, exactly one goes on and the others change nothing
    claimed = AttemptClaimed(
        component="agent", instance=instance, rollout_id=ident.rollout_id, attempt=ident.attempt
    )
    if await log.claim(claimed) is None:
        raise GymError(ErrorKind.ATTEMPT_IN_USE, already)


async def sent_when_admitted(
    send: Callable[[], Awaitable[httpx.Response]],
    *,
    where: str,
    wait_s: float,
    on_wait: Callable[[], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> httpx.Response:
    """``send()`` again while the server answers ``503 admission_closed``, for up to ``wait_s``: a
    checkpoint is closing or reopening it, so the call was not admitted and the same call, a moment
    later, is safe. Failing instead would make the framework start the attempt over and redo
    everything it completed. Any other answer is returned as it is (a streamed one unread)."""
    give_up = time.monotonic() + wait_s
    tries = 0
    while True:
        resp = await send()
        if resp.status_code != 503 or time.monotonic() > give_up:
            return resp
        await resp.aread()
        err = error_from_response(resp, where=where)
        if err.kind is not ErrorKind.ADMISSION_CLOSED:
            return resp
        await resp.aclose()
        if on_wait is not None:
            on_wait()
        await sleep(admission_backoff(tries, err.retry_after_s))
        tries += 1


def admission_backoff(tries: int, retry_after_s: float | None) -> float:
    """How long to wait before asking a closed server again, after ``tries`` refusals: 5 ms, then
    twice as long each time, never longer than the server said (``Retry-After``) nor a second. A
    checkpoint releases every participant at once (``docs/control-plane.md``), so an agent released
    a moment before the server it calls meets it closed for the few milliseconds its resume is in
    flight; it is in again at the next try, not a whole Retry-After later."""
    return min(0.005 * 2.0**tries, retry_after_s or 1.0, 1.0)


async def post_waiting(
    http: httpx.AsyncClient,
    url: str,
    ident: Identity,
    body: dict[str, Any],
    *,
    wait_s: float,
    on_wait: Callable[[], None] | None = None,
    cookies: dict[str, str] | None = None,
) -> httpx.Response:
    """POST with identity (and a session's cookies), waiting out a checkpoint's closed admission;
    a refusal the rollout cannot continue past becomes :class:`FreshDispatchNeeded`."""
    headers = identity_headers(ident)
    if cookies:  # this run's session, sent as a header: the client keeps no cookie jar
        headers["cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
    resp = await sent_when_admitted(
        lambda: http.post(url, json=body, headers=headers), where=url, wait_s=wait_s, on_wait=on_wait
    )
    if resp.status_code == 200:
        return resp
    err = error_from_response(resp, where=url)
    if err.needs_fresh_dispatch:
        raise FreshDispatchNeeded(str(err))
    raise err
