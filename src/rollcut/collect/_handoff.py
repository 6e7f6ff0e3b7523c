"""The collector's side of the hand-off: a row made durable, and ids that are another collection's.

A finished rollout's row is appended to the output and fsynced before its ``result.accepted``
(exactly-once hand-off, ``docs/collect.md``); a write that fails stops the collection with the
rollout still pending and nothing acknowledged for it.
"""

from __future__ import annotations

import json
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import ConfigError, StorageError
from .._files import append_private
from ..bus import EventLog, ResultAccepted
from ..ledger import Ledger, Projector
from ._index import Written
from ._rows import Rows, row_kept
from ._summary import Summary

__all__ = ["HandOff", "Standing", "refuse_foreign", "standing", "write_row"]


def write_row(path: Path, row: dict[str, Any]) -> None:
    """Append one row durably (0600); a failure is a :class:`StorageError` naming the rollout."""
    try:
        append_private(path, (json.dumps(row, sort_keys=True) + "\n").encode())
    except OSError as exc:
        raise StorageError(
            f"cannot write the row of {row.get('rollout_id')} to {path}: {exc.strerror or exc}",
            path=str(path),
            errno=exc.errno,
        ) from exc


@dataclass
class HandOff:
    """Each rollout's one row, durable, then its acknowledgement on the log (``result.accepted``):
    what the collection hands over, and the record of what it has (``written``: rollout id -> the
    row's digest and reward, what the acknowledgement binds; not the row, which holds the episode)."""

    log: EventLog
    instance: str
    rows: Rows
    output: Path
    summary: Summary
    written: Written

    async def result(self, rid: str, attempt: int, result: dict[str, Any]) -> None:
        kept = self.written.get(rid)
        if kept is None:  # the row first, durable; then the acknowledgement
            row = self.rows.result_row(rid, attempt, result)
            write_row(self.output, row)
            self.written[rid] = kept = row_kept(row)
            self.summary.results_written += 1
        await self.accept(rid, attempt, kept)

    def retired(self, rid: str, attempt: int, reason: str) -> None:
        """A rollout given up: its row, marked ``retired`` (the output names every rollout once)."""
        if rid in self.written:
            return
        path, row = self.rows.failure_row(rid, attempt, reason)
        write_row(path, row)
        self.written[rid] = row_kept(row)
        self.summary.results_written += 1
        self.summary.retired += 1

    async def accept(self, rid: str, attempt: int, kept: tuple[str, float]) -> None:
        """The hand-off acknowledgement: binds the row's digest to the rollout for good."""
        digest, reward = kept
        await self.log.append(
            ResultAccepted(
                component="collector",
                instance=self.instance,
                rollout_id=rid,
                attempt=attempt,
                result_digest=digest,
                reward=reward,
            )
        )


@dataclass
class Standing:
    """Where a collection's rollouts stood when it started, as the namespace knows them: one pass over
    the ledger. What it lists is bounded by the rollouts a stop interrupted (rollouts are dispatched
    as they start, not all at once), except ``foreign``, which refuses the collection."""

    dispatched: int = 0
    completed: int = 0
    retired: int = 0
    unfinished: list[str] = field(default_factory=list)  # dispatched, neither written nor ended
    unacknowledged: list[str] = field(default_factory=list)  # a row written, its acceptance lost
    rowless: list[tuple[str, int]] = field(default_factory=list)  # retired, its row lost: (rid, attempt)
    foreign: list[str] = field(default_factory=list)  # accepted, and no row in this output


async def standing(
    log: EventLog, ledger: Ledger, inputs: Container[str], written: Container[str]
) -> Standing:
    """Where this collection's rollouts stand, from the ledger caught up with the log."""
    await Projector(ledger, log).catch_up()
    out = Standing()
    for r in ledger.rollouts():
        rid = r.rollout_id
        if rid not in inputs:
            continue
        if r.accepted_seq is not None and rid not in written:
            out.foreign.append(rid)
        if not r.dispatch_seq:
            continue
        out.dispatched += 1
        if r.retired_seq is not None and r.accepted_seq is None:
            out.retired += 1
            if rid not in written:
                out.rowless.append((rid, r.current_attempt))
        elif rid in written:
            out.completed += 1
            if r.accepted_seq is None:
                out.unacknowledged.append(rid)
        elif r.accepted_seq is not None:
            out.completed += 1
        else:
            out.unfinished.append(rid)
    return out


def refuse_foreign(log: EventLog, foreign: list[str]) -> None:
    """A rollout this collection names that the namespace already accepted, with no row in this
    output, was collected by another collection (the same task ids again): refused before anything
    is dispatched, naming them, instead of ending with rows the collection can never write."""
    if foreign:
        foreign = sorted(foreign)
        more = ", …" if len(foreign) > 5 else ""
        raise ConfigError(
            f"{len(foreign)} of this collection's rollout ids ({', '.join(foreign[:5])}{more}) were already "
            f"collected in namespace {log.subjects.namespace!r}, and their rows are not in this output: "
            "another collection used the same task ids; use a new namespace or new task ids"
        )
