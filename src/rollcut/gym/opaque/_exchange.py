"""One attempt's relay state, and what the relay reads off a request and its answer.

Kept apart from :mod:`._relay` (which does the I/O) so the rules are in one
place: which answers are journaled, what a stream's error event is, where a
tool call's revision is read, and how a run goes back to the start of its
journal when its agent is started again within the attempt.
"""

from __future__ import annotations

import asyncio
import bisect
import hmac
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ...bus import RelayExchange
from .._attempts import FreshDispatchNeeded
from ..wire import ErrorKind, GymError, Identity

__all__ = [
    "NG_ROW_KEY",
    "Outgoing",
    "Pending",
    "RelayRun",
    "answer_response",
    "ends_in_error",
    "journaled",
    "model_calls",
    "refused",
    "replayed",
    "revision_of",
]

_NOT_ANSWERS = frozenset({408, 409, 429})  # refusals about the attempt or the moment, not answers


def journaled(status: int) -> bool:
    """An answer to the request itself: 2xx, or a 4xx that says what was wrong with it. A 5xx or a
    refusal about the attempt (stale, retired) is not kept, and the request keeps its number."""
    return 200 <= status < 300 or (400 <= status < 500 and status not in _NOT_ANSWERS)


@dataclass(frozen=True)
class Outgoing:
    """A request of the agent as the relay handles it: ``route`` (normalised, relay-relative) and
    ``digest`` identify it in the journal; ``url`` is where it goes live, a tool call of ``env``
    ("" for the model)."""

    method: str
    route: str
    digest: str
    url: str
    env: str
    body: bytes
    ctype: str


