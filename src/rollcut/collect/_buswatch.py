"""A collection that notices when its bus is gone, and stops to be requeued (exit 75).

Why: every bus request rides an outage out for ``BusConfig.outage_s`` (a node restarting, a leader
being elected: seconds). A bus that has lost its quorum for good (two of three nodes down, a
partition) made each of a collection's hundreds of stalled requests wait out those 60 s, and the
collection ended with exit 74 ("storage failed") well after a scheduler's grace period, although
nothing was lost: every acknowledged append is on the stream, every row on disk. What the operator
wants from such an outage is the answer to a requeue: stop promptly, say why in one line, and let
``--resume`` continue once the bus is back.

So a collection watches its bus: it asks the stream's leader for the stream's state every second
or so (one unpatient request, ``EventLog.probe``), and when no answer has come for ``outage_s``
it records the outage, stops, and skips everything that would only wait on the bus again
(its lease's release: a lease not released expires, or is taken over by the next collector on this
host, whose holder is gone). The exit is 75 whatever else happened, with the outage as its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from ..bus import EventLog

__all__ = ["OUTAGE_FLOOR_S", "BusWatch"]

OUTAGE_FLOOR_S = 30.0
"""The shortest outage that stops a collection unless ``bus_outage_s`` is configured: the
checkpoint deadline (a checkpoint could not have published in that time either), but never less
than this. An election after a node's death takes seconds on a loaded cluster, and a collection
with a 5-second deadline (the demo's) must ride that out, not stop for it."""


class BusWatch:
    """Probes the bus until stopped; calls ``on_outage`` once, when it has not answered for
    ``outage_s``, with a one-line reason naming the outage."""

    def __init__(self, log: EventLog, outage_s: float, on_outage: Callable[[str], None]) -> None:
        self.log, self.outage_s, self.on_outage = log, outage_s, on_outage
        self.every_s = min(1.0, outage_s / 4)
        self.outage: str | None = None
        self._done = asyncio.Event()
        self._task: asyncio.Future[None] | None = None

    def start(self) -> None:
        self._done.clear()
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        """Ended by a flag, never by cancelling (a cancel can be swallowed inside a nats-py request):
        returns within one probe's timeout."""
        self._done.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _watch(self) -> None:
        answered = time.monotonic()
        timeout = max(0.5, min(2.0, self.outage_s / 2))
        while not self._done.is_set():
            why = await self.log.probe(timeout)
            now = time.monotonic()
            if why is None:
                answered = now
            elif now - answered >= self.outage_s:
                self.outage = (
                    f"the bus did not answer for {now - answered:.0f} s (stream {self.log.stream}: {why})"
                )
                self.on_outage(self.outage)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), self.every_s)
