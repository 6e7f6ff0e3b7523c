"""Which rollouts a checkpoint quarantines (issue 29: fail closed for the rollout, never the namespace).

A rollout whose references below the cut do not resolve, found by two checkpoints in a row, is
named in the record with why; recovery starts it over from its input. Validation is incremental,
so what an earlier checkpoint quarantined is not looked at again: it is carried forward until the
rollout finishes.
"""

from __future__ import annotations

from ..ledger import Finding, Ledger

__all__ = ["quarantines"]


def quarantines(ledger: Ledger, findings: list[Finding]) -> dict[str, str]:
    """This checkpoint's quarantines: the findings' rollouts (every message, bounded), and the latest
    checkpoint's that are still running."""
    latest = ledger.latest_checkpoint()
    out = {rid: why for rid, why in (latest.quarantined if latest else {}).items() if _running(ledger, rid)}
    for f in findings:
        if f.rollout_id is not None and len(out.get(f.rollout_id, "")) < 1000:
            out[f.rollout_id] = "; ".join(filter(None, (out.get(f.rollout_id), f.message[:300])))
    return out


def _running(ledger: Ledger, rollout_id: str) -> bool:
    rec = ledger.rollout(rollout_id)
    return rec is None or (rec.accepted_seq is None and rec.retired_seq is None)
