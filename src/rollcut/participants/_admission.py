"""The admission gate: what a checkpoint closes, and what it waits on.

A request that meets a closed gate is refused at once with a retryable
:class:`AdmissionClosedError`, never parked: a caller that hangs until a
checkpoint ends cannot tell a slow checkpoint from a dead server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from .._errors import AdmissionClosedError

__all__ = ["RETRY_AFTER_S", "AdmissionGate", "InFlight"]

RETRY_AFTER_S = 1.0
"""The longest a refused caller is told to wait (``Retry-After``). A checkpoint holds admission
for milliseconds; the gate's lease (the checkpoint's deadline plus a grace) is only the bound for a
coordinator that went silent. Told to wait out the whole lease, every caller that met a checkpoint
slept for its deadline: a collection stalled 25-35 s at a time with a 30 s deadline (found by
``rollcut bench soak``)."""


class InFlight:
    """A count of work under way and an event set whenever there is none: what a prepare that must
    see no work half done waits on."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Count one unit of work for as long as the block runs."""
        self.count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.count -= 1
            if self.count == 0:
                self._idle.set()

    async def idle(self) -> None:
        """Until no work is under way."""
        await self._idle.wait()


class AdmissionGate:
    """What a checkpoint closes: new work is refused at once, accepted work is counted."""

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self._closed_for: str | None = None
        self._until = 0.0
        self._work = InFlight()

    @property
    def state(self) -> str:
        return "closed" if self._closed_for is not None else "open"

    @property
    def inflight(self) -> int:
        return self._work.count

    def close(self, checkpoint_id: str, until: float) -> None:
        self._closed_for, self._until = checkpoint_id, until

    def open(self) -> None:
        self._closed_for = None

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Hold one unit of accepted work; refuses while closed."""
        if self._closed_for is not None:
            wait = max(0.1, min(RETRY_AFTER_S, self._until - time.time()))
            raise AdmissionClosedError(self.instance, self._closed_for, wait)
        with self._work.hold():
            yield

    async def drain(self, deadline: float) -> bool:
        """Wait until accepted work is done, or the deadline; True if drained."""
        try:
            await asyncio.wait_for(self._work.idle(), max(0.0, deadline - time.time()))
        except TimeoutError:
            return False
        return True
