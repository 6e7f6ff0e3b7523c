"""The event log: fenced, de-duplicated, group-committed appends and ordered reads.

Fencing. A rollout's fence subject holds its attempt lifecycle. Dispatch opens
attempt 1 (and may happen only once: it expects the fence subject empty);
tombstoning N and opening N+1 each expect the fence's current last sequence,
so two restorers cannot both win. Every event of ``(r, N)`` carries
``Nats-Expected-Last-Subject-Sequence = <seq at which N opened>`` against
``rc.<ns>.fence.<r>``; once anything else is written to the fence, the
server itself refuses N's late writes (err 10071), whatever the writer
believes. rollcut turns that refusal into :class:`StaleAttemptError`.

Idempotency. Each event's ``event_id`` is its ``Nats-Msg-Id``; a retried
append inside the stream's duplicate window is stored once and answers with
the original sequence.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from .._errors import (
    AttemptConflictError,
    BusError,
    CorruptEventError,
    FenceError,
    RolloutExistsError,
    StaleAttemptError,
)
from ._codec import Codec, digest
from ._commit import GroupCommit, Outcome
from ._events import (
    AttemptOpened,
    AttemptTombstoned,
    Event,
    RolloutDispatched,
    RolloutEvent,
    RolloutRetired,
    new_event_id,
)
from ._read import RawMessage, scan, scan_merged
from ._stream import ERR_WRONG_LAST_SEQUENCE, BusConfig, Denials, connect, ensure_stream
from ._subjects import Subjects, is_fence_kind

__all__ = ["EventLog", "FenceState", "StoredEvent", "input_digest"]

_EXPECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
_EXPECT_SUBJ = "Nats-Expected-Last-Subject-Sequence-Subject"
_MSG_ID = "Nats-Msg-Id"


def input_digest(value: Any) -> str:
    """Digest of a rollout input, independent of dict key order."""
    return digest(msgspec.json.encode(value, order="sorted"))


class StoredEvent:
    """An event as read back: its stream position and either the event or why not.

    On a body-only read the subject is worked out from the event only when
    someone asks: replay of a healthy log never needs it.
    """

    __slots__ = ("_subject", "_subjects", "error", "event", "seq")

    def __init__(
        self,
        seq: int,
        subject: str,
        event: Event | None,
        error: CorruptEventError | None = None,
        subjects: Subjects | None = None,
    ) -> None:
        self.seq = seq
        self.event = event
        self.error = error
        self._subject = subject
        self._subjects = subjects

    @property
    def subject(self) -> str:
        if not self._subject and self.event is not None and self._subjects is not None:
            self._subject = self._subjects.for_event(self.event)
        return self._subject

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredEvent):
            return NotImplemented
        mine = (self.seq, self.subject, self.event, self.error)
        return mine == (other.seq, other.subject, other.event, other.error)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StoredEvent(seq={self.seq}, subject={self.subject!r}, event={self.event!r}, error={self.error!r})"  # noqa: E501


class FenceState(msgspec.Struct, frozen=True):
    """Where a rollout's attempt lifecycle stands."""

    rollout_id: str
    attempt: int  # the latest attempt named on the fence
    seq: int  # stream sequence of the latest fence message
    open: bool  # False once that attempt is tombstoned
    retired: bool = False  # terminal: no attempt opens again


