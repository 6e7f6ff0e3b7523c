"""The collector's side of the hand-off: a row made durable, and ids that are another collection's.

A finished rollout's row is appended to the output and fsynced before its ``result.accepted``
(exactly-once hand-off, ``docs/collect.md``); a write that fails stops the collection with the
rollout still pending and nothing acknowledged for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._errors import ConfigError, StorageError
from .._files import append_private
from ..bus import EventLog
from ..ledger import Ledger, Projector

__all__ = ["refuse_foreign", "write_row"]


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


async def refuse_foreign(log: EventLog, ledger: Ledger, rollouts: list[str], written: dict[str, Any]) -> None:
    """A rollout this collection names that the namespace already accepted, with no row in this
    output, was collected by another collection (the same task ids again): refused before anything
    is dispatched, naming them, instead of ending with rows the collection can never write."""
    await Projector(ledger, log).catch_up()
    mine = set(rollouts)
    foreign = sorted(
        r.rollout_id
        for r in ledger.rollouts()
        if r.rollout_id in mine and r.accepted_seq is not None and r.rollout_id not in written
    )
    if foreign:
        more = ", …" if len(foreign) > 5 else ""
        raise ConfigError(
            f"{len(foreign)} of this collection's rollout ids ({', '.join(foreign[:5])}{more}) were already "
            f"collected in namespace {log.subjects.namespace!r}, and their rows are not in this output: "
            "another collection used the same task ids; use a new namespace or new task ids"
        )
