"""Replay: fold the log, up to a cut, into the state of every rollout.

Because every participant writes before it acts, every prefix of the stream
is a consistent cut, so replaying up to any sequence gives a state the live
system really was in. :class:`Replayer` is the pure part (feed it stored
events); :func:`replay` drives it from an :class:`EventLog`.

A corrupt record does not abort the replay: it is attached to the rollout it
belongs to (parsed from its subject), which the restore planner then treats as
a fresh dispatch. Nothing else is affected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from .._gc import paused
from ..bus import (
    AttemptOpened,
    AttemptTombstoned,
    CheckpointEvent,
    EventLog,
    ResultAccepted,
    RolloutDispatched,
    RolloutEvent,
    RolloutRetired,
    StoredEvent,
    Subjects,
    spec_of,
)
from ._fold import FoldRegistry, default_registry
from ._lineage import Segment, lineage

__all__ = ["AttemptState", "ReplayResult", "Replayer", "RolloutState", "replay"]


class AttemptState(msgspec.Struct, kw_only=True):
    """One attempt of a rollout as replayed: where it opened, and each component's session."""

    attempt: int
    opened_seq: int = 0
    from_cut: int = 0
    first_seq: int = 0
    tombstoned_seq: int | None = None
    holders: dict[str, str] = {}
    """Per Gym server role, the instance that wrote the attempt's first event of it (from the
    subject: the server lets an instance write on its own only)."""
    foreign: str | None = None
    """Why the attempt cannot be shown to be one run: an instance of a role wrote in it while another
    instance of that role holds it."""
    foreign_seq: int = 0
    sessions: dict[str, Any] = {}
    events: int = 0
    last_seq: int = 0


class RolloutState(msgspec.Struct, kw_only=True):
    """One rollout as replayed: its input, attempts, and whether it was accepted or retired."""

    rollout_id: str
    input: Any = None
    input_digest: str = ""
    dispatch_seq: int = 0
    current_attempt: int = 0
    open: bool = False
    attempts: dict[int, AttemptState] = {}
    accepted: ResultAccepted | None = None
    accepted_seq: int | None = None
    retired: str | None = None  # the reason, once retired
    last_seq: int = 0
    corrupt_seqs: list[int] = []

    @property
    def status(self) -> str:
        if self.accepted is not None:
            return "accepted"
        if self.retired is not None:
            return "retired"
        if self.corrupt_seqs:
            return "corrupt"
        if not self.dispatch_seq:
            return "unknown"
        return "running" if self.open else "tombstoned"

    def current(self) -> AttemptState | None:
        return self.attempts.get(self.current_attempt)

    def lineage(self, cut: int) -> list[Segment]:
        """The attempts (each up to a bound) whose events make up this rollout's state at ``cut``."""
        opened = {a.attempt: (a.opened_seq, a.from_cut) for a in self.attempts.values() if a.opened_seq}
        return lineage(opened, cut)

    def foreign_at(self, cut: int) -> str | None:
        """Why the rollout's state at ``cut`` cannot be shown to be one run: an attempt of its lineage
        there was written in by two instances of one role by then (a restore restarts it from its
        input); None when it can."""
        for seg in self.lineage(cut):
            a = self.attempts[seg.attempt]
            if a.foreign is not None and a.foreign_seq <= seg.up_to:
                return a.foreign
        return None

    def progressed(self, cut: int) -> bool:
        """Whether any attempt of the lineage at ``cut`` had done something by then."""
        return any(
            0 < (a := self.attempts[seg.attempt]).first_seq <= seg.up_to and a.sessions
            for seg in self.lineage(cut)
        )


class ReplayResult(msgspec.Struct, kw_only=True):
    """Every rollout's state as of a cut, and the checkpoint markers below it."""

    cut: int
    rollouts: dict[str, RolloutState] = {}
    markers: list[tuple[int, CheckpointEvent]] = []
    events: int = 0