class EventLog:
    """One connection's view of one namespace's event stream."""

    def __init__(
        self, nc: NATS, config: BusConfig, *, owns_connection: bool = False, denials: Denials | None = None
    ) -> None:
        self.nc = nc
        self.config = config
        self.subjects = Subjects(config.namespace)
        self.codec = Codec()
        self._owns = owns_connection
        self._commit = GroupCommit(
            nc,
            max_batch=config.max_batch,
            max_inflight=config.max_inflight,
            timeout=config.request_timeout_s,
            denials=denials,
        )
        # rollout_id -> (attempt, fence seq) for attempts this process saw open.
        self._open: dict[str, tuple[int, int]] = {}
        # the highest sequence this log appended: a participant's "last appended" at prepare
        self.last_appended = 0

    @classmethod
    async def connect(cls, config: BusConfig, *, name: str = "rollcut") -> EventLog:
        denials = Denials()
        nc = await connect(config, name=name, denials=denials)
        log = cls(nc, config, owns_connection=True, denials=denials)
        try:
            await ensure_stream(nc, log.subjects, config)
        except BaseException:
            await nc.close()
            raise
        return log

    async def close(self) -> None:
        await self._commit.close()
        if self._owns:
            try:
                await self.nc.drain()
            except NatsError:
                await self.nc.close()

    async def __aenter__(self) -> EventLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def stream(self) -> str:
        return self.subjects.stream

    @property
    def stats(self) -> dict[str, int]:
        c = self._commit
        return {"batches": c.batches_sent, "singles": c.singles_sent, "fallbacks": c.fallbacks}

    # --- fence --------------------------------------------------------------------

    async def fence_state(self, rollout_id: str) -> FenceState | None:
        """Read the fence subject's last message; None if never dispatched."""
        msg = await self._direct_last(self.subjects.fence(rollout_id))
        if msg is None:
            return None
        ev = self.codec.decode(msg.data, stream=self.stream, seq=msg.seq, subject=msg.subject)
        if isinstance(ev, RolloutDispatched | AttemptOpened):
            return FenceState(rollout_id, ev.attempt, msg.seq, True)
        if isinstance(ev, AttemptTombstoned):
            return FenceState(rollout_id, ev.attempt, msg.seq, False)
        if isinstance(ev, RolloutRetired):
            return FenceState(rollout_id, ev.attempt, msg.seq, False, True)
        raise CorruptEventError(
            f"{type(ev).__name__} on a fence subject", stream=self.stream, seq=msg.seq, subject=msg.subject
        )

    async def dispatch(
        self,
        rollout_id: str,
        input: Any,
        *,
        instance: str,
        component: str = "collector",
        event_id: str | None = None,
    ) -> int:
        """Record a rollout's original input and open attempt 1. Returns the fence seq."""
        ev = RolloutDispatched(
            rollout_id=rollout_id,
            attempt=1,
            component=component,  # type: ignore[arg-type]
            instance=instance,
            input=input,
            input_digest=input_digest(input),
            event_id=event_id or new_event_id(),
        )
        out = await self._fence_write(ev, expect=0)
        if out.err_code == ERR_WRONG_LAST_SEQUENCE:
            raise RolloutExistsError(rollout_id)
        self._raise_other(out, ev)
        self._open[rollout_id] = (1, out.seq)
        return out.seq

    async def tombstone(
        self,
        rollout_id: str,
        attempt: int,
        *,
        instance: str,
        reason: str = "",
        next_attempt: int | None = None,
    ) -> int:
        """Close attempt ``attempt``; from here on the server refuses its writes."""
        state = await self.fence_state(rollout_id)
        if state is None or state.attempt != attempt or not state.open:
            raise AttemptConflictError(rollout_id, f"cannot tombstone attempt {attempt}: fence is at {state}")
        ev = AttemptTombstoned(
            rollout_id=rollout_id,
            attempt=attempt,
            component="coordinator",
            instance=instance,
            reason=reason,
            next_attempt=next_attempt,
        )
        out = await self._fence_write(ev, expect=state.seq)
        if out.err_code == ERR_WRONG_LAST_SEQUENCE:
            raise AttemptConflictError(rollout_id, f"the fence moved while tombstoning attempt {attempt}")
        self._raise_other(out, ev)
        self._open.pop(rollout_id, None)
        return out.seq

    async def open_attempt(
        self,
        rollout_id: str,
        attempt: int,
        *,
        instance: str,
        reason: str = "",
        checkpoint_id: str = "",
        from_cut: int = 0,
    ) -> int:
        """Open ``attempt`` after the previous one was tombstoned. Returns its fence seq."""
        state = await self.fence_state(rollout_id)
        if state is not None and state.retired:
            raise AttemptConflictError(rollout_id, f"cannot open attempt {attempt}: the rollout is retired")
        if state is None or state.open or attempt != state.attempt + 1:
            raise AttemptConflictError(rollout_id, f"cannot open attempt {attempt}: fence is at {state}")
        ev = AttemptOpened(
            rollout_id=rollout_id,
            attempt=attempt,
            component="coordinator",
            instance=instance,
            previous_attempt=state.attempt,
            reason=reason,
            checkpoint_id=checkpoint_id,
            from_cut=from_cut,
        )
        out = await self._fence_write(ev, expect=state.seq)
        if out.err_code == ERR_WRONG_LAST_SEQUENCE:
            raise AttemptConflictError(rollout_id, f"the fence moved while opening attempt {attempt}")
        self._raise_other(out, ev)
        self._open[rollout_id] = (attempt, out.seq)
        return out.seq

    async def retire(
        self, rollout_id: str, *, instance: str, reason: str = "", component: str = "collector"
    ) -> FenceState:
        """Give the rollout up for good: its current attempt's writes are refused from here on.

        Idempotent (retiring a retired rollout returns its state); a concurrent
        supersede is retried against the fence's new position, so the retirement
        wins whatever attempt it finds.
        """
        for _ in range(16):
            state = await self.fence_state(rollout_id)
            if state is None:
                raise AttemptConflictError(rollout_id, "cannot retire a rollout that was never dispatched")
            if state.retired:
                return state
            ev = RolloutRetired(
                rollout_id=rollout_id,
                attempt=state.attempt,
                component=component,  # type: ignore[arg-type]
                instance=instance,
                reason=reason,
            )
            out = await self._fence_write(ev, expect=state.seq)
            if out.err_code == ERR_WRONG_LAST_SEQUENCE:
                continue  # the fence moved under us: look again
            self._raise_other(out, ev)
            self._open.pop(rollout_id, None)
            return FenceState(rollout_id, state.attempt, out.seq, False, True)
        raise AttemptConflictError(rollout_id, "the fence kept moving while retiring")

    async def supersede(
        self,
        rollout_id: str,
        attempt: int,
        *,
        instance: str,
        reason: str = "",
        checkpoint_id: str = "",
        from_cut: int = 0,
    ) -> int:
        """Tombstone ``attempt`` and open ``attempt + 1``; returns the new attempt."""
        await self.tombstone(rollout_id, attempt, instance=instance, reason=reason, next_attempt=attempt + 1)
        await self.open_attempt(
            rollout_id,
            attempt + 1,
            instance=instance,
            reason=reason,
            checkpoint_id=checkpoint_id,
            from_cut=from_cut,
        )
        return attempt + 1

    async def _fence_write(self, ev: RolloutEvent, *, expect: int) -> Outcome:
        frame = self.codec.encode(ev)
        headers = {_MSG_ID: ev.event_id, _EXPECT_SEQ: str(expect)}
        return await self._commit.submit(self.subjects.fence(ev.rollout_id), frame, headers)

    async def _fence_seq_for(self, rollout_id: str, attempt: int) -> int:
        known = self._open.get(rollout_id)
        if known is not None and known[0] == attempt:
            return known[1]
        state = await self.fence_state(rollout_id)
        if state is None:
            raise FenceError(f"rollout {rollout_id!r} was never dispatched")
        if not state.open or state.attempt != attempt:
            raise StaleAttemptError(rollout_id, attempt, state.attempt if state.open else None)
        self._open[rollout_id] = (attempt, state.seq)
        return state.seq

    # --- append -------------------------------------------------------------------

    async def append_many(self, events: list[Event]) -> list[int]:
        """Append several events concurrently (they may share one commit)."""
        return list(await asyncio.gather(*(self.append(e) for e in events)))

    async def append(self, event: Event) -> int:
        """Append one event; returns its stream sequence once it is durable.

        Write before you act: a participant calls this and waits before it
        replies to its caller, so every effect's causes sit at lower sequences.
        """
        if is_fence_kind(event):
            raise FenceError(f"{type(event).__name__} is written by dispatch/tombstone/open_attempt")
        frame = self.codec.encode(event)
        eid = event.event_id
        if isinstance(event, RolloutEvent):
            known = self._open.get(event.rollout_id)
            if known is not None and known[0] == event.attempt:
                fence_seq = known[1]
            else:
                fence_seq = await self._fence_seq_for(event.rollout_id, event.attempt)
            fence = self.subjects.fence(event.rollout_id)
            headers = {_MSG_ID: eid, _EXPECT_SEQ: str(fence_seq), _EXPECT_SUBJ: fence}
            lines = f"{_MSG_ID}: {eid}\r\n{_EXPECT_SEQ}: {fence_seq}\r\n{_EXPECT_SUBJ}: {fence}\r\n".encode()
        else:
            headers = {_MSG_ID: eid}
            lines = f"{_MSG_ID}: {eid}\r\n".encode()
        out = await self._commit.submit(self.subjects.for_event(event), frame, headers, lines)
        if out.err_code == ERR_WRONG_LAST_SEQUENCE and isinstance(event, RolloutEvent):
            self._open.pop(event.rollout_id, None)
            state = await self.fence_state(event.rollout_id)
            current = state.attempt if state is not None and state.open else None
            raise StaleAttemptError(event.rollout_id, event.attempt, current)
        self._raise_other(out, event)
        if out.seq > self.last_appended:
            self.last_appended = out.seq
        return out.seq

    async def append_expecting(self, event: Event, expect_last_seq: int) -> int | None:
        """Append only if the event's subject still ends at ``expect_last_seq`` (0: empty).

        A compare-and-set on one subject; returns None when someone else
        appended there first. The coordinator's lane lock is built on this.
        """
        if isinstance(event, RolloutEvent):
            raise FenceError("rollout events are fenced by their attempt, not by append_expecting")
        frame = self.codec.encode(event)
        headers = {_MSG_ID: event.event_id, _EXPECT_SEQ: str(expect_last_seq)}
        out = await self._commit.submit(self.subjects.for_event(event), frame, headers)
        if out.err_code == ERR_WRONG_LAST_SEQUENCE:
            return None
        self._raise_other(out, event)
        self.last_appended = max(self.last_appended, out.seq)
        return out.seq

    async def last_on(self, subject: str) -> StoredEvent | None:
        """The last event stored on one subject, or None."""
        msg = await self._direct_last(subject)
        return None if msg is None else self._decode(msg, strict=True)

    def _raise_other(self, out: Outcome, event: Event) -> None:
        if out.err_code:
            raise BusError(
                f"append of {type(event).__name__} {event.event_id} refused: "
                f"{out.err_code} {out.description}",
                stream=self.stream,
                subject=self.subjects.for_event(event),
                rollout_id=getattr(event, "rollout_id", None),
                attempt=getattr(event, "attempt", None),
            )

    # --- read ---------------------------------------------------------------------

    async def last_seq(self) -> int:
        info = await self.nc.jetstream().stream_info(self.stream)
        return int(info.state.last_seq)

    async def read(
        self,
        *,
        rollout_id: str | None = None,
        attempt: int | None = None,
        up_to: int | None = None,
        start: int = 1,
        strict: bool = True,
    ) -> AsyncIterator[StoredEvent]:
        """Events in stream order with ``start <= seq <= up_to``.

        Scope: the whole stream, one rollout (its fence plus all attempts), or
        one attempt's events. ``strict=False`` yields a corrupt record with its
        error instead of raising, so replay can quarantine just that rollout.
        """
        async for page in self.read_pages(
            rollout_id=rollout_id, attempt=attempt, up_to=up_to, start=start, strict=strict
        ):
            for stored in page:
                yield stored

    async def read_pages(
        self,
        *,
        rollout_id: str | None = None,
        attempt: int | None = None,
        up_to: int | None = None,
        start: int = 1,
        strict: bool = True,
    ) -> AsyncIterator[list[StoredEvent]]:
        """Like :meth:`read`, a page at a time: bulk consumers skip a hop per event."""
        if attempt is not None and rollout_id is None:
            raise FenceError("reading one attempt needs its rollout_id too")
        if rollout_id is None:
            async for pg in scan(self.nc, self.stream, start=start, up_to=up_to):
                out = [self._decode(m, strict=False) for m in pg]
                for i, stored in enumerate(out):
                    if stored.error is not None:
                        if not stored.subject:  # body-only page: fetch the name
                            out[i] = stored = await self._named(stored)
                        if strict:
                            raise stored.error  # type: ignore[misc]
                yield out
            return
        if attempt is not None:
            filters = [self.subjects.attempt_filter(rollout_id, attempt)]
        else:
            filters = self.subjects.rollout_filters(rollout_id)
        msgs = await scan_merged(self.nc, self.stream, filters, start=start, up_to=up_to)
        yield [self._decode(m, strict) for m in msgs]

    def _decode(self, m: RawMessage, strict: bool) -> StoredEvent:
        try:
            ev = self.codec.decode(m.data, stream=self.stream, seq=m.seq, subject=m.subject)
        except CorruptEventError as exc:
            if strict:
                raise
            return StoredEvent(m.seq, m.subject, None, exc)
        return StoredEvent(m.seq, m.subject, ev, None, self.subjects)

    async def _named(self, stored: StoredEvent) -> StoredEvent:
        """A corrupt record from a body-only page: ask the server for its subject."""
        msg = await self._direct_get({"seq": stored.seq}, f"seq {stored.seq}")
        subject = msg.subject if msg is not None else ""
        err = stored.error
        if err is not None:
            err = CorruptEventError(err.reason, stream=self.stream, seq=stored.seq, subject=subject)
        return StoredEvent(stored.seq, subject, None, err)

    async def _direct_last(self, subject: str) -> RawMessage | None:
        return await self._direct_get({"last_by_subj": subject}, subject)

    async def _direct_get(self, req: dict[str, object], what: str) -> RawMessage | None:
        api = f"$JS.API.DIRECT.GET.{self.stream}"
        try:
            msg = await self.nc.request(api, msgspec.json.encode(req), timeout=self.config.request_timeout_s)
        except NatsError as exc:
            raise BusError(f"direct get of {what} failed: {exc!r}", stream=self.stream) from exc
        hdrs = msg.headers or {}
        status = hdrs.get("Status")
        if status == "404":
            return None
        if status:
            raise BusError(
                f"direct get of {what} failed: {status} {hdrs.get('Description', '')}", stream=self.stream
            )
        return RawMessage(int(hdrs["Nats-Sequence"]), hdrs["Nats-Subject"], msg.data)
