"""One control request to one participant, asked again until it is answered or its deadline passes.

Every operation of the protocol is idempotent (a participant answers a request it has seen with
the answer it gave), so silence, a lost request or a lost reply is met by asking again.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from .._errors import CheckpointFailedError
from .._tracing import inject
from ._membership import InstanceInfo
from ._protocol import ControlReply, ControlRequest

__all__ = ["ask"]

_reply_decoder = msgspec.json.Decoder(ControlReply)


async def ask(
    nc: NATS, info: InstanceInfo, req: ControlRequest, *, per_try_s: float, gone_is_final: bool = False
) -> ControlReply:
    """``req``'s answer from ``info``, each try up to ``per_try_s``, until ``req.deadline``.

    Where nobody listens (the process is gone, or between connections) it is asked again after a
    pause that doubles from 10 ms to a try's length: "no responders" comes back in microseconds,
    and asked again at once, a coordinator spun until the deadline (a participant killed after the
    seal held the release, and failed its checkpoint, for as long). With ``gone_is_final`` (a
    release or an abort, which the participant's lease makes good) nobody listening ends it at once.
    """
    op, cid = req.op, req.checkpoint_id
    data = msgspec.json.encode(req)
    idle = 0.01
    while True:
        left = req.deadline - time.time()
        if left <= 0:
            raise CheckpointFailedError(
                f"{info.instance} did not answer {op} before the deadline",
                checkpoint_id=cid,
                participant=info.instance,
            )
        headers: dict[str, str] = {}
        inject(headers)  # the participant's span joins this checkpoint's trace
        try:
            msg = await nc.request(info.control, data, timeout=min(left, per_try_s), headers=headers or None)
        except NoRespondersError as exc:
            if gone_is_final:
                raise CheckpointFailedError(
                    f"nobody listens for {info.instance}'s {op}", checkpoint_id=cid, participant=info.instance
                ) from exc
            await asyncio.sleep(min(idle, left))
            idle = min(2 * idle, per_try_s)
            continue
        except (NatsTimeoutError, NatsError):
            continue  # a lost request or reply: ask again
        try:
            return _reply_decoder.decode(msg.data)
        except msgspec.DecodeError as exc:
            raise CheckpointFailedError(
                f"{info.instance} answered {op} with an unreadable reply: {exc}",
                checkpoint_id=cid,
                participant=info.instance,
            ) from exc
