"""What rollcut needs from a token store, and nothing more.

Token arrays (prompt and output ids, masks, log-probs) never enter events or
the ledger: events carry a :class:`~rollcut.bus.TokenReceipt` (id, count,
digest). A framework plugs in its own durable store (a queue, an object
store, a database) by implementing these three protocols; rollcut ships a
local LMDB one. A store's snapshot is what a checkpoint binds: every receipt
referenced below the cut must be inside it.

The contracts are **synchronous**: a local store (LMDB, a shared
filesystem) answers in microseconds and an ``await`` per call would cost more
than the call. A store whose calls may wait on the network declares
``blocking = True``; rollcut then makes its calls on the hot path (the model
server's put, get and link, the coordinator's snapshot) through
:func:`call_store`, in a worker thread, so the event loop never blocks on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, Protocol, TypeVar, runtime_checkable

import msgspec

from ..bus import TokenReceipt

__all__ = [
    "LineageStore",
    "TokenRecord",
    "TokenSink",
    "TokenSnapshot",
    "TokenSource",
    "TokenStore",
    "call_store",
]

P = ParamSpec("P")
R = TypeVar("R")


class TokenRecord(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything training needs from one model call."""

    record_version: int = 1
    prompt_ids: list[int]
    output_ids: list[int]
    mask: list[int] = []
    logprobs: list[float] = []
    policy_version: str = ""


class TokenSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A point-in-time identity of the store that a checkpoint record binds."""

    snapshot_id: str
    checkpoint_id: str
    count: int
    digest: str
    store: str = ""


@runtime_checkable
class TokenSink(Protocol):
    """Where the model server puts a call's tokens."""

    def put(self, call_id: str, record: TokenRecord) -> TokenReceipt:
        """Store durably, then return the receipt; idempotent for the same call and content."""
        ...


@runtime_checkable
class TokenSource(Protocol):
    """Where continuation and training read a call's tokens back."""

    def get(self, receipt: TokenReceipt) -> TokenRecord:
        """The record behind a receipt; raises TokenStoreError if missing or its digest differs."""
        ...

    def has(self, receipt: TokenReceipt) -> bool:
        """Whether the record behind ``receipt`` is stored with that digest."""
        ...


@runtime_checkable
class LineageStore(Protocol):
    """Which call continues which, and snapshots a checkpoint binds."""

    def link(self, call_id: str, parent_call_id: str | None, receipt_id: str) -> None:
        """Record that ``call_id`` continues ``parent_call_id`` (its lineage) and holds ``receipt_id``."""
        ...

    def chain(self, call_id: str) -> list[str]:
        """Call ids from the root to ``call_id``."""
        ...

    def snapshot(self, checkpoint_id: str) -> TokenSnapshot:
        """Bind the store's current contents to a checkpoint; idempotent per checkpoint id."""
        ...

    def find_snapshot(self, snapshot_id: str) -> TokenSnapshot | None:
        """A snapshot this store bound earlier, as bound; None if the store no longer has it (wiped,
        rolled back, or another store)."""
        ...

    def in_snapshot(self, snapshot: TokenSnapshot, receipt: TokenReceipt) -> bool:
        """Whether ``receipt`` is covered by ``snapshot``; must answer from a local index (it runs
        once per receipt while a checkpoint validates)."""
        ...

    def verify_snapshot(self, snapshot: TokenSnapshot) -> list[str]:
        """Recompute the snapshot from the records; the problems found (empty if none)."""
        ...


class TokenStore(TokenSink, TokenSource, LineageStore, Protocol):
    """A whole token store: what the model server and the coordinator are given."""

    blocking: bool
    """True when calls may wait on the network: rollcut then calls it from a worker thread."""


async def call_store(store: TokenStore, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Call ``fn`` (a method of ``store``) without blocking the event loop on a remote store."""
    if store.blocking:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)
