"""Lineage: which events a continuation from a cut inherits.

An attempt that continues from cut ``C`` does not continue its *previous*
attempt (that may be one a second crash killed before it did anything, or
one opened after ``C``); it continues whichever attempt was live at ``C``.
That attempt may itself be a continuation from an earlier cut, so the state
at ``C`` is a chain: the first attempt up to the cut its successor continued
from, then that successor up to the next cut, and so on up to ``C``. Every
server that rebuilds a session (agent boundary, resources state, replay
queue) and the recovery planner fold the same chain, so a second, third or
tenth crash before the replacement gets anywhere still continues from the
last boundary that any attempt of the chain reached, and nothing an attempt
did after its successor's cut is ever inherited.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from ..bus import AttemptOpened, AttemptTombstoned, EventLog, RolloutDispatched, RolloutEvent, StoredEvent

__all__ = ["Chain", "Segment", "inherited", "lineage"]


class Segment(msgspec.Struct, frozen=True):
    """Attempt ``attempt``'s events with ``seq <= up_to`` belong to the state."""

    attempt: int
    up_to: int


def lineage(opened: Mapping[int, tuple[int, int]], cut: int) -> list[Segment]:
    """The chain of segments that makes up a rollout's state at ``cut``, oldest first.

    ``opened`` maps each attempt to ``(seq it opened at, from_cut)``; attempt 1
    opens with the dispatch at ``from_cut`` 0. Empty if nothing was live at the cut.
    """
    chain: list[Segment] = []
    bound = cut
    while True:
        live = [a for a, (seq, _) in opened.items() if seq <= bound]
        if not live:
            break
        a = max(live)
        chain.append(Segment(a, bound))
        from_cut = opened[a][1]
        if not from_cut or from_cut >= opened[a][0]:  # from the input (or a malformed loop): stop
            break
        bound = from_cut
    chain.reverse()
    return chain


class Chain:
    """Collects one rollout's events (stream order, up to a cut) and keeps those its lineage at the
    cut is made of: what :func:`inherited` returns and an attempt's view folds."""

    def __init__(self) -> None:
        self.opened: dict[int, tuple[int, int]] = {}
        self._events: list[StoredEvent] = []

    def add(self, s: StoredEvent) -> None:
        ev = s.event
        if isinstance(ev, RolloutDispatched):
            self.opened[1] = (s.seq, 0)
        elif isinstance(ev, AttemptOpened):
            self.opened[ev.attempt] = (s.seq, ev.from_cut)
        elif isinstance(ev, RolloutEvent) and not isinstance(ev, AttemptTombstoned):
            self._events.append(s)

    def at(self, cut: int) -> tuple[list[Segment], list[StoredEvent]]:
        """The lineage at ``cut`` and its events, in stream order."""
        chain = lineage(self.opened, cut)
        bound = {seg.attempt: seg.up_to for seg in chain}
        return chain, [s for s in self._events if s.seq <= bound.get(s.event.attempt, -1)]  # type: ignore[union-attr]


async def inherited(log: EventLog, rollout_id: str, cut: int) -> list[StoredEvent]:
    """The rollout's events, in stream order, that its state at ``cut`` is made of."""
    chain = Chain()
    async for s in log.read(rollout_id=rollout_id, up_to=cut):
        chain.add(s)
    return chain.at(cut)[1]
