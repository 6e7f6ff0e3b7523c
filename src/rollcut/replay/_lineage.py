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

__all__ = ["Segment", "inherited", "lineage"]


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


async def inherited(log: EventLog, rollout_id: str, cut: int) -> list[StoredEvent]:
    """The rollout's events, in stream order, that its state at ``cut`` is made of."""
    events: list[StoredEvent] = []
    opened: dict[int, tuple[int, int]] = {}
    async for s in log.read(rollout_id=rollout_id, up_to=cut):
        ev = s.event
        if isinstance(ev, RolloutDispatched):
            opened[1] = (s.seq, 0)
        elif isinstance(ev, AttemptOpened):
            opened[ev.attempt] = (s.seq, ev.from_cut)
        elif isinstance(ev, RolloutEvent) and not isinstance(ev, AttemptTombstoned):
            events.append(s)
    bound = {seg.attempt: seg.up_to for seg in lineage(opened, cut)}
    return [s for s in events if s.seq <= bound.get(s.event.attempt, -1)]  # type: ignore[union-attr]
