"""Group commit: many concurrent appends become one JetStream atomic batch, and a few
become acknowledged publishes sent together.

Why: one acknowledged publish per event costs a round trip and a Python
future per event. An atomic batch (ADR-50, server 2.12+) sends N messages
fire-and-forget and gets one pub ack for all of them, with every message's
fencing header still checked by the server under the stream lock. But the
server stages every atomic batch in a store of its own, made and removed per
batch: about 0.4 ms of its CPU however small the batch, against about 65 µs
for a publish. So fewer than ``min_batch`` queued messages leave as
acknowledged publishes written together (one connection, so the server stores
them in the order sent) and awaited together; a batch pays only when it is
large, which is when the client's per-message acks would cost more.

How it keeps latency low: nothing waits for a batch to fill. A submitted
message is sent as soon as a send slot is free; while ``max_inflight``
sends are on the wire, new submissions queue up and leave together when a
slot frees. Under low load every append goes out alone, at once; under high
load batches grow by themselves.

Failure handling: the server rejects an atomic batch whole (a stale fence in
one message, a duplicate ``Nats-Msg-Id`` after a retried batch, a lost
commit). Then each message of that batch is re-sent on its own, in order,
with its own ``Nats-Msg-Id``: the ones already stored come back as
duplicates with their original sequence, the stale one alone gets its
error, the rest are stored. Nobody's event is lost because a neighbour was
stale. Publishes sent together are answered one by one the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from .._errors import BusError, PermissionDeniedError
from .._files import private_dir
from ._events import new_event_id
from ._patience import Patience, gone_flag
from ._stream import BusConfig, Denials, PubAck, parse_ack
from ._wire import encode_headers, send_batch_body

__all__ = ["ERRS_IN_FLIGHT", "GroupCommit", "Outcome"]

ERRS_IN_FLIGHT = frozenset({10164, 10158})
"""Refusals a replicated stream gives while a write this one depends on is still being replicated:
another write checked against the same subject (a rollout's fence) is in flight (10164, "wrong
last sequence" without a number), or this very message id is (10158). Neither is a verdict: the
leader has not decided yet. The message is sent again, with its id, until it has."""


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
    checked: str | None = None  # on a replicated stream: the subject its expected-sequence check names
    alone: bool = False  # sent in no batch: see GroupCommit._take


class GroupCommit:
    """Batches concurrent publishes into atomic commits; one per connection."""

    def __init__(self, nc: NATS, config: BusConfig, *, denials: Denials | None = None) -> None:
        """The batch sizes, send slots and patience are ``config``'s (``max_batch``, ``min_batch``,
        ``max_inflight``, ``request_timeout_s``, ``outage_s``): declared there, once."""
        if not 1 <= config.max_batch <= 1000:
            raise BusError(f"max_batch must be within 1..1000 (server limit), got {config.max_batch}")
        self._nc = nc
        self._max_batch = config.max_batch
        self._min_batch = max(2, config.min_batch)  # a lone message is never a batch
        self._slots = asyncio.Semaphore(max(1, config.max_inflight))
        self._timeout = config.request_timeout_s
        self._outage_s = config.outage_s
        self._denials = denials
        self._queue: list[_Item] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()
        self._closed = False
        self.batches_sent = 0
        self.singles_sent = 0  # messages sent as acknowledged publishes, alone or together
        self.fallbacks = 0
        self._journal = _open_journal()
        self.one_in_flight_per_subject = False
        """Set on a replicated stream: see :meth:`_take`."""
        self._in_flight: dict[str, int] = {}
        self._alone = 0  # queued messages that go in no batch

    def submit(
        self, subject: str, payload: bytes, headers: dict[str, str], header_lines: bytes | None = None
    ) -> asyncio.Future[Outcome]:
        """Queue one message. ``header_lines``, if given, must equal ``encode_headers(headers)``."""
        if self._closed:
            raise BusError("the event log is closed")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = loop.create_future()
        lines = header_lines if header_lines is not None else encode_headers(headers)
        checked = _checked_subject(subject, headers) if self.one_in_flight_per_subject else None
        alone = "*" in headers.get("Nats-Expected-Last-Subject-Sequence-Subject", "")
        self._alone += alone
        self._queue.append(_Item(subject, payload, headers, lines, fut, checked, alone))
        if self._task is None:
            self._task = loop.create_task(self._run(), name="rollcut-group-commit")
        self._wake.set()
        return fut

    def _record(self, items: list[_Item], first: int) -> None:
        """Write what the server acknowledged to the ack journal, if one is kept."""
        if self._journal is not None:
            ids = (it.headers.get("Nats-Msg-Id", "") for it in items)
            lines = "".join(f"{first + i} {eid}\n" for i, eid in enumerate(ids))
            os.write(self._journal, lines.encode())

    async def close(self) -> None:
        self._closed = True
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        if self._journal is not None:  # after the last acks in flight were written to it
            os.close(self._journal)
            self._journal = None
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
                take = self._take()
                if not take:  # all that is queued waits on a subject in flight: a send's end wakes us
                    self._slots.release()
                    break
                task = asyncio.get_running_loop().create_task(self._send(take))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    def _take(self) -> list[_Item]:
        """The next batch: the queue's head, or on a replicated stream, its head without the messages
        whose checked subject is in flight in another batch.

        A stream leader refuses (10164) a message whose expected-last-subject check names a subject
        that a write not yet replicated also checked: two batches with events of one rollout in
        flight at once would have the second refused whole, then re-sent one by one. Holding those
        events for the next batch keeps every batch whole; their order is kept, since all of a
        rollout's queued events wait together.

        A message whose check names several subjects (a wildcard: a claim across every instance's
        subject of an attempt) goes alone: in an atomic batch the server checks each message against
        the stream as it was before the batch, so two claims in one batch both succeeded.
        """
        if not self.one_in_flight_per_subject and not self._alone:
            take, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
            return take
        if self._queue[0].alone and self._queue[0].checked not in self._in_flight:
            self._alone -= 1
            return [self._queue.pop(0)]
        take, held, busy = [], [], self._in_flight
        for it in self._queue:
            key = it.checked
            if len(take) >= self._max_batch or it.alone or (key is not None and key in busy):
                held.append(it)
            else:
                take.append(it)
        self._queue = held
        for it in take:
            if it.checked is not None:
                busy[it.checked] = busy.get(it.checked, 0) + 1
        return take

    async def _send(self, items: list[_Item]) -> None:
        try:
            if len(items) < self._min_batch and self._unchecked_alike(items):
                self.singles_sent += len(items)
                await self._send_together(items)
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
            if self.one_in_flight_per_subject:
                for it in items:
                    key = it.checked
                    if key is not None and self._in_flight.get(key, 0) <= 1:
                        self._in_flight.pop(key, None)
                    elif key is not None:
                        self._in_flight[key] -= 1
                self._wake.set()  # what waited on these subjects may go now
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
            self._record(items, first)
            return
        self.fallbacks += 1
        await self._send_singly(items)

    def _unchecked_alike(self, items: list[_Item]) -> bool:
        """Whether no two of ``items`` check the same subject on a replicated stream, where the leader
        would refuse the second while the first is being replicated (10164) and it would be sent again
        after a wait: an atomic batch checks them in one go instead."""
        if not self.one_in_flight_per_subject:
            return True
        checked = [it.checked for it in items if it.checked is not None]
        return len(checked) == len(set(checked))

    async def _send_together(self, items: list[_Item]) -> None:
        """One acknowledged publish per message, all written before any ack is awaited: in the order
        given, on one connection, so stored in that order (the server reads a connection in order).
        Each message is answered by its own ack, a refusal only its own.

        The first is sent from here and the others from tasks made before it, which run once it
        waits for its ack: a lone message (most appends, under low load) makes no task at all."""
        rest = [asyncio.ensure_future(self._send_singly([it])) for it in items[1:]]
        try:
            await self._send_singly(items[:1])
        except asyncio.CancelledError:
            for task in rest:
                task.cancel()
            raise
        finally:  # every message answered or failed before the send's slot is given back
            sent = await asyncio.gather(*rest, return_exceptions=True)
        for failed in sent:
            if isinstance(failed, BaseException):  # the messages still unanswered hear it from _send
                raise failed

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
                self._record([it], ack.seq)

    async def _publish_one(self, it: _Item) -> PubAck:
        """One acknowledged publish, retried with its ``Nats-Msg-Id`` until the bus answers.

        No answer is not a refusal: a stream leader being elected (a node of a cluster died), a
        server restarting, a cluster without quorum. The same message is sent again for up to
        ``outage_s`` (the server stores it once, whichever try got through); past that the append
        fails naming what the bus last said, and nothing was acknowledged.
        """
        patience = Patience(self._outage_s, first_s=0.005, gone=gone_flag(self._nc))
        while True:
            try:
                ack = parse_ack(await self._request(it.subject, it.payload, it.headers, [it.subject]))
                if ack.error is None or ack.error.err_code not in ERRS_IN_FLIGHT:
                    return ack
                cause = f"{ack.error.err_code} {ack.error.description} (a write it depends on is in flight)"
            except (NatsError, OSError) as exc:
                cause = _cause(exc)
                patience.at_least(0.05)
            await patience.again(
                BusError(
                    f"append to {it.subject} got no ack for {self._outage_s:.0f} s: {cause}",
                    subject=it.subject,
                )
            )

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


def _cause(exc: BaseException) -> str:
    """What an unanswered append means, in the operator's words."""
    if isinstance(exc, NoRespondersError):
        return (
            "no responders: no server holds a leader for the stream (a cluster that lost its quorum, "
            "or every server down)"
        )
    if isinstance(exc, NatsTimeoutError):
        return "timed out waiting for the stream's ack (a leader being elected, or too few replicas up)"
    return repr(exc)


ACK_JOURNAL_ENV = "ROLLCUT_ACK_JOURNAL"


def _open_journal() -> int | None:
    """An audit of every acknowledgement this process received, when ``$ROLLCUT_ACK_JOURNAL`` names
    a directory: one ``<seq> <msg id>`` line per acked append, in ``<dir>/<pid>.acks``.

    Why: "no acknowledged write lost" can only be checked against what writers were told. A fault
    test (a node killed, a cluster without quorum) compares every journal line with the stream
    afterwards; an operator can do the same after an incident. Off by default (a write per ack).
    """
    where = os.environ.get(ACK_JOURNAL_ENV)
    if not where:
        return None
    path = private_dir(Path(where)) / f"{os.getpid()}.acks"
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _checked_subject(subject: str, headers: dict[str, str]) -> str | None:
    """The subject a message's expected-last-subject-sequence check names, if it has one."""
    if "Nats-Expected-Last-Subject-Sequence" not in headers:
        return None
    return headers.get("Nats-Expected-Last-Subject-Sequence-Subject") or subject
