"""What a participant writes on its own marker lane about a checkpoint: its reply to a prepare
(who the checkpoint waited for and on what) and a lease that ran out. Both are records for people
and tools (the report, ``bench e2e``), written after the fact and best effort: no checkpoint
waits for them or reads them."""

from __future__ import annotations

import contextlib

from ..bus import Component, EventLog, ParticipantLeaseExpired, ParticipantReplied
from ._protocol import ControlReply

__all__ = ["record_expiry", "record_reply"]

_MAX_UNREPRODUCIBLE = 100  # reasons a reply record keeps (the reply itself has them all)


async def record_reply(log: EventLog, component: Component, reply: ControlReply) -> None:
    """A successful prepare's reply, with where its time went (``checkpoint.reply``)."""
    with contextlib.suppress(Exception):
        await log.append(
            ParticipantReplied(
                component=component,
                instance=reply.instance,
                checkpoint_id=reply.checkpoint_id,
                participant=reply.instance,
                last_seq=reply.last_seq,
                unreproducible=reply.unreproducible[:_MAX_UNREPRODUCIBLE],
                phases_ms=reply.phases_ms,
            )
        )


async def record_expiry(log: EventLog, component: Component, instance: str, checkpoint_id: str) -> None:
    """A checkpoint's lease ran out here: admission reopened without a release."""
    with contextlib.suppress(Exception):  # the record is best effort; reopening is not
        await log.append(
            ParticipantLeaseExpired(
                component=component,
                instance=instance,
                checkpoint_id=checkpoint_id,
                participant=instance,
            )
        )
