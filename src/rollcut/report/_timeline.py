"""A collection as a timeline: every attempt of every rollout, the checkpoints, the crashes.

Read from the stream and the ledger's catalog alone, so it works on any
collection home, a demo's or a week-long ``rollcut collect``'s. Times are the
events' own ``ts`` (the writers' clocks, one machine's in the demo); order and
cuts are stream sequences, which no writer chooses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..bus import (
    AttemptOpened,
    AttemptTombstoned,
    CheckpointCommitted,
    CheckpointPrepared,
    CheckpointSealed,
    Event,
    EventLog,
    ModelCallCompleted,
    ModelCallContinued,
    ModelCallReused,
    ParticipantReplied,
    ResourcesMutated,
    ResultAccepted,
    RolloutDispatched,
    RolloutEvent,
    RolloutRetired,
    handlers_by_kind,
)
from ..ledger import Ledger
from ..replay import WorkTally

__all__ = ["Attempt", "CheckpointMark", "Crash", "Timeline", "read_timeline"]

_FENCE = (RolloutDispatched, AttemptOpened, AttemptTombstoned, RolloutRetired)  # the coordinator's, not work
CRASH_GAP_S = 5.0
"""Recoveries opened within this many seconds of each other are one crash's."""


@dataclass
class Attempt:
    """One attempt of one rollout: when it worked, what it did, how it ended, what it continued."""

    rollout_id: str
    attempt: int
    opened: float = 0.0
    start: float | None = None  # its first own event (the agent claiming it, a model call...)
    end: float | None = None  # its last
    outcome: str = "running"  # accepted | retired | interrupted | running
    from_cut: int = 0
    checkpoint_id: str = ""
    reason: str = ""
    model_calls: int = 0
    tokens: int = 0
    from_log: int = 0  # model calls served from the log or continued from a durable prefix
    tool_calls: int = 0
    reward: float | None = None

    def touch(self, ts: float) -> None:
        self.start = ts if self.start is None else min(self.start, ts)
        self.end = ts if self.end is None else max(self.end, ts)


@dataclass
class CheckpointMark:
    """A published checkpoint: its cut (a stream sequence) and when it was sealed and published."""

    checkpoint_id: str
    cut: int
    prepared: float | None = None
    sealed: float | None = None
    committed: float | None = None
    recovery: bool = False  # a recovery sealed the tail here, or continued from it
    pause_ms: float | None = None  # how long the collection stood still (its commit marker says)
    waited_ms: dict[str, float] = field(default_factory=dict)  # participant -> its prepare's round trip
    inside_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # participant -> drain, export…

    @property
    def ms(self) -> float | None:
        """From the prepare to the commit marker: the checkpoint end to end, as the stream saw it."""
        if self.prepared is None or self.committed is None:
            return None
        return round((self.committed - self.prepared) * 1000, 1)


@dataclass
class Crash:
    """Attempts interrupted together and recovered together: the last sign of life before, the
    first new attempt after, and where recovery continued them from."""

    last_alive: float
    recovered: float
    interrupted: int
    checkpoint_id: str


@dataclass
class Timeline:
    """Everything ``rollcut report`` draws."""

    rollouts: list[str] = field(default_factory=list)  # in dispatch order
    attempts: dict[tuple[str, int], Attempt] = field(default_factory=dict)
    checkpoints: list[CheckpointMark] = field(default_factory=list)
    crashes: list[Crash] = field(default_factory=list)
    work: dict[str, int] = field(default_factory=dict)  # count_work's figures (a WorkTally's)
    t0: float = 0.0
    t1: float = 0.0
    events: int = 0
    corrupt: int = 0
    seen: set[str] = field(default_factory=set, repr=False)

    def of(self, rollout_id: str) -> list[Attempt]:
        """A rollout's attempts, in order."""
        out, n = [], 1
        while (rollout_id, n) in self.attempts:
            out.append(self.attempts[(rollout_id, n)])
            n += 1
        return out

    def classes(self) -> dict[str, int]:
        """How many rollouts ended up each way (each rollout counted once)."""
        out = dict.fromkeys(("first attempt", "continued", "started over", "retired", "unfinished"), 0)
        for rid in self.rollouts:
            tries = self.of(rid)
            if any(a.outcome == "retired" for a in tries):
                out["retired"] += 1
            elif not tries or tries[-1].outcome != "accepted":
                out["unfinished"] += 1
            elif len(tries) == 1:
                out["first attempt"] += 1
            elif any(a.from_cut > 0 for a in tries[1:]):
                out["continued"] += 1
            else:
                out["started over"] += 1
        return out

    def cut_time(self, cut: int) -> float | None:
        """When the stream reached ``cut``, if a published checkpoint sealed there."""
        return next((c.sealed for c in self.checkpoints if c.cut == cut), None)


