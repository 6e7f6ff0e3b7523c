"""The journal a restarted opaque agent is answered from: the lineage's exchanges, in order.

An attempt continued from cut ``C`` inherits the exchanges of the chain of
attempts live at ``C`` (:func:`rollcut.replay.inherited`): the first attempt's
up to the cut its successor continued from, that successor's own up to the
next cut, and so on. A successor numbers its own exchanges on from what it
inherited, so the journal is the concatenation, except where a successor
*went live* at a divergence (``go_live``, stateless tools only): its exchange
``n`` replaces the inherited ``n`` and everything after it. A hole in the
numbers (an exchange whose record was lost while a later one was stored)
makes the lineage unreplayable: fail closed, fresh dispatch.
"""

from __future__ import annotations

from itertools import groupby

from ..._errors import RollcutError
from ...bus import EventLog, RelayExchange
from ...replay import inherited

__all__ = ["JournalGap", "lineage_journal"]


class JournalGap(RollcutError):
    """The lineage's journal has a hole: it cannot be replayed in order."""

    rollout_id: str | None = None
    attempt: int | None = None


async def lineage_journal(log: EventLog, rollout_id: str, cut: int) -> list[RelayExchange]:
    """The exchanges a continuation from ``cut`` replays, ``n`` = 1, 2, … in order."""
    exchanges = [s.event for s in await inherited(log, rollout_id, cut) if isinstance(s.event, RelayExchange)]
    journal: list[RelayExchange] = []
    # the chain's attempts ascend; within one, concurrent exchanges may be stored out of their order
    for _, own in groupby(exchanges, key=lambda e: e.attempt):
        for ev in sorted(own, key=lambda e: e.n):
            if ev.n > len(journal) + 1:
                raise JournalGap(
                    f"{rollout_id}: exchange {ev.n} of attempt {ev.attempt} follows {len(journal)}",
                    rollout_id=rollout_id,
                    attempt=ev.attempt,
                )
            del journal[ev.n - 1 :]
            journal.append(ev)
    return journal
