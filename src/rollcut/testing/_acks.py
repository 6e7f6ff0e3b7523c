"""What a fault trial checks afterwards: every acknowledgement a writer was told is in the stream,
no model call completed was generated again, and every rollout has exactly one row.

Every rollcut process started with ``$ROLLCUT_ACK_JOURNAL`` naming a directory keeps a journal of
the acknowledgements it received (``<seq> <event id>`` lines, ``bus/_commit.py``); after the run,
each must be in the stream at the sequence it was told, holding that event.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from ..bus import BusConfig, Credentials, EventLog, ModelCallCompleted

__all__ = ["acked", "each_rollout_once", "generated_twice", "missing_acks"]


def each_rollout_once(rows: Iterable[dict[str, Any]], expected: int | Collection[str]) -> None:
    """The oracle every collection is held to: one row for each of its rollouts (``expected``: how
    many, or their ids), none written twice, none missing; an ``AssertionError`` naming which."""
    ids = Counter(r["rollout_id"] for r in rows)
    twice = sorted(r for r, n in ids.items() if n > 1)
    if twice:
        raise AssertionError(f"rows written twice: {twice[:10]}")
    if isinstance(expected, int):
        if len(ids) != expected:
            raise AssertionError(f"{len(ids)} of {expected} rollouts have a row")
    elif sorted(ids) != sorted(expected):
        missing, extra = sorted(set(expected) - set(ids)), sorted(set(ids) - set(expected))
        raise AssertionError(f"missing {missing[:10]}, unexpected {extra[:10]}")


def acked(journal: Path) -> dict[int, str]:
    """Every acknowledgement the writers of a run were given, by seq."""
    out: dict[int, str] = {}
    for f in journal.glob("*.acks"):
        for line in f.read_text().splitlines():
            seq, _, eid = line.partition(" ")
            if out.setdefault(int(seq), eid) != eid:
                raise AssertionError(f"seq {seq} acknowledged for two events")
    return out


async def _stored(url: str, creds: Credentials) -> dict[int, str]:
    log = await EventLog.connect(BusConfig(url=url).as_role(creds, "admin"))
    try:
        return {s.seq: s.event.event_id async for s in log.read(strict=False) if s.event is not None}
    finally:
        await log.close()


def missing_acks(url: str, creds: Credentials, journal: Path) -> tuple[int, list[str]]:
    """How many acknowledgements the journal holds, and each one the stream does not hold as acked."""
    told = acked(journal)
    stored = asyncio.run(_stored(url, creds))
    wrong = [f"seq {n}: acked {e}, stored {stored.get(n)}" for n, e in told.items() if stored.get(n) != e]
    return len(told), wrong


async def _generated(url: str, creds: Credentials) -> list[tuple[str, str, str]]:
    log = await EventLog.connect(BusConfig(url=url).as_role(creds, "admin"))
    try:
        return [
            (s.event.rollout_id, s.event.request_digest, f"{s.event.attempt}/{s.event.call_id}@{s.seq}")
            async for s in log.read(strict=False)
            if isinstance(s.event, ModelCallCompleted)
        ]
    finally:
        await log.close()


def generated_twice(url: str, creds: Credentials) -> list[str]:
    """Each request of a rollout the model server generated more than once (``rollout: digest`` and
    where each completion is: ``attempt/call@seq``): a call that completed is served from the log
    after any fault, never generated again."""
    seen: dict[tuple[str, str], list[str]] = {}
    for rid, digest, where in asyncio.run(_generated(url, creds)):
        seen.setdefault((rid, digest), []).append(where)
    return [f"{rid}: {digest} ({', '.join(at)})" for (rid, digest), at in seen.items() if len(at) > 1]
