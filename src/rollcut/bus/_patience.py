"""Asking the bus again while it does not answer: one back-off for every request rollcut makes.

A JetStream cluster between two stream leaders (a node died, seconds to elect the next), a node
restarting, a cluster without quorum: requests go unanswered or answer "no responders". None of
that is a refusal, so appends, reads, stream setup, leader gets and purges are asked again, with a
back-off doubling to a second, for up to ``BusConfig.outage_s``; then they fail, naming what the bus
last said.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["Patience", "gone_flag"]


def gone_flag(nc: object) -> asyncio.Event | None:
    """A connection's "the bus is gone" flag: set (``EventLog.give_up``) when its owner has decided
    the outage will not end in time, so that every request still riding it out fails at once
    instead of each spending the whole ``outage_s``. rollcut's connections have one; others, none."""
    flag = getattr(nc, "bus_gone", None)
    return flag if isinstance(flag, asyncio.Event) else None


class Patience:
    """``await patience.again(error)`` between tries: sleeps, or raises ``error`` (what the last try
    met, in the operator's words) once the outage budget would be spent."""

    def __init__(
        self, outage_s: float, *, first_s: float = 0.05, cap_s: float = 1.0, gone: asyncio.Event | None = None
    ) -> None:
        self.outage_s = outage_s
        self._gone = gone
        self._loop = asyncio.get_running_loop()
        self._give_up = self._loop.time() + outage_s
        self._delay = first_s
        self._cap = cap_s

    def at_least(self, delay_s: float) -> None:
        """Wait at least ``delay_s`` next time (a dead connection needs longer than a busy subject)."""
        self._delay = max(self._delay, delay_s)

    async def again(self, error: Exception) -> None:
        if self._loop.time() + self._delay > self._give_up:
            raise error
        if self._gone is None:
            await asyncio.sleep(self._delay)
        else:
            with contextlib.suppress(TimeoutError):  # the back-off, cut short when the bus is declared gone
                await asyncio.wait_for(self._gone.wait(), self._delay)
            if self._gone.is_set():
                error.add_note("given up before outage_s: the bus was declared gone (EventLog.give_up)")
                raise error
        self._delay = min(self._delay * 2, self._cap)
