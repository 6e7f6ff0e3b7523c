"""How a participant is found: it answers a coordinator's membership ping with a ``Hello`` on its own
subject ``rc.<ns>.hello.<component>.<instance>``, and says one unasked when it starts, so a standing
coordinator waits for it from its next round on (``_membership.py`` is the coordinator's side)."""

from __future__ import annotations

import contextlib
import secrets

import msgspec
from nats.aio.subscription import Subscription

from ..bus import Component, EventLog
from ._protocol import CheckpointMode, Hello

__all__ = ["Presence"]


class Presence:
    """One participant's answers to membership pings."""

    def __init__(
        self,
        log: EventLog,
        component: Component,
        instance: str,
        *,
        group: str,
        worker: int,
        workers: int,
        mode: CheckpointMode,
    ) -> None:
        self.log, self.component, self.instance = log, component, instance
        self.group, self.worker, self.workers, self.mode = group, worker, workers, mode
        self.process = secrets.token_hex(8)  # tells two processes that claim one name apart
        self._sub: Subscription | None = None

    async def start(self) -> None:
        """Answer pings from now on."""
        self._sub = await self.log.nc.subscribe(self.log.subjects.ping(), cb=self._on_ping)

    async def hello(self, round_id: str) -> None:
        """Say this participant is here: an answer to round ``round_id`` ("" unasked)."""
        hello = Hello(
            round=round_id,
            process=self.process,
            group=self.group,
            worker=self.worker,
            workers=self.workers,
            mode=self.mode,
        )
        subject = self.log.subjects.hello(self.component, self.instance)
        await self.log.nc.publish(subject, msgspec.json.encode(hello))

    async def _on_ping(self, msg: object) -> None:
        data = bytes(getattr(msg, "data", b""))[:65]
        if len(data) <= 64:  # a round id; anything longer is not a coordinator's ping
            await self.hello(data.decode("ascii", "replace"))

    async def stop(self) -> None:
        """Answer no more pings."""
        if self._sub is not None:
            sub, self._sub = self._sub, None
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
