"""The attempt lifecycle on a rollout's fence subject: dispatch, tombstone, open, retire.

Dispatch opens attempt 1 and may happen only once (it expects the fence
subject empty); tombstoning N and opening N+1 each expect the fence's current
last sequence, so of two restorers exactly one wins. Every event of ``(r, N)``
is then appended expecting the sequence at which N opened, so once anything
else is written to the fence the server refuses N's late writes.
This is part of :class:`~rollcut.bus.EventLog`, kept apart because it is the
one place the lifecycle rules live.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict, Unpack

import msgspec

from .._errors import (
    AttemptConflictError,
    CorruptEventError,
    FenceError,
    RollcutError,
    RolloutExistsError,
    StaleAttemptError,
)
from ._authority import authority_error
from ._codec import Codec, digest
from ._commit import GroupCommit, Outcome
from ._events import (
    AttemptOpened,
    AttemptTombstoned,
    Component,
    Event,
    RolloutDispatched,
    RolloutEvent,
    RolloutRetired,
    new_event_id,
)
from ._read import RawMessage
from ._stream import ERR_WRONG_LAST_SEQUENCE
from ._subjects import Subjects

__all__ = [
    "EXPECT_SEQ",
    "EXPECT_SUBJ",
    "MSG_ID",
    "FenceOps",
    "FenceState",
    "OpenFences",
    "Opening",
    "input_digest",
]


class Opening(TypedDict):
    """Who opens an attempt, and why: what :meth:`FenceOps.open_attempt` and
    :meth:`FenceOps.supersede` record on the ``attempt.opened`` event."""

    instance: str
    reason: NotRequired[str]
    checkpoint_id: NotRequired[str]
    from_cut: NotRequired[int]
    reuse_completed: NotRequired[bool]


EXPECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECT_SUBJ = "Nats-Expected-Last-Subject-Sequence-Subject"
MSG_ID = "Nats-Msg-Id"


def input_digest(value: Any) -> str:
    """Digest of a rollout input, independent of dict key order."""
    return digest(msgspec.json.encode(value, order="sorted"))


class FenceState(msgspec.Struct, frozen=True):
    """Where a rollout's attempt lifecycle stands."""

    rollout_id: str
    attempt: int  # the latest attempt named on the fence
    seq: int  # stream sequence of the latest fence message
    open: bool  # False once that attempt is tombstoned
    retired: bool = False  # terminal: no attempt opens again


class OpenFences(dict[str, tuple[int, int]]):
    """Rollout id -> (attempt, fence sequence) of the attempts this process saw open: a cache of the
    most recent ``limit`` rollouts, oldest out first. A miss costs one direct get; an unbounded one
    made a process that appends for millions of rollouts hold every one it ever touched."""

    def __init__(self, limit: int = 1 << 16) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, rollout_id: str, fence: tuple[int, int]) -> None:
        if rollout_id not in self and len(self) >= self.limit:
            del self[next(iter(self))]
        super().__setitem__(rollout_id, fence)


class FenceOps:
    """The fence half of :class:`~rollcut.bus.EventLog`."""

    subjects: Subjects
    codec: Codec
    _commit: GroupCommit
    _open: dict[str, tuple[int, int]]

    async def _direct_last(self, subject: str) -> RawMessage | None:
        raise NotImplementedError

    def _raise_other(self, out: Outcome, event: Event) -> None:
        raise NotImplementedError

    async def fence_state(self, rollout_id: str) -> FenceState | None:
        """Where the rollout's attempt lifecycle stands; None if never dispatched.

        From the fence's last record; if that one is bad (garbage, a kind this
        rollcut does not know, a body that disagrees with the subject), from the
        last good one before it, while ``seq`` stays the fence's real last
        sequence, so the next compare-and-set still lands: one bad record never
        makes a rollout impossible to continue, supersede or retire.
        """
        fence = self.subjects.fence(rollout_id)
        msg = await self._direct_last(fence)
        if msg is None:
            return None
        state = self._fence_record(rollout_id, msg)
        if state is not None:
            return state
        for earlier in reversed(await self._fence_history(fence, msg.seq)):
            state = self._fence_record(rollout_id, earlier)
            if state is not None:
                return FenceState(rollout_id, state.attempt, msg.seq, state.open, state.retired)
        raise CorruptEventError(
            "no readable lifecycle record on the fence",
            stream=self.subjects.stream,
            seq=msg.seq,
            subject=fence,
        )

    def _fence_record(self, rollout_id: str, msg: RawMessage) -> FenceState | None:
        try:
            ev = self.codec.decode(msg.data, stream=self.subjects.stream, seq=msg.seq, subject=msg.subject)
        except RollcutError:
            return None
        if authority_error(self.subjects, msg.subject, ev) is not None:
            return None
        if isinstance(ev, RolloutDispatched | AttemptOpened):
            return FenceState(rollout_id, ev.attempt, msg.seq, True)
        if isinstance(ev, AttemptTombstoned):
            return FenceState(rollout_id, ev.attempt, msg.seq, False)
        if isinstance(ev, RolloutRetired):
            return FenceState(rollout_id, ev.attempt, msg.seq, False, True)
        return None

    async def _fence_history(self, fence: str, up_to: int) -> list[RawMessage]:
        raise NotImplementedError

    async def dispatch(
        self,
        rollout_id: str,
        input: Any,
        *,
        instance: str,
        component: Component = "collector",
        event_id: str | None = None,
    ) -> int:
        """Record a rollout's original input and open attempt 1. Returns the fence seq."""
        ev = RolloutDispatched(
            rollout_id=rollout_id,
            attempt=1,
            component=component,
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
        out = await self._fence_move(ev, state, f"tombstoning attempt {attempt}")
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
        reuse_completed: bool = False,
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
            reuse_completed=reuse_completed,
        )
        out = await self._fence_move(ev, state, f"opening attempt {attempt}")
        self._open[rollout_id] = (attempt, out.seq)
        return out.seq

    async def retire(
        self, rollout_id: str, *, instance: str, reason: str = "", component: Component = "collector"
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
                component=component,
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

    async def supersede(self, rollout_id: str, attempt: int, **opening: Unpack[Opening]) -> int:
        """Tombstone ``attempt`` and open ``attempt + 1``; returns the new attempt."""
        reason, next_attempt = opening.get("reason", ""), attempt + 1
        await self.tombstone(
            rollout_id, attempt, instance=opening["instance"], reason=reason, next_attempt=next_attempt
        )
        await self.open_attempt(rollout_id, next_attempt, **opening)
        return next_attempt

    async def _fence_move(self, ev: RolloutEvent, state: FenceState, doing: str) -> Outcome:
        """Append ``ev`` to the fence only if the fence is still where ``state`` saw it."""
        out = await self._fence_write(ev, expect=state.seq)
        if out.err_code == ERR_WRONG_LAST_SEQUENCE:
            raise AttemptConflictError(ev.rollout_id, f"the fence moved while {doing}")
        self._raise_other(out, ev)
        return out

    async def _fence_write(self, ev: RolloutEvent, *, expect: int) -> Outcome:
        frame = self.codec.encode(ev)
        headers = {MSG_ID: ev.event_id, EXPECT_SEQ: str(expect)}
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
