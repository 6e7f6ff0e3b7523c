"""Validation that keeps up with the stream: a checkpoint is left with only the tail.

Why: projecting the ledger and checking references costs tens of
microseconds per event, and with checkpoints every 30 s most rollouts move
between two of them: done at checkpoint time, that is a second per 30k events
before a checkpoint can publish. Done as the events arrive, it is the same
work spread over the interval, and a checkpoint only projects and checks the
events since the validator's last round.

The validator never goes past a cut it has not been given: while a
checkpoint runs (from before its seal until its validation ends) the
coordinator holds :attr:`TailValidator.lock`, so the validator's position is
at or below the cut, and :meth:`TailValidator.at_cut` feeds exactly the rest.
A round between checkpoints takes at most ``chunk`` events, so a checkpoint
waits for at most one chunk to finish before it starts.
"""

from __future__ import annotations

import asyncio
import contextlib

from .._errors import RollcutError
from ..bus import EventLog, StoredEvent
from ..tokens import TokenSnapshot, TokenStore
from ._ledger import Ledger
from ._projector import Projector
from ._validate import Finding, ReferenceCheck

__all__ = ["TailValidator"]


class TailValidator:
    """Projects the ledger and checks references as the stream grows."""

    def __init__(
        self, log: EventLog, ledger: Ledger, tokens: TokenStore | None, *, chunk: int = 8192
    ) -> None:
        self.log, self.ledger = log, ledger
        self.projector = Projector(ledger, log)
        self.check = ReferenceCheck(ledger, tokens)
        self.chunk = chunk
        self.lock = asyncio.Lock()
        self.fed_to = int(ledger.meta("validated_seq", 0))  # events checked up to here
        self.rounds = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.last_error: RollcutError | None = None

    def start(self, every_s: float = 0.5) -> None:
        """Keep up in the background, one round every ``every_s``."""
        if self._task is None or self._task.done():
            self._stop = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(every_s, self._stop))

    async def stop(self) -> None:
        """Stop after the round in progress (never by cancelling one: nats-py may swallow a
        cancellation that lands inside a request, and the loop would then never end)."""
        if self._task is not None:
            self._stop.set()
            await self._task
            self._task = None

    async def _loop(self, every_s: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)
                return
            async with self.lock:
                try:
                    await self.feed(limit=self.chunk)
                except RollcutError as exc:  # the bus or the disk failed: the next checkpoint, which
                    self.last_error = exc  # feeds the rest itself, fails naming it; keep trying meanwhile
                else:
                    self.rounds += 1

    def _page(self, page: list[StoredEvent]) -> None:
        self.check.page(page)
        self.fed_to = page[-1].seq

    async def feed(self, *, up_to: int | None = None, limit: int | None = None) -> None:
        """Project and check from the last event checked to ``up_to`` (default: the stream's end),
        at most ``limit`` events. Call it holding :attr:`lock`."""
        end = up_to  # None: the stream's end, which catch_up reads anyway
        if limit is not None:
            end = self.fed_to + limit if end is None else min(end, self.fed_to + limit)
        if end is None or end > self.fed_to:  # from where we are, whoever projected the ledger meanwhile
            await self.projector.catch_up(start=self.fed_to + 1, up_to=end, on_events=self._page)
        self.check.settle()

    async def at_cut(
        self, cut: int, snapshot: TokenSnapshot | None, reported: dict[str, tuple[set[str], int]]
    ) -> tuple[list[Finding], int]:
        """Feed the rest up to the cut; the problems of everything since the last publication, and how
        many events that is. Call it holding :attr:`lock`."""
        await self.feed(up_to=cut)
        return self.check.finish(snapshot, reported), self.check.checked

    def published(self) -> None:
        """The checkpoint at the validator's position was published: its range is done."""
        self.check.reset()
