"""Re-checking a published checkpoint against the stream and the token store.

What verify finds is one of two things. A **problem** fails the checkpoint: the seal is not at the
cut, the token snapshot does not recompute, or a reference that belongs to no rollout does not
resolve. A **quarantine** costs one rollout or one lane only: a corrupt record on a rollout's
subjects, or a reference of that rollout that does not resolve, quarantines the rollout (recovery
starts it over from its input, as the checkpoint itself recorded); garbage on a shared lane (a
marker lane, a lease) is skipped and reported. So no single bad record fails every checkpoint of
a namespace (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..bus import CheckpointSealed, EventLog
from ..tokens import TokenSnapshot, TokenStore
from ._ledger import Ledger
from ._projector import Projector
from ._validate import validate_references

__all__ = ["VerifyReport", "verify_checkpoint", "verify_report"]


@dataclass
class VerifyReport:
    """What :func:`verify_report` found: problems (the checkpoint fails) and quarantines."""

    problems: list[str] = field(default_factory=list)
    quarantined: dict[str, str] = field(default_factory=dict)
    """Rollout id (or ``lane <subject>``) -> why."""

    def quarantine(self, key: str, why: str) -> None:
        self.quarantined.setdefault(key, why)


async def verify_checkpoint(
    log: EventLog, ledger: Ledger, tokens: TokenStore | None, checkpoint_id: str
) -> list[str]:
    """Every problem found (empty: the checkpoint verifies); quarantines are not problems (see
    :func:`verify_report`)."""
    return (await verify_report(log, ledger, tokens, checkpoint_id)).problems


async def verify_report(
    log: EventLog, ledger: Ledger, tokens: TokenStore | None, checkpoint_id: str
) -> VerifyReport:
    """Checks, from scratch rather than incrementally: the seal marker sits at the cut; every event
    up to the cut passes its checksum and decodes; every reference below the cut resolves; the
    token-store snapshot recomputes to the digest the record binds, record by record."""
    report = VerifyReport()
    rec = ledger.checkpoint(checkpoint_id)
    if rec is None:
        report.problems.append(f"checkpoint {checkpoint_id} is not published in ledger {ledger.path}")
        return report
    for rid, why in rec.quarantined.items():
        report.quarantine(rid, f"quarantined by the checkpoint: {why}")
    seal = [s async for s in log.read(start=rec.cut, up_to=rec.cut, strict=False)]
    if (
        not seal
        or not isinstance(seal[0].event, CheckpointSealed)
        or seal[0].event.checkpoint_id != checkpoint_id
    ):
        report.problems.append(f"seq {rec.cut} is not the seal of {checkpoint_id}")
    async for page in log.read_pages(up_to=rec.cut, strict=False):
        for s in page:
            if s.error is None:
                continue
            owner = log.subjects.parse(s.subject).rollout_id
            report.quarantine(owner if owner is not None else f"lane {s.subject}", f"seq {s.seq}: {s.error}")
    snapshot: TokenSnapshot | None = None
    if rec.token_snapshot_id:
        if tokens is None:
            report.problems.append(
                f"the record binds token snapshot {rec.token_snapshot_id} but no token store was given"
            )
        else:
            snapshot = tokens.snapshot(checkpoint_id)  # returns the bound one (idempotent per id)
            if snapshot.snapshot_id != rec.token_snapshot_id or snapshot.digest != rec.token_snapshot_digest:
                report.problems.append(
                    f"token snapshot {snapshot.snapshot_id} is not the one the record binds"
                )
            report.problems += tokens.verify_snapshot(snapshot)
    if ledger.watermark < rec.cut:
        await Projector(ledger, log).catch_up(up_to=rec.cut)
    refs, _ = await validate_references(log, ledger, tokens, snapshot, start=1, cut=rec.cut, limit=100)
    for f in refs:
        if f.rollout_id is None:
            report.problems.append(str(f))
        else:
            report.quarantine(f.rollout_id, str(f))
    return report
