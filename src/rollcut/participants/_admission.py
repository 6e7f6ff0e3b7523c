"""The admission gate: what a checkpoint closes, and what it waits on.

A request that meets a closed gate is refused at once with a retryable
:class:`AdmissionClosedError`, never parked: a caller that hangs until a
checkpoint ends cannot tell a slow checkpoint from a dead server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .._errors import AdmissionClosedError

__all__ = ["RETRY_AFTER_S", "AdmissionGate"]

RETRY_AFTER_S = 1.0
"""The longest a refused caller is told to wait (``Retry-After``). A checkpoint holds admission
for milliseconds; the gate's lease (the checkpoint's deadline plus a grace) is only the bound for a
coordinator that went silent. Told to wait out the whole lease, every caller that met a checkpoint
slept for its deadline: a collection stalled 25-35 s at a time with a 30 s deadline (found by
``rollcut bench soak``)."""


class AdmissionGate:
    """What a checkpoint closes: new work is refused at once, accepted work is counted."""

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self._closed_for: str | None = None
        self._until = 0.0
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def state(self) -> str:
        return "closed" if self._closed_for is not None else "open"

    @property
    def inflight(self) -> int:
        return self._inflight

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
        self._inflight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def drain(self, deadline: float) -> bool:
        """Wait until accepted work is done, or the deadline; True if drained."""
        try:
            await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - time.time()))
        except TimeoutError:
            return False
        return True
