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
import contextlib
from collections.abc import AsyncIterator
from typing import TypedDict, Unpack

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError

from .._errors import (
    BusError,
    BusFullError,
    CorruptEventError,
    FenceError,
    SchemaError,
    StaleAttemptError,
)
from .._gc import paused
from .._tracing import TRACEPARENT, traceparent
from ._api import StreamApi
from ._authority import authority_error
from ._codec import Codec
from ._commit import GroupCommit, Outcome
from ._events import (
    Event,
    RolloutEvent,
)
from ._fence import EXPECT_SEQ as _EXPECT_SEQ
from ._fence import EXPECT_SUBJ as _EXPECT_SUBJ
from ._fence import MSG_ID as _MSG_ID
from ._fence import FenceOps, FenceState, OpenFences, input_digest
from ._patience import gone_flag
from ._read import RawMessage, scan, scan_merged
from ._renewal import Renewals, SelfRenewal, Ticket, keep_renewed, lifetime
from ._stream import (
    ERR_WRONG_LAST_SEQUENCE,
    ERRS_OUT_OF_ROOM,
    BusConfig,
    Denials,
    connect,
    ensure_stream,
)
from ._subjects import Subjects, is_fence_kind

__all__ = ["EventLog", "FenceState", "ReadScope", "StoredEvent", "input_digest"]

_GONE_CLOSE_S = 2.0
"""How long closing a connection to a bus that is gone (or that failed under a drain) may take."""


class ReadScope(TypedDict, total=False):
    """What :meth:`EventLog.read` and :meth:`EventLog.read_pages` read: the whole stream, one
    rollout (its fence plus all attempts) or one attempt's events, ``start <= seq <= up_to``;
    ``strict=False`` yields a corrupt record with its error instead of raising; ``component``
    (without a rollout) reads only every rollout's events of that component."""

    rollout_id: str | None
    component: str | None
    attempt: int | None
    up_to: int | None
    start: int
    strict: bool


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