@dataclass
class RelayRun:
    """One attempt's relay: its journal (the lineage's, then what this attempt journals live), where
    the agent is in it, and the live exchanges still running."""

    ident: Identity
    env: str
    journal: list[RelayExchange]
    cursor: int = 0  # the next journal entry a request is compared with
    next_n: int = 1  # the number of the next live exchange
    live: bool = False
    stopped: str | None = None  # why the run may not go on (a divergence, a retirement)
    stop_kind: ErrorKind = ErrorKind.FRESH_DISPATCH
    kill: Callable[[], None] | None = None  # stops the agent's process while it runs
    inflight: set[asyncio.Future[Any]] = field(default_factory=set)
    trace: Any = None
    """The context of the run's ``invoke_agent`` span (tracing on): the relayed requests' parent."""
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    """The run's own secret: its program's base URLs carry it, and the relay answers no request of
    this attempt without it (another rollout's program cannot act as this one)."""

    def authorised(self, token: str) -> bool:
        return hmac.compare_digest(self.token.encode(), token.encode())

    def __post_init__(self) -> None:
        self.next_n = len(self.journal) + 1
        self.live = not self.journal

    def stop(self, why: str, kind: ErrorKind = ErrorKind.FRESH_DISPATCH) -> None:
        if self.stopped is None:
            self.stopped, self.stop_kind = why, kind
        if self.kill is not None:
            self.kill()

    def check(self) -> None:
        if self.stopped is not None:
            if self.stop_kind is ErrorKind.FRESH_DISPATCH:
                raise FreshDispatchNeeded(self.stopped)
            raise GymError(self.stop_kind, self.stopped)

    def kept(self, ev: RelayExchange) -> None:
        """A live exchange is durable: it joins the journal, in its number's place."""
        bisect.insort(self.journal, ev, key=lambda e: e.n)

    def abandon_from(self, n: int) -> None:
        """Going live at a divergence: entries ``n`` and on are not this history's any more."""
        del self.journal[n - 1 :]
        self.live, self.next_n = True, n

    def track(self, work: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """Run a live exchange as a task of its own: the agent going away does not cut it short."""
        task = asyncio.ensure_future(work)
        self.inflight.add(task)
        task.add_done_callback(_settled(self.inflight))
        return task

    async def settle(self) -> None:
        """Wait for the live exchanges still running (journaled, or failed)."""
        while self.inflight:
            await asyncio.gather(*self.inflight, return_exceptions=True)

    def rewind(self) -> None:
        """The agent starts again within this attempt: answered from the whole journal, its own live
        exchanges included, from the first request."""
        self.cursor, self.live, self.next_n = 0, not self.journal, len(self.journal) + 1


def _settled(inflight: set[asyncio.Future[Any]]) -> Callable[[asyncio.Future[Any]], None]:
    def done(task: asyncio.Future[Any]) -> None:
        inflight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: whoever awaited it has it; nobody else must be warned

    return done


@dataclass
class Pending:
    """A live exchange on its way to the journal."""

    run: RelayRun
    req: Outgoing
    status: int
    content_type: str
    revision: int | None = None


def _sse_data(chunks: list[bytes]) -> Iterator[Any]:
    """The JSON value of each ``data:`` line of a server-sent-events stream (others skipped)."""
    for line in b"".join(chunks).splitlines():
        if line.startswith(b"data:"):
            try:
                yield msgspec.json.decode(line[5:].strip())
            except msgspec.DecodeError:
                continue


def ends_in_error(chunks: list[bytes]) -> bool:
    """Whether a server-sent-events stream carries an error event (OpenAI's ``{"error": …}`` data, or a
    Responses stream's ``error`` / ``response.failed``): a call that failed after its stream began."""
    return any(
        isinstance(d, dict) and ("error" in d or d.get("type") in ("error", "response.failed"))
        for d in _sse_data(chunks)
    )


_RECEIPT = ("call_id", "receipt_id", "receipt_digest", "receipt_count")


def model_calls(journal: list[RelayExchange]) -> list[dict[str, Any]]:
    """The model calls an agent's history consumed, in order, as their receipts: what the model server
    put in each answer's ``rollcut`` object (a stream's: in its final chunk). A trainer reads each
    call's token arrays from the token store by its receipt (``rollcut export``)."""
    out = []
    for ex in journal:
        if not ex.route.startswith("/v1/") or ex.status != 200 or ex.oversize:
            continue
        for data in _answers(ex):
            ext = data.get("rollcut") if isinstance(data, dict) else None
            if isinstance(ext, dict) and all(k in ext for k in _RECEIPT):
                out.append({k: ext[k] for k in _RECEIPT})
    return out


def _answers(ex: RelayExchange) -> Iterator[Any]:
    """The JSON values of an answer: its body, or each event of a stream."""
    return _sse_data(ex.chunks if ex.streamed else [b"data:" + ex.body])


def refused(run: RelayRun, err: GymError) -> None:
    """An upstream refusal that means the rollout cannot go on as it is: the run stops there."""
    if err.needs_fresh_dispatch:
        run.stop(str(err))
    elif err.kind in (ErrorKind.RETIRED, ErrorKind.STALE_ATTEMPT):
        run.stop(str(err), err.kind)


async def replayed(chunks: list[bytes]) -> AsyncIterator[bytes]:
    """A journaled stream, chunk by chunk as it was received."""
    for c in chunks:
        yield c


def revision_of(data: bytes, header: str | None) -> int | None:
    """The tool session's revision after a call: rollcut's answer field, or a bare answer's header."""
    if header is not None and header.isdigit():
        return int(header)
    try:
        answer = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    rev = answer.get("revision") if isinstance(answer, dict) else None
    return rev if isinstance(rev, int) and not isinstance(rev, bool) and rev >= 0 else None


NG_ROW_KEY = "responses_create_params"
"""The field that makes a task a NeMo Gym row."""


def answer_response(ident: Identity, task: dict[str, Any], answer: str) -> dict[str, Any]:
    """The Responses API object NeMo Gym's ``/verify`` grades, for an opaque agent's answer.

    An opaque program reports its answer, not a Response; this is the Response of that answer as
    the episode's last assistant message (what a NeMo Gym verifier reads: its final output text),
    with the request's model and tools echoed. The episode's transcript is the journal on the log,
    not this object."""
    params = task.get(NG_ROW_KEY) or {}
    rid = f"{ident.rollout_id}-a{ident.attempt}"
    tools = [t for t in params.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
    return {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": 0.0,
        "model": str(params.get("model") or "rollcut-local"),
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": f"msg_{rid}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": answer, "annotations": []}],
            }
        ],
        "parallel_tool_calls": bool(params.get("parallel_tool_calls", True)),
        "tool_choice": params.get("tool_choice") or "auto",
        "tools": tools,
    }
