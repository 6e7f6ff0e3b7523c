"""What rollcut needs from a token store, and nothing more.

Token arrays (prompt and output ids, masks, log-probs) never enter events or
the ledger: events carry a :class:`~rollcut.bus.TokenReceipt` (id, count,
digest). A framework plugs in its own durable store (a queue, an object
store, a database) by implementing these three protocols; rollcut ships a
local LMDB one. A store's snapshot is what a checkpoint binds: every receipt
referenced below the cut must be inside it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import msgspec

from ..bus import TokenReceipt

__all__ = ["LineageStore", "TokenRecord", "TokenSink", "TokenSnapshot", "TokenSource"]


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
    def put(self, call_id: str, record: TokenRecord) -> TokenReceipt:
        """Store durably, then return the receipt; idempotent for the same call and content."""
        ...


@runtime_checkable
class TokenSource(Protocol):
    def get(self, receipt: TokenReceipt) -> TokenRecord:
        """The record behind a receipt; raises TokenStoreError if missing or its digest differs."""
        ...

    def has(self, receipt: TokenReceipt) -> bool: ...


@runtime_checkable
class LineageStore(Protocol):
    def link(self, call_id: str, parent_call_id: str | None, receipt_id: str) -> None: ...

    def chain(self, call_id: str) -> list[str]:
        """Call ids from the root to ``call_id``."""
        ...

    def snapshot(self, checkpoint_id: str) -> TokenSnapshot:
        """Bind the store's current contents to a checkpoint; idempotent per checkpoint id."""
        ...

    def in_snapshot(self, snapshot: TokenSnapshot, receipt: TokenReceipt) -> bool: ...

    def verify_snapshot(self, snapshot: TokenSnapshot) -> list[str]:
        """Recompute the snapshot from the records; the problems found (empty if none)."""
        ...