async def read_timeline(log: EventLog, ledger: Ledger) -> Timeline:
    """The timeline of everything the stream holds (what compaction let go is not drawn)."""
    tl = Timeline()
    marks = {c.checkpoint_id: CheckpointMark(c.checkpoint_id, c.cut) for c in ledger.checkpoints()}
    first_ts: float | None = None
    tally = WorkTally()  # what was kept and done again, counted in the same pass
    async for s in log.read(strict=False):
        ev = s.event
        if ev is None:
            tl.corrupt += 1
            continue
        tl.events += 1
        tally.add(s.seq, ev)
        first_ts = ev.ts if first_ts is None else min(first_ts, ev.ts)
        tl.t1 = max(tl.t1, ev.ts)
        if isinstance(ev, RolloutEvent):
            _rollout_event(tl, ev)
        elif isinstance(ev, CheckpointPrepared | CheckpointSealed | CheckpointCommitted):
            mark = marks.get(ev.checkpoint_id)
            if mark is not None:
                kind = {CheckpointPrepared: "prepared", CheckpointSealed: "sealed"}.get(type(ev), "committed")
                setattr(mark, kind, ev.ts)
                if isinstance(ev, CheckpointCommitted) and ev.waited_ms:
                    mark.pause_ms, mark.waited_ms = ev.pause_ms, dict(ev.waited_ms)
        elif isinstance(ev, ParticipantReplied) and ev.checkpoint_id in marks:
            marks[ev.checkpoint_id].inside_ms[ev.participant] = dict(ev.phases_ms)
    tl.t0 = first_ts or 0.0
    for a in tl.attempts.values():
        if a.from_cut > 0 and a.checkpoint_id in marks:
            marks[a.checkpoint_id].recovery = True
    tl.checkpoints = sorted(marks.values(), key=lambda m: m.cut)
    tl.crashes = _crashes(tl)
    tl.work = tally.result()
    return tl


def _rollout_event(tl: Timeline, ev: RolloutEvent) -> None:
    key = (ev.rollout_id, ev.attempt)
    a = tl.attempts.get(key)
    if a is None:
        a = tl.attempts[key] = Attempt(ev.rollout_id, ev.attempt, opened=ev.ts)
    if ev.rollout_id not in tl.seen:
        tl.seen.add(ev.rollout_id)
        tl.rollouts.append(ev.rollout_id)
    lifecycle = _LIFECYCLE.get(type(ev))
    if lifecycle is not None:
        lifecycle(tl, a, ev)
        return
    a.touch(ev.ts)
    work = _WORK.get(type(ev))
    if work is not None:
        work(a, ev)


def _opened(tl: Timeline, a: Attempt, ev: AttemptOpened) -> None:
    a.opened, a.from_cut, a.checkpoint_id, a.reason = ev.ts, ev.from_cut, ev.checkpoint_id, ev.reason
    prev = tl.attempts.get((ev.rollout_id, ev.previous_attempt))
    if prev is not None and prev.outcome == "running":
        prev.outcome = "interrupted"


def _tombstoned(tl: Timeline, a: Attempt, ev: AttemptTombstoned) -> None:
    if a.outcome == "running":
        a.outcome = "interrupted"


def _retired(tl: Timeline, a: Attempt, ev: RolloutRetired) -> None:
    a.outcome = "retired"


def _accepted(a: Attempt, ev: ResultAccepted) -> None:
    a.outcome, a.reward = "accepted", ev.reward


def _generated(a: Attempt, ev: ModelCallCompleted) -> None:
    a.model_calls += 1
    a.tokens += ev.receipt.count


def _from_log(a: Attempt, ev: Any) -> None:
    a.from_log += 1


def _tool_call(a: Attempt, ev: ResourcesMutated) -> None:
    a.tool_calls += 1


_LIFECYCLE: dict[type[Event], Callable[[Timeline, Attempt, Any], None]] = handlers_by_kind(
    {
        RolloutDispatched: lambda tl, a, ev: None,
        AttemptOpened: _opened,
        AttemptTombstoned: _tombstoned,
        RolloutRetired: _retired,
    }
)
"""The fence's records: what they say about an attempt (no activity of its own)."""

_WORK: dict[type[Event], Callable[[Attempt, Any], None]] = handlers_by_kind(
    {
        ResultAccepted: _accepted,
        ModelCallCompleted: _generated,
        ModelCallReused: _from_log,
        ModelCallContinued: _from_log,
        ResourcesMutated: _tool_call,
    }
)
"""What each kind of an attempt's work adds to its bar."""


def _crashes(tl: Timeline) -> list[Crash]:
    """Recoveries (attempts opened after an earlier one), grouped by time: each group is one crash."""
    reopened = sorted((a for a in tl.attempts.values() if a.attempt > 1), key=lambda a: a.opened)
    groups: list[list[Attempt]] = []
    for a in reopened:
        if groups and a.opened - groups[-1][-1].opened <= CRASH_GAP_S:
            groups[-1].append(a)
        else:
            groups.append([a])
    out = []
    for g in groups:
        before = [tl.attempts.get((a.rollout_id, a.attempt - 1)) for a in g]
        alive = [b.end for b in before if b is not None and b.end is not None]
        cks = [a.checkpoint_id for a in g if a.checkpoint_id]
        first = min(a.opened for a in g)
        out.append(Crash(max(alive) if alive else first, first, len(g), cks[0] if cks else ""))
    return out
