"""Re-checking a published checkpoint against the stream and the token store."""

from __future__ import annotations

from ..bus import CheckpointSealed, EventLog
from ..tokens import TokenSnapshot, TokenStore
from ._ledger import Ledger
from ._projector import Projector
from ._validate import validate_references

__all__ = ["verify_checkpoint"]


async def verify_checkpoint(
    log: EventLog, ledger: Ledger, tokens: TokenStore | None, checkpoint_id: str
) -> list[str]:
    """Every problem found (empty: the checkpoint verifies).

    Checks, from scratch rather than incrementally: the seal marker sits at
    the cut; every event up to the cut passes its checksum and decodes; every
    reference below the cut resolves; the token-store snapshot recomputes to
    the digest the record binds, record by record.
    """
    rec = ledger.checkpoint(checkpoint_id)
    if rec is None:
        return [f"checkpoint {checkpoint_id} is not published in ledger {ledger.path}"]
    problems: list[str] = []
    seal = [s async for s in log.read(start=rec.cut, up_to=rec.cut, strict=False)]
    if (
        not seal
        or not isinstance(seal[0].event, CheckpointSealed)
        or seal[0].event.checkpoint_id != checkpoint_id
    ):
        problems.append(f"seq {rec.cut} is not the seal of {checkpoint_id}")
    async for page in log.read_pages(up_to=rec.cut, strict=False):
        problems += [f"seq {s.seq}: {s.error}" for s in page if s.error is not None]
    snapshot: TokenSnapshot | None = None
    if rec.token_snapshot_id:
        if tokens is None:
            problems.append(
                f"the record binds token snapshot {rec.token_snapshot_id} but no token store was given"
            )
        else:
            snapshot = tokens.snapshot(checkpoint_id)  # returns the bound one (idempotent per id)
            if snapshot.snapshot_id != rec.token_snapshot_id or snapshot.digest != rec.token_snapshot_digest:
                problems.append(f"token snapshot {snapshot.snapshot_id} is not the one the record binds")
            problems += tokens.verify_snapshot(snapshot)
    if ledger.watermark < rec.cut:
        await Projector(ledger, log).catch_up(up_to=rec.cut)
    refs, _ = await validate_references(log, ledger, tokens, snapshot, start=1, cut=rec.cut, limit=100)
    return problems + refs
