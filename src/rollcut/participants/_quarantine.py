"""Which rollouts a checkpoint quarantines (issue 29: fail closed for the rollout, never the namespace).

A rollout whose references below the cut do not resolve, found by two checkpoints in a row, is
named in the record with why; recovery starts it over from its input. So is one whose state a
participant could not export at the prepare (a sandbox tree with a link out of it: issue 49), which
needs no second look: the participant says so itself. Validation is incremental, so what an earlier
checkpoint quarantined is not looked at again: it is carried forward until the rollout finishes.
"""

from __future__ import annotations

from ..ledger import Finding, Ledger

__all__ = ["quarantines"]


def quarantines(
    ledger: Ledger, findings: list[Finding], reported: dict[str, str] | None = None
) -> dict[str, str]:
    """This checkpoint's quarantines: the findings' rollouts and those the participants reported
    (every message, bounded), and the latest checkpoint's that are still running."""
    latest = ledger.latest_checkpoint()
    out = {rid: why for rid, why in (latest.quarantined if latest else {}).items() if _running(ledger, rid)}
    found = [(f.rollout_id, f.message) for f in findings if f.rollout_id is not None]
    for rid, message in [*found, *(reported or {}).items()]:
        if len(out.get(rid, "")) < 1000:
            out[rid] = "; ".join(filter(None, (out.get(rid), message[:300])))
    return out


def _running(ledger: Ledger, rollout_id: str) -> bool:
    rec = ledger.rollout(rollout_id)
    return rec is None or (rec.accepted_seq is None and rec.retired_seq is None)
