"""Group commit for the token store: the writes of concurrent calls share one transaction.

Why: with ``sync=True`` every LMDB commit is an fsync (milliseconds), and a
model server that commits each call's record on the event loop stalls every
other request for that long: under 64 concurrent clients calls queue behind
each other's fsyncs. Here a write is prepared (encoded, compressed, digested)
on the event loop, queued, and committed by one flusher in a worker thread,
together with every write queued meanwhile. The caller's ``await`` returns
only once its write is durable, so a receipt is never named on the log before
its record is on disk. Under low load a write goes out alone, at once; under
high load batches grow by themselves (as the bus's group commit does).

A store that cannot batch (any other :class:`TokenStore`) is called one write
at a time through :func:`call_store`, as before.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..bus import TokenReceipt
from ._contracts import TokenRecord, TokenStore, call_store
from ._local import LocalTokenStore

__all__ = ["TokenWrites"]


@dataclass(slots=True)
class _Batch:
    puts: list[tuple[TokenReceipt, bytes]] = field(default_factory=list)
    links: list[tuple[str, str | None, str]] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


class TokenWrites:
    """A token store's writes from one event loop, grouped into one transaction per flush."""

    def __init__(self, store: TokenStore) -> None:
        self.store = store
        self._local = store if isinstance(store, LocalTokenStore) else None
        self._next = _Batch()
        self._flusher: asyncio.Task[None] | None = None
        self.flushes = 0  # transactions committed
        self.writes = 0  # records and links they held

    async def put(
        self, call_id: str, record: TokenRecord, *, parent: str | None = None, link: bool = False
    ) -> TokenReceipt:
        """Store a record durably (and, with ``link``, its lineage link to ``parent`` in the same
        transaction); its receipt."""
        if self._local is None:
            receipt = await call_store(self.store, self.store.put, call_id, record)
            if link:
                await call_store(self.store, self.store.link, call_id, parent, receipt.receipt_id)
            return receipt
        receipt, packed = self._local.prepare(call_id, record)
        self._next.puts.append((receipt, packed))
        if link:
            self._next.links.append((call_id, parent, receipt.receipt_id))
        await self._wait()
        return receipt

    async def link(self, call_id: str, parent: str | None, receipt_id: str) -> None:
        """Record a lineage link durably."""
        if self._local is None:
            await call_store(self.store, self.store.link, call_id, parent, receipt_id)
            return
        self._next.links.append((call_id, parent, receipt_id))
        await self._wait()

    def _wait(self) -> asyncio.Future[None]:
        done = asyncio.get_running_loop().create_future()
        self._next.waiters.append(done)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return done

    async def _flush(self) -> None:
        assert self._local is not None
        while self._next.waiters:
            batch, self._next = self._next, _Batch()
            try:
                await asyncio.to_thread(self._local.write_many, batch.puts, batch.links)
            except Exception as exc:  # every waiter of the batch hears it; nothing of it is durable
                for w in batch.waiters:
                    if not w.done():
                        w.set_exception(exc)
                continue
            self.flushes += 1
            self.writes += len(batch.puts) + len(batch.links)
            for w in batch.waiters:
                if not w.done():
                    w.set_result(None)
