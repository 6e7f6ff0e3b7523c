"""Compaction: the stream keeps what restore, verify and rebuild need for the checkpoints kept, and
lets the rest go, so a collection that runs for a week does not need a week of disk.

What a restore from a kept checkpoint reads of a rollout whose result was accepted below that
checkpoint's cut: that it was accepted (the collector's ``result.accepted``), and that it exists
(its fence: a dispatch must never succeed twice). Its model calls, tool calls, agent boundaries and
environment events are never read again: restore does not continue an accepted rollout, and its row
is written. So, with ``keep`` the number of newest checkpoints kept and the *horizon* the oldest
kept checkpoint's cut:

- every rollout accepted at or below the horizon loses its model, agent, resources and environment
  subjects (a JetStream subject purge each); its fence and its collector subject stay;
- the checkpoints older than the kept ones leave the catalog, and the marker lanes (the
  coordinator's, each participant instance's) lose their records below the horizon; the collector's
  lease lane keeps its last record (its compare-and-set needs it);
- the ledger forgets the compacted rollouts' call outcomes and revisions (nothing refers to them);
- the namespace's sandbox blobs that no tree still named on the stream needs are deleted
  (:func:`rollcut.sandbox.compact_blobs`);
- given the token store (``tokens``, a :class:`~rollcut.tokens.Releasable` one), the compacted
  rollouts' token records are released: their rows were written before their acceptance, so the
  rows are the hand-off, and no kept checkpoint can continue them. Each keeps a digest of its
  arrays and its policy versions (:class:`~rollcut.tokens.Released`), which the trainer-side
  reader checks a row against; the dropped checkpoints' token snapshots are forgotten with them.

Restore, ``checkpoints verify`` and ``ledger rebuild`` work on every kept checkpoint afterwards
(``tests/ledger/test_compact.py``). What is lost: ``rollcut replay`` of a compacted rollout shows it
accepted, without its turns. The rows hold its result and, with token ids on, its arrays; a row
that names receipts only (an opaque agent's) cannot be exported from a released store
(docs/performance.md, "A token store that lets go").

Runs are idempotent and incremental: the ledger remembers the horizon compacted to.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from .._errors import ConfigError
from ..bus import COLLECTOR_LANE, COORDINATOR_LANE, PARTICIPANT_ROLES, EventLog
from ..sandbox import compact_blobs
from ..tokens import Releasable
from ._ledger import Ledger

__all__ = ["CompactionReport", "compact"]

_COMPACTED_TO = "compacted_to"
_CONCURRENT_PURGES = 64


@dataclass
class CompactionReport:
    """What one compaction did."""

    horizon: int = 0
    """The oldest kept checkpoint's cut: nothing at or above it was touched."""
    checkpoints_kept: int = 0
    """Checkpoints still restorable after it (the newest ones the retention keeps)."""
    checkpoints_dropped: int = 0
    """Checkpoints retired from the ledger: no restore can name them any more."""
    rollouts_compacted: int = 0
    """Handed-off rollouts whose events below the horizon were let go (their rows stay)."""
    messages_purged: int = 0
    stream_bytes_before: int = 0
    """The stream's size as the compaction began (others keep writing while it runs)."""
    stream_bytes_after: int = 0
    blobs_deleted: int = 0
    """Sandbox blobs freed: no tree the stream still names needs them (:mod:`rollcut.sandbox`)."""
    blobs_kept: int = 0
    token_records_released: int = 0
    """Token records of the compacted rollouts let go (each keeps its :class:`Released`)."""
    token_bytes_released: int = 0
    seconds: float = 0.0
    dropped: list[str] = field(default_factory=list)


