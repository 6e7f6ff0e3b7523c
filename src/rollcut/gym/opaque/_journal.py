"""The journal a restarted opaque agent is answered from, at any cut.

A continued attempt reads its journal off its view
(:meth:`rollcut.replay.AttemptView.journal`); this asks the same of any cut,
for inspection and tests: the lineage's exchanges at ``cut``
(:func:`rollcut.replay.inherited`), put in order by the one journal fold
(:func:`rollcut.replay.relay_journal`).
"""

from __future__ import annotations

from ...bus import EventLog, RelayExchange
from ...replay import inherited, relay_journal

__all__ = ["lineage_journal"]


async def lineage_journal(log: EventLog, rollout_id: str, cut: int) -> list[RelayExchange]:
    """The exchanges a continuation from ``cut`` replays, ``n`` = 1, 2, … in order."""
    exchanges = [s.event for s in await inherited(log, rollout_id, cut) if isinstance(s.event, RelayExchange)]
    return relay_journal(rollout_id, exchanges)
