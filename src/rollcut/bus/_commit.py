"""Group commit: many concurrent appends become one JetStream atomic batch.

Why: one acknowledged publish per event costs a round trip and a Python
future per event. An atomic batch (ADR-50, server 2.12+) sends N messages
fire-and-forget and gets one pub ack for all of them, with every message's
fencing header still checked by the server under the stream lock.

How it keeps latency low: nothing waits for a batch to fill. A submitted
message is sent as soon as a send slot is free; while ``max_inflight``
batches are on the wire, new submissions queue up and leave together when a
slot frees. Under low load every append goes out alone, at once; under high
load batches grow by themselves.

Failure handling: the server rejects an atomic batch whole (a stale fence in
one message, a duplicate ``Nats-Msg-Id`` after a retried batch, a lost
commit). Then each message of that batch is re-sent on its own, in order,
with its own ``Nats-Msg-Id``: the ones already stored come back as
duplicates with their original sequence, the stale one alone gets its
error, the rest are stored. Nobody's event is lost because a neighbour was
stale.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError

from .._errors import BusError, PermissionDeniedError
from ._events import new_event_id
from ._stream import Denials, PubAck, parse_ack
from ._wire import encode_headers, send_batch_body

__all__ = ["GroupCommit", "Outcome"]


@dataclass(slots=True)
class Outcome:
    """What the server said about one message: a sequence, or an API error."""

    seq: int = 0
    duplicate: bool = False
    err_code: int = 0
    description: str = ""


@dataclass(slots=True)
class _Item:
    subject: str
    payload: bytes
    headers: dict[str, str]
    header_lines: bytes
    future: asyncio.Future[Outcome] = field(repr=False)


class GroupCommit:
    """Batches concurrent publishes into atomic commits; one per connection."""

    def __init__(
        self,
        nc: NATS,
        *,
        max_batch: int = 500,
        max_inflight: int = 8,
        timeout: float = 10.0,
        retries: int = 3,
        denials: Denials | None = None,
    ) -> None:
        if not 1 <= max_batch <= 1000:
            raise BusError(f"max_batch must be within 1..1000 (server limit), got {max_batch}")
        self._nc = nc
        self._max_batch = max_batch
        self._slots = asyncio.Semaphore(max(1, max_inflight))
        self._timeout = timeout
        self._retries = retries
        self._denials = denials
        self._queue: list[_Item] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._closed = False
        self.batches_sent = 0
        self.singles_sent = 0
        self.fallbacks = 0

    def submit(
        self, subject: str, payload: bytes, headers: dict[str, str], header_lines: bytes | None = None
    ) -> asyncio.Future[Outcome]:
        """Queue one message. ``header_lines``, if given, must equal ``encode_headers(headers)``."""
        if self._closed:
            raise BusError("the event log is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = loop.create_future()
        lines = header_lines if header_lines is not None else encode_headers(headers)
        self._queue.append(_Item(subject, payload, headers, lines, fut))
        if self._task is None:
            self._task = loop.create_task(self._run(), name="rollcut-group-commit")
        self._wake.set()
        return fut

    async def close(self) -> None:
        self._closed = True
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for item in self._queue:
            if not item.future.done():
                item.future.set_exception(BusError("the event log closed before this append was sent"))
        self._queue.clear()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                await self._slots.acquire()
                take, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                task = asyncio.get_running_loop().create_task(self._send(take))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    async def _send(self, items: list[_Item]) -> None:
        try:
            if len(items) == 1:
                self.singles_sent += 1
                await self._send_singly(items)
            else:
                self.batches_sent += 1
                await self._send_batch(items)
        except BaseException as exc:  # resolve every waiter, whatever happened
            err = exc if isinstance(exc, Exception) else BusError(f"append interrupted: {exc!r}")
            for it in items:
                if not it.future.done():
                    it.future.set_exception(err)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._slots.release()

    async def _send_batch(self, items: list[_Item]) -> None:
        bid = new_event_id()  # 96 random bits in 16 characters, stored with every event of the batch
        last = len(items)
        ack: PubAck | None = None
        body = [(it.subject, it.headers, it.header_lines, it.payload) for it in items[:-1]]
        tail = items[-1]
        commit = {
            **tail.headers,
            "Nats-Batch-Id": bid,
            "Nats-Batch-Sequence": str(last),
            "Nats-Batch-Commit": "1",
        }
        try:
            await send_batch_body(self._nc, bid, body)
            data = await self._request(tail.subject, tail.payload, commit, [it.subject for it in items])
            ack = parse_ack(data)
        except (NatsError, OSError, PermissionDeniedError):
            ack = None  # outcome unknown or partly denied: the per-message path sorts it out
        if ack is not None and ack.error is None and ack.count == last:
            first = ack.seq - last + 1
            for i, it in enumerate(items):
                if not it.future.done():
                    it.future.set_result(Outcome(seq=first + i))
            return
        self.fallbacks += 1
        await self._send_singly(items)

    async def _send_singly(self, items: list[_Item]) -> None:
        """One acknowledged publish per message, in order, retried on timeouts."""
        for it in items:
            if it.future.done():
                continue
            try:
                ack = await self._publish_one(it)
            except PermissionDeniedError as exc:
                it.future.set_exception(exc)
                continue
            if ack.error is not None:
                it.future.set_result(Outcome(err_code=ack.error.err_code, description=ack.error.description))
            else:
                it.future.set_result(Outcome(seq=ack.seq, duplicate=ack.duplicate))

    async def _publish_one(self, it: _Item) -> PubAck:
        delay = 0.05
        for attempt in range(self._retries + 1):
            try:
                return parse_ack(await self._request(it.subject, it.payload, it.headers, [it.subject]))
            except (NatsTimeoutError, NatsError, OSError) as exc:
                if attempt == self._retries:
                    raise BusError(
                        f"append to {it.subject} got no ack after {self._retries + 1} tries: {exc!r}",
                        subject=it.subject,
                    ) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 4, 2.0)
        raise BusError(f"append to {it.subject}: no attempt was made", subject=it.subject)  # retries < 0

    async def _request(
        self, subject: str, payload: bytes, headers: dict[str, str], watch: list[str]
    ) -> bytes:
        """An acked publish that fails at once if the server denies any of ``watch``."""
        if self._denials is None:
            return (await self._nc.request(subject, payload, timeout=self._timeout, headers=headers)).data
        denied = self._denials.watch(watch)
        if denied.done():
            raise PermissionDeniedError(denied.result())
        req = asyncio.ensure_future(
            self._nc.request(subject, payload, timeout=self._timeout, headers=headers)
        )
        try:
            pending: list[asyncio.Future[Any]] = [req, denied]
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._denials.unwatch(denied)
        if req.done():
            return req.result().data
        req.cancel()
        raise PermissionDeniedError(denied.result())