class Replayer:
    """Folds stored events, one at a time, in stream order.

    ``keep_finished=False`` is the streaming fold: once a rollout's result is accepted or it is
    retired, its sessions are dropped and its later events only counted, so what a replay holds
    is bounded by the rollouts still running, not by the length of the history. A restore wants
    exactly that (a finished rollout is never rebuilt); an inspection of one rollout keeps all.
    """

    def __init__(
        self, subjects: Subjects, registry: FoldRegistry | None = None, *, keep_finished: bool = True
    ) -> None:
        self.subjects = subjects
        self.registry = registry or default_registry()
        self.keep_finished = keep_finished
        self.result = ReplayResult(cut=0)
        self._lifecycle: dict[type, Callable[[StoredEvent, Any], None]] = {
            RolloutDispatched: self._dispatched,
            AttemptOpened: self._opened,
            AttemptTombstoned: self._tombstoned,
            RolloutRetired: self._retired,
        }

    def _rollout(self, rollout_id: str) -> RolloutState:
        r = self.result.rollouts.get(rollout_id)
        if r is None:
            r = self.result.rollouts[rollout_id] = RolloutState(rollout_id=rollout_id)
        return r

    def _attempt(self, r: RolloutState, attempt: int) -> AttemptState:
        a = r.attempts.get(attempt)
        if a is None:
            a = r.attempts[attempt] = AttemptState(attempt=attempt)
        return a

    def apply(self, stored: StoredEvent) -> None:
        res = self.result
        if stored.seq > res.cut:
            res.cut = stored.seq
        res.events += 1
        ev = stored.event
        if ev is None:
            self._corrupt(stored)
            return
        handler = self._lifecycle.get(type(ev))
        if handler is not None:
            handler(stored, ev)
            return
        if isinstance(ev, CheckpointEvent):
            res.markers.append((stored.seq, ev))
            return
        if not isinstance(ev, RolloutEvent):
            return
        r = self._rollout(ev.rollout_id)
        r.last_seq = stored.seq
        a = self._attempt(r, ev.attempt)
        a.events += 1
        a.last_seq = stored.seq
        if not a.first_seq:
            a.first_seq = stored.seq
        writer = self.subjects.parse(stored.subject).instance
        if writer is not None:
            holder = a.holders.setdefault(ev.component, writer)
            if holder != writer and a.foreign is None:
                a.foreign_seq = stored.seq
                a.foreign = (
                    f"{writer} wrote {spec_of(ev).kind} (seq {stored.seq}) in attempt {ev.attempt}, "
                    f"which {holder} holds for {ev.component}"
                )
        if type(ev) is ResultAccepted:
            r.accepted, r.accepted_seq = ev, stored.seq
            self._finished(r)
            return
        if not self.keep_finished and (r.accepted is not None or r.retired is not None):
            return
        fold = self.registry.get(ev.component)
        if fold is None:
            return
        session = a.sessions.get(ev.component)
        if session is None:
            session = fold.initial()
        a.sessions[ev.component] = fold.apply(session, stored)

    def _corrupt(self, stored: StoredEvent) -> None:
        parsed = self.subjects.parse(stored.subject)
        if parsed.rollout_id is not None:
            r = self._rollout(parsed.rollout_id)
            r.corrupt_seqs.append(stored.seq)
            r.last_seq = stored.seq

    def _dispatched(self, stored: StoredEvent, ev: RolloutDispatched) -> None:
        r = self._rollout(ev.rollout_id)
        r.last_seq = stored.seq
        r.input, r.input_digest, r.dispatch_seq = ev.input, ev.input_digest, stored.seq
        r.current_attempt, r.open = 1, True
        self._attempt(r, 1).opened_seq = stored.seq

    def _opened(self, stored: StoredEvent, ev: AttemptOpened) -> None:
        r = self._rollout(ev.rollout_id)
        r.last_seq = stored.seq
        r.current_attempt, r.open = ev.attempt, True
        a = self._attempt(r, ev.attempt)
        a.opened_seq, a.from_cut = stored.seq, ev.from_cut

    def _tombstoned(self, stored: StoredEvent, ev: AttemptTombstoned) -> None:
        r = self._rollout(ev.rollout_id)
        r.last_seq = stored.seq
        r.open = False
        self._attempt(r, ev.attempt).tombstoned_seq = stored.seq

    def _retired(self, stored: StoredEvent, ev: RolloutRetired) -> None:
        r = self._rollout(ev.rollout_id)
        r.last_seq = stored.seq
        r.open, r.retired = False, ev.reason
        self._attempt(r, ev.attempt).tombstoned_seq = stored.seq
        self._finished(r)

    def _finished(self, r: RolloutState) -> None:
        if not self.keep_finished:
            for a in r.attempts.values():
                a.sessions = {}


async def replay(
    log: EventLog,
    *,
    up_to: int | None = None,
    rollout_id: str | None = None,
    registry: FoldRegistry | None = None,
    keep_finished: bool = True,
) -> ReplayResult:
    """The state of every rollout (or one) as of ``up_to`` (default: the end now); with
    ``keep_finished=False`` finished rollouts keep their status but not their sessions."""
    cut = up_to if up_to is not None else await log.last_seq()
    rp = Replayer(log.subjects, registry, keep_finished=keep_finished)
    apply = rp.apply
    async for page in log.read_pages(rollout_id=rollout_id, up_to=cut, strict=False):
        with paused():
            for stored in page:
                apply(stored)
    rp.result.cut = cut
    return rp.result