class EventLog(StreamApi, FenceOps):
    """One connection's view of one namespace's event stream."""

    def __init__(
        self,
        nc: NATS,
        config: BusConfig,
        *,
        owns_connection: bool = False,
        denials: Denials | None = None,
        closed: asyncio.Event | None = None,
    ) -> None:
        self.nc = nc
        self.config = config
        self.subjects = Subjects(config.namespace)
        self.codec = Codec()
        self._owns = owns_connection
        self._commit = GroupCommit(nc, config, denials=denials)
        # rollout_id -> (attempt, fence seq) for attempts this process saw open.
        self._open = OpenFences()
        # the highest sequence this log appended: a participant's "last appended" at prepare
        self.last_appended = 0
        self._replicated(config.replicas)
        self._closing = False
        self._closed = closed or asyncio.Event()  # set when the connection closed, whoever closed it
        self._renewing: asyncio.Future[None] | None = None
        self.identity_renewals = 0  # times this log's identity was issued again and reconnected with

    @classmethod
    async def connect(
        cls, config: BusConfig, *, name: str = "rollcut", renewals: Renewals | None = None
    ) -> EventLog:
        """Connect; an identity that expires is renewed while the log is open (``renewals``, or the
        config's own signing key; with neither it ends at its expiry, and the log is lost)."""
        denials, closed = Denials(), asyncio.Event()
        jwt = config.user_jwt
        ticket = Ticket(renewals.newest(jwt) if renewals else jwt) if jwt else None  # a slow start's newest

        async def on_closed() -> None:
            closed.set()

        nc = await connect(config, name=name, denials=denials, on_closed=on_closed, ticket=ticket)
        log = cls(nc, config, owns_connection=True, denials=denials, closed=closed)
        try:
            log._replicated(await ensure_stream(nc, log.subjects, config))
        except BaseException:
            await nc.close()
            raise
        if ticket is not None and lifetime(ticket.jwt) is not None:
            renewals = renewals or (SelfRenewal(config.signing_seed) if config.signing_seed else None)
            if renewals is not None:
                log._renewing = asyncio.ensure_future(keep_renewed(nc, ticket, renewals, log._renewed))
        return log

    def _renewed(self) -> None:
        self.identity_renewals += 1

    def _replicated(self, replicas: int) -> None:
        """What the stream's replica count changes here: above 1, reads that a compare-and-set starts
        from ask the leader (``_api``), and the group commit keeps one checked write per subject in
        flight (``_commit``)."""
        self.replicas = replicas
        self._commit.one_in_flight_per_subject = replicas > 1
        # a read up to a cut asks the leader where a replica's pages end early (``_read.scan``)
        self._confirm = self.next_stored if replicas > 1 else None

    @property
    def lost_why(self) -> str | None:
        """Why the bus closed this connection for good while its owner still used it (a revoked
        identity: another process took the instance name), or None while it has not."""
        if self._closing or not self._closed.is_set():
            return None
        return f"the bus closed this connection for good ({self.nc.last_error!r})"

    async def wait_lost(self) -> str:
        """Until the bus closes this connection for good: why (see :attr:`lost_why`)."""
        await self._closed.wait()
        return self.lost_why or "this log closed its connection"

    def give_up(self) -> None:
        """Declare the bus gone: every request of this log still riding an outage out fails now,
        naming what the bus last said, instead of after ``outage_s`` each (a collection that stops
        for a requeue, ``collect/_buswatch.py``). Not undone: the log is to be closed."""
        flag = gone_flag(self.nc)
        if flag is not None:
            flag.set()

    async def close(self) -> None:
        """Sends what is pending and closes the connection, if this log opened it.

        A bus that is gone (``give_up``) is not drained into, and its connection's close is bounded:
        nats-py flushes what it still buffers before it closes the socket, and on a host cut off from
        the network that flush waits out TCP's retransmissions (minutes) or fails with
        ``ConnectionResetError`` (seen in CI: a collection that should have exited 75 for a requeue
        hung, or exited 74). Nothing acknowledged is lost by not waiting: what it buffered was never
        acknowledged."""
        self._closing = True
        if self._renewing is not None:
            self._renewing.cancel()
        await self._commit.close()
        if not self._owns:
            return
        flag = gone_flag(self.nc)
        if flag is None or not flag.is_set():
            try:
                await self.nc.drain()
                return
            except (NatsError, OSError):
                pass  # the connection failed under the drain: closed below, bounded
        with contextlib.suppress(NatsError, OSError, TimeoutError):
            await asyncio.wait_for(self.nc.close(), _GONE_CLOSE_S)

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
        subject, frame = self._encode(event)
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
        tp = traceparent()  # the span this event was written under (rollcut._tracing), when tracing
        if tp:
            headers[TRACEPARENT] = tp
            lines += f"{TRACEPARENT}: {tp}\r\n".encode()
        out = await self._commit.submit(subject, frame, headers, lines)
        if out.err_code == ERR_WRONG_LAST_SEQUENCE and isinstance(event, RolloutEvent):
            self._open.pop(event.rollout_id, None)
            state = await self.fence_state(event.rollout_id)
            current = state.attempt if state is not None and state.open else None
            raise StaleAttemptError(event.rollout_id, event.attempt, current)
        self._raise_other(out, event)
        if out.seq > self.last_appended:
            self.last_appended = out.seq
        return out.seq

    async def claim(self, event: RolloutEvent) -> int | None:
        """Append ``event`` only as its component's first record in its attempt, by any instance;
        None if one is there. A compare-and-set across those instances' subjects, not on the fence:
        a stale attempt's claim may be stored, but every write it would then make is fenced."""
        every = self.subjects.event(event.rollout_id, event.attempt, event.component, "*")
        return await self._append_if_last(event, 0, every)

    async def append_expecting(self, event: Event, expect_last_seq: int) -> int | None:
        """Append only if the event's subject still ends at ``expect_last_seq`` (0: empty).

        A compare-and-set on one subject; returns None when someone else
        appended there first. The coordinator's lane lock is built on this.
        """
        if isinstance(event, RolloutEvent):
            raise FenceError("rollout events are fenced by their attempt, not by append_expecting")
        return await self._append_if_last(event, expect_last_seq)

    async def _append_if_last(self, event: Event, expect_last_seq: int, on: str | None = None) -> int | None:
        """The compare-and-set on the event's own subject (or the subjects ``on`` matches); None when
        their last sequence moved."""
        subject, frame = self._encode(event)
        headers = {_MSG_ID: event.event_id, _EXPECT_SEQ: str(expect_last_seq)}
        if on is not None:
            headers[_EXPECT_SUBJ] = on
        out = await self._commit.submit(subject, frame, headers)
        if out.err_code == ERR_WRONG_LAST_SEQUENCE:
            return None
        self._raise_other(out, event)
        self.last_appended = max(self.last_appended, out.seq)
        return out.seq

    async def last_on(self, subject: str, *, strict: bool = False) -> StoredEvent | None:
        """The last record stored on one subject, or None. A bad record comes back quarantined
        (``event`` None, ``error`` set) unless ``strict``: a caller asking "what is last here" gets
        an answer, and a compare-and-set on the subject still has its sequence."""
        msg = await self._direct_last(subject)
        return None if msg is None else self._decode(msg, strict=strict)

    def _raise_other(self, out: Outcome, event: Event) -> None:
        if out.err_code:
            error = BusFullError if out.err_code in ERRS_OUT_OF_ROOM else BusError
            raise error(
                f"append of {type(event).__name__} {event.event_id} refused: "
                f"{out.err_code} {out.description}",
                stream=self.stream,
                subject=self.subjects.for_event(event),
                rollout_id=getattr(event, "rollout_id", None),
                attempt=getattr(event, "attempt", None),
            )

    # --- read ---------------------------------------------------------------------

    async def last_seq(self) -> int:
        """The stream's last sequence, from its leader; asked again while no leader answers."""
        return int((await self.stream_info()).state.last_seq)

    async def read(self, **scope: Unpack[ReadScope]) -> AsyncIterator[StoredEvent]:
        """Events in stream order with ``start <= seq <= up_to`` (see :class:`ReadScope`):
        ``strict=False`` lets replay quarantine just the rollout a corrupt record belongs to."""
        async for page in self.read_pages(**scope):
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
        component: str | None = None,
    ) -> AsyncIterator[list[StoredEvent]]:
        """Like :meth:`read`, a page at a time: bulk consumers skip a hop per event. With
        ``component``, in stream order within each subject shape (a Gym server role's events on
        their writers' subjects first, then any on the shape written before)."""
        if attempt is not None and rollout_id is None:
            raise FenceError("reading one attempt needs its rollout_id too")
        if up_to is None and self._confirm is not None:
            # "to the end" is the end the leader has now: a replica that is behind would end sooner
            up_to = await self.last_seq()
        if rollout_id is None:
            subjects: list[str | None] = [None]
            if component is not None:
                subjects = [*self.subjects.component_filters(component)]
            for subject in subjects:
                pages = scan(
                    self.nc,
                    self.stream,
                    start=start,
                    up_to=up_to,
                    subject=subject,
                    outage_s=self.config.outage_s,
                    confirm=self._confirm,
                )
                async for pg in pages:
                    with paused():
                        decoded = [self._decode(m, strict) for m in pg]
                    yield decoded
            return
        if attempt is not None:
            filters = [self.subjects.attempt_filter(rollout_id, attempt)]
        else:
            filters = self.subjects.rollout_filters(rollout_id)
        msgs = await scan_merged(
            self.nc,
            self.stream,
            filters,
            start=start,
            up_to=up_to,
            outage_s=self.config.outage_s,
            confirm=self._confirm,
        )
        with paused():
            decoded = [self._decode(m, strict) for m in msgs]
        yield decoded

    def _encode(self, event: Event) -> tuple[str, bytes]:
        """Where an event goes and its frame: a body that disagrees with its subject is refused
        here, before anything is sent (readers would quarantine it)."""
        subject = self.subjects.for_event(event)
        why = authority_error(self.subjects, subject, event)
        if why is not None:
            raise SchemaError(f"{type(event).__name__}: {why}")
        return subject, self.codec.encode(event)

    def _decode(self, m: RawMessage, strict: bool) -> StoredEvent:
        """A stored record, or its quarantine: a bad frame, a kind or version this rollcut does not
        know, an invalid field, or a body that disagrees with the subject it is stored on."""
        try:
            ev = self.codec.decode(m.data, stream=self.stream, seq=m.seq, subject=m.subject)
            why = authority_error(self.subjects, m.subject, ev)
            if why is not None:
                raise CorruptEventError(f"authority: {why}", stream=self.stream, seq=m.seq, subject=m.subject)
        except SchemaError as exc:
            if strict:
                raise
            err = CorruptEventError(str(exc), stream=self.stream, seq=m.seq, subject=m.subject)
            return StoredEvent(m.seq, m.subject, None, err)
        except CorruptEventError as exc:
            if strict:
                raise
            return StoredEvent(m.seq, m.subject, None, exc)
        return StoredEvent(m.seq, m.subject, ev, None, self.subjects)

    async def _fence_history(self, fence: str, up_to: int) -> list[RawMessage]:
        return await scan_merged(
            self.nc, self.stream, [fence], up_to=up_to, outage_s=self.config.outage_s, confirm=self._confirm
        )
