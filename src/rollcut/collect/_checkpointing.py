"""A collection's checkpoints: taken on demand (a signal, a recovery's seal) and every ``every_s``,
with compaction after each periodic one; what each cost goes into the summary."""

from __future__ import annotations

import asyncio
import contextlib
import time

from .._errors import CheckpointError, RollcutError
from ..bus import EventLog
from ..ledger import Ledger, compact
from ..participants import Coordinator, PauseBreakdown
from ..tokens import Releasable
from ._metrics import CollectorMetrics
from ._summary import CollectorHooks, Summary

__all__ = ["Checkpointing"]


class Checkpointing:
    """The checkpoint half of :class:`~rollcut.collect.Collector` (which sets every attribute)."""

    log: EventLog
    ledger: Ledger
    coordinator: Coordinator
    summary: Summary
    hooks: CollectorHooks
    deadline_s: float
    every_s: float | None
    compact_keep: int | None
    release_tokens: bool = True
    """Compaction releases the compacted rollouts' token records (``compaction.release_tokens``)."""
    checkpoint_ms: list[float]
    pause_ms: list[float]
    pauses: PauseBreakdown
    metrics: CollectorMetrics
    _ck_lock: asyncio.Lock
    _stop: asyncio.Event

    async def checkpoint(self) -> str | None:
        async with self._ck_lock:
            t0 = time.perf_counter()
            try:
                res = await self.coordinator.checkpoint(deadline_s=self.deadline_s)
            except CheckpointError as exc:
                self.summary.checkpoints_failed += 1
                self.summary.failed.setdefault("checkpoint", str(exc)[:300])
                return None
            # a checkpoint that failed (a deadline passed on a loaded machine) and was followed by one
            # that published lost nothing: the newest cut is what a restore uses; it stays counted
            self.summary.failed.pop("checkpoint", None)
            took = time.perf_counter() - t0
            self.checkpoint_ms.append(took * 1000)
            self.metrics.checkpoint(res, took)
            self.pause_ms.append(res.pause_ms)
            self.pauses.add(res)
            self.summary.checkpoints_published += 1
            self.summary.last_checkpoint = res.record.checkpoint_id
            if self.hooks.checkpoint:
                self.hooks.checkpoint(res)
            return res.record.checkpoint_id

    async def _periodic(self, done: asyncio.Event) -> None:
        # ended by ``done``, never by cancelling: nats-py swallows a CancelledError that lands
        # inside a publish, and a swallowed cancel would leave this loop (and run()) waiting forever
        while self.every_s and not done.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), self.every_s)
                return
            if self._stop.is_set():  # stopping: no new checkpoint (SIGTERM's own was taken before)
                return
            if await self.checkpoint() and self.compact_keep:
                async with self._ck_lock:  # compaction reads the catalog a checkpoint writes
                    tokens = self.coordinator.tokens if self.release_tokens else None
                    try:
                        done_ = await compact(
                            self.log,
                            self.ledger,
                            keep=self.compact_keep,
                            tokens=tokens if isinstance(tokens, Releasable) else None,
                        )
                    except RollcutError as exc:
                        # compaction is idempotent (what it freed stays freed, the rest is freed the
                        # next time): a failed one is counted and said, and the checkpoints go on;
                        # ending this loop on it would leave the rest of the collection without any
                        self.summary.compactions_failed += 1
                        self.summary.failed["compaction"] = str(exc)[:300]
                        continue
                self.summary.failed.pop("compaction", None)
                self.summary.compacted_rollouts += done_.rollouts_compacted
                self.summary.compaction_freed_blobs += done_.blobs_deleted
                self.summary.compaction_released_token_records += done_.token_records_released
                self.summary.compaction_released_token_bytes += done_.token_bytes_released
                self.summary.compaction_freed_bytes += max(
                    0, done_.stream_bytes_before - done_.stream_bytes_after
                )
                self.summary.compaction_s = round(self.summary.compaction_s + done_.seconds, 3)
