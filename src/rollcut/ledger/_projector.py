"""The projector: keeps the ledger current from the stream.

Each page of events is applied in one LMDB transaction together with the new
watermark, so a crash at any point leaves the ledger at some exact stream
prefix, and projecting again from the watermark is idempotent. Rebuilding is
the same projection started from sequence 1 into an empty ledger, which is
why a rebuilt ledger equals the incrementally maintained one.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import LedgerError
from ..bus import (
    AgentBoundary,
    AttemptOpened,
    AttemptTombstoned,
    CallStep,
    CheckpointCommitted,
    Event,
    EventLog,
    RelayExchange,
    ResourcesMutated,
    ResourcesSeeded,
    ResourcesSnapshot,
    ResultAccepted,
    RolloutCompleted,
    RolloutDispatched,
    RolloutEvent,
    RolloutRetired,
    StoredEvent,
    Subjects,
    handlers_by_kind,
    spec_of,
)
from ._ledger import Ledger, _WriteBatch
from ._records import CheckpointRecord, RolloutIndex

__all__ = ["Projector", "rebuild_ledger"]


class Projector:
    """Applies stored events to a ledger, page by page."""

    def __init__(self, ledger: Ledger, log: EventLog) -> None:
        self.ledger = ledger
        self.log = log

    async def catch_up(
        self,
        *,
        up_to: int | None = None,
        start: int | None = None,
        on_page: Callable[[int, int], None] | None = None,
        on_events: Callable[[list[StoredEvent]], None] | None = None,
    ) -> int:
        """Project everything after the watermark (up to ``up_to``). Returns events applied.

        ``on_page`` hears progress (last applied, end); ``on_events`` gets each page once it is
        applied (a reader that needs the ledger up to the page, without reading it again), from
        ``start`` on if given (a reader behind the watermark gets the pages it missed too; only
        events past the watermark are applied). Several projectors of one ledger may run at once:
        each page applies only what is past the watermark inside its own transaction."""
        self._check_stream()
        watermark = self.ledger.watermark
        last = await self.log.last_seq()
        if watermark > last:
            raise LedgerError(
                f"ledger at {self.ledger.path} is at seq {watermark} but stream {self.log.stream} "
                f"ends at {last}: it belongs to another stream; rebuild it",
                path=str(self.ledger.path),
                stream=self.log.stream,
            )
        first = watermark + 1 if start is None else start
        end = last if up_to is None else min(up_to, last)
        if end < first:
            return 0  # nothing past where the reader is
        applied = 0
        async for page in self.log.read_pages(start=first, up_to=end, strict=False):
            if page:
                applied += self._apply_page(page)
                if on_events:
                    on_events(page)
                if on_page:
                    on_page(page[-1].seq, end)
        return applied

    def _check_stream(self) -> None:
        have = self.ledger.meta("stream")
        if have is not None and have != self.log.stream:
            raise LedgerError(
                f"ledger at {self.ledger.path} projects stream {have}, not {self.log.stream}",
                path=str(self.ledger.path),
                stream=self.log.stream,
            )

    def _apply_page(self, page: list[StoredEvent]) -> int:
        if page[-1].seq <= self.ledger.watermark:
            return 0  # applied already (by another projector, or we started behind)
        with self.ledger.write() as wb:
            mark = int(wb.meta("watermark", 0))
            fresh = [s for s in page if s.seq > mark]
            for stored in fresh:
                apply_event(wb, self.log.subjects, stored)
            if fresh:
                wb.set_meta("watermark", fresh[-1].seq)
                wb.set_meta("stream", self.log.stream)
        return len(fresh)


def _dispatched(rec: RolloutIndex, seq: int, ev: RolloutDispatched) -> None:
    rec.current_attempt, rec.open, rec.dispatch_seq, rec.attempt_opened_seq = 1, True, seq, seq
    rec.status = "running"


def _tombstoned(rec: RolloutIndex, seq: int, ev: AttemptTombstoned) -> None:
    rec.open = False
    rec.tombstoned_attempts.append(ev.attempt)
    if rec.status not in _SETTLED:
        rec.status = "tombstoned"


def _opened(rec: RolloutIndex, seq: int, ev: AttemptOpened) -> None:
    rec.current_attempt, rec.open, rec.attempt_opened_seq = ev.attempt, True, seq
    if rec.status not in _SETTLED:
        rec.status = "running"


def _boundary(rec: RolloutIndex, seq: int, ev: AgentBoundary) -> None:
    rec.last_boundary_seq, rec.last_boundary_attempt = seq, ev.attempt
    rec.last_boundary_turn = ev.record.turn


def _completed(rec: RolloutIndex, seq: int, ev: RolloutCompleted) -> None:
    rec.completed_seq, rec.completed_attempt = seq, ev.attempt
    if rec.status != "accepted":
        rec.status = "completed"


def _exchange(rec: RolloutIndex, seq: int, ev: RelayExchange) -> None:
    # an opaque agent can be continued through any journaled exchange: each is its boundary, and
    # its number stands for the turn
    rec.last_boundary_seq, rec.last_boundary_attempt = seq, ev.attempt
    rec.last_boundary_turn = ev.n


def _accepted(rec: RolloutIndex, seq: int, ev: ResultAccepted) -> None:
    rec.accepted_seq, rec.status = seq, "accepted"


def _retired(rec: RolloutIndex, seq: int, ev: RolloutRetired) -> None:
    rec.open, rec.retired_seq, rec.retired_reason = False, seq, ev.reason
    if rec.status != "accepted":
        rec.status = "retired"


_SETTLED = ("accepted", "completed")
# what each kind does to its rollout's index entry; a kind not here only moves last_seq
_ROLLOUT: dict[type[Event], Callable[[RolloutIndex, int, Any], None]] = handlers_by_kind(
    {
        RolloutDispatched: _dispatched,
        AttemptTombstoned: _tombstoned,
        AttemptOpened: _opened,
        AgentBoundary: _boundary,
        RelayExchange: _exchange,
        RolloutCompleted: _completed,
        ResultAccepted: _accepted,
        RolloutRetired: _retired,
    }
)
_CALL_STATUS: dict[CallStep, bytes] = {CallStep.ENDS: b"c", CallStep.CUT: b"p"}


def apply_event(wb: _WriteBatch, subjects: Subjects, stored: StoredEvent) -> None:
    """The projection of one event onto the index and catalog."""
    ev = stored.event
    seq = stored.seq
    if ev is None:
        rid = subjects.parse(stored.subject).rollout_id
        if rid is not None:
            rec = wb.rollout(rid) or RolloutIndex(rollout_id=rid)
            rec.corrupt_seqs.append(seq)
            rec.last_seq = seq
            wb.put_rollout(rec)
        return
    if isinstance(ev, CheckpointCommitted):
        wb.put_checkpoint(
            CheckpointRecord(
                checkpoint_id=ev.checkpoint_id,
                cut=ev.cut,
                token_snapshot_id=ev.token_snapshot_id,
                token_snapshot_digest=ev.token_snapshot_digest,
                participants=list(ev.participants),
                ts=ev.ts,
                quarantined=dict(ev.quarantined),
            )
        )
        return
    if not isinstance(ev, RolloutEvent):
        return
    spec = spec_of(ev)
    # a completed (or reused) call is recorded as completed; a prefix cut as cut; a failed or
    # excluded call's outcome is never referred to, so it is not indexed
    status = _CALL_STATUS.get(spec.call) if spec.receipt is not None and spec.call is not None else None
    if status is not None:
        wb.set_call(ev.rollout_id, ev.attempt, ev.call_id, status)  # type: ignore[attr-defined]
    elif isinstance(ev, ResourcesMutated | ResourcesSeeded | ResourcesSnapshot):
        wb.raise_revision(ev.rollout_id, ev.attempt, ev.session, ev.revision)
    rec = wb.rollout(ev.rollout_id) or RolloutIndex(rollout_id=ev.rollout_id)
    rec.last_seq = seq
    project = _ROLLOUT.get(type(ev))
    if project is not None:
        project(rec, seq, ev)
    wb.put_rollout(rec)


async def rebuild_ledger(
    log: EventLog,
    path: str | os.PathLike[str],
    *,
    on_page: Callable[[int, int], None] | None = None,
) -> tuple[int, Path | None]:
    """Rebuild the ledger at ``path`` from the stream alone.

    The new ledger is built beside the old one and swapped in only when
    complete; the old directory (possibly corrupt) is kept, renamed, never
    overwritten. Returns (events projected, where the old ledger went).
    """
    target = Path(path)
    tmp = target.with_name(target.name + ".rebuild")
    shutil.rmtree(tmp, ignore_errors=True)
    with Ledger(tmp) as fresh:
        n = await Projector(fresh, log).catch_up(on_page=on_page)
    return n, _swap_in(tmp, target)


def _swap_in(new: Path, target: Path) -> Path | None:
    """Move ``new`` to ``target``; an existing target is renamed aside, never deleted."""
    kept: Path | None = None
    if target.exists():
        kept = target.with_name(f"{target.name}.old-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        target.rename(kept)
    new.rename(target)
    return kept