async def compact(
    log: EventLog, ledger: Ledger, *, keep: int = 2, tokens: Releasable | None = None
) -> CompactionReport:
    """Compact the stream and the ledger below the oldest of the ``keep`` newest checkpoints, and
    release the compacted rollouts' records from ``tokens`` if it can release."""
    if keep < 1:
        raise ConfigError(f"compaction keeps at least one checkpoint, not {keep}")
    t0 = time.perf_counter()
    out = CompactionReport(stream_bytes_before=(await log.stream_info()).state.bytes)
    checkpoints = ledger.checkpoints()  # oldest cut first
    kept, dropped = checkpoints[-keep:], checkpoints[:-keep]
    out.checkpoints_kept, out.checkpoints_dropped = len(kept), len(dropped)
    if not kept:
        out.stream_bytes_after = out.stream_bytes_before
        return out
    out.horizon = horizon = kept[0].cut
    done_to = int(ledger.meta(_COMPACTED_TO, 0))
    rollouts = ledger.accepted_between(done_to, horizon)  # the range this run frees, not every rollout
    s = log.subjects
    purges: list[tuple[str, int | None, int | None]] = [
        (subject, None, None)
        for rid in rollouts
        for component in PARTICIPANT_ROLES
        for subject in s.component_filters(component, rid)
    ]
    if horizon > done_to:
        for lane in await _lanes(log):
            if lane == COLLECTOR_LANE:
                purges.append((s.mark(lane), None, 1))
            else:  # the coordinator's lane and every instance's: what lies below the horizon
                purges.append((s.mark(lane), horizon, None))
    out.messages_purged = await _purge_all(log, purges)
    if tokens is not None:
        # before the ledger forgets the calls (a crash in between: the next run releases the same
        # range again, which skips what is gone), in a thread (thousands of records in one LMDB
        # transaction, off the collector's loop)
        calls = [c for rid in rollouts for c in ledger.call_ids(rid)]
        forget = [rec.token_snapshot_id for rec in dropped if rec.token_snapshot_id]
        released = await asyncio.to_thread(tokens.release, calls, forget)
        out.token_records_released = released.records_released
        out.token_bytes_released = released.bytes_released
    with ledger.write() as wb:
        for rec in dropped:
            wb.drop_checkpoint(rec)
        for rid in rollouts:
            wb.forget_sessions(rid)
        wb.set_meta(_COMPACTED_TO, max(done_to, horizon))
    out.rollouts_compacted = len(rollouts)
    out.dropped = [rec.checkpoint_id for rec in dropped]
    # after the purges: the trees of compacted rollouts are no root now (and none left otherwise)
    blobs = await compact_blobs(log) if rollouts else None
    if blobs is not None:
        out.blobs_deleted, out.blobs_kept = blobs.blobs_deleted, blobs.blobs_kept
    out.stream_bytes_after = (await log.stream_info()).state.bytes
    out.seconds = round(time.perf_counter() - t0, 3)
    return out


async def _lanes(log: EventLog) -> list[str]:
    """Every marker lane the stream holds (the coordinator's, the collector's, each instance's)."""
    info = await log.stream_info(subjects_filter=f"{log.subjects.prefix}.mark.*")
    lanes = [subj.rsplit(".", 1)[1] for subj in (info.state.subjects or {})]
    return sorted(lanes, key=lambda lane: lane != COORDINATOR_LANE)


async def _purge_all(log: EventLog, purges: list[tuple[str, int | None, int | None]]) -> int:
    """Run the subject purges, a bounded number at a time; how many messages went."""
    gate = asyncio.Semaphore(_CONCURRENT_PURGES)

    async def one(subject: str, below: int | None, keep: int | None) -> int:
        async with gate:
            return await log.purge(subject, below=below, keep=keep)

    # every purge settles before a failure is raised: a purge left running would go on after its
    # compaction had failed (and after its collection had ended, against a closed client)
    done = await asyncio.gather(*(one(*p) for p in purges), return_exceptions=True)
    for d in done:
        if isinstance(d, BaseException):
            raise d
    return sum(d for d in done if isinstance(d, int))
