"""Checking that every reference below a cut resolves, incrementally.

A checkpoint may be published only if what the log refers to exists: each
completed or prefix-cut model call's token receipt is inside the token-store
snapshot bound to the checkpoint (with the same digest), and each agent
boundary's last model call and resources revisions were recorded. Checking
the whole history at every checkpoint would make checkpoint time grow with
the number of rollouts; instead the ledger remembers ``validated_seq``, and
each checkpoint checks only the events after it. Receipts are immutable once
in the store, so what validated once stays valid.
"""

from __future__ import annotations

from ..bus import AgentBoundary, CallStep, EventLog, RolloutEvent, spec_of
from ..tokens import LineageStore, TokenSnapshot
from ._ledger import Ledger

__all__ = ["validate_references"]


async def validate_references(
    log: EventLog,
    ledger: Ledger,
    tokens: LineageStore | None,
    snapshot: TokenSnapshot | None,
    *,
    start: int,
    cut: int,
    limit: int = 20,
    reported: dict[str, tuple[set[str], int]] | None = None,
) -> tuple[list[str], int]:
    """Problems found among events ``start..cut`` (at most ``limit``), and events checked.

    The ledger must already be projected up to ``cut``. ``reported`` maps a model
    participant instance to the calls its prepare reply accounted for: a call that
    instance admitted in this range (after its process started) and did not
    finish below the cut must be among them, or the acknowledgement is partial.
    Calls a previous, crashed process of the same instance admitted are not the
    new process's to know, and a call of an attempt closed below the cut (superseded
    or retired) can never end on the log: the fence refuses its outcome.
    """
    problems: list[str] = []
    checked = 0
    # call_id -> (instance, seq, rollout, attempt) admitted, not yet ended
    open_calls: dict[str, tuple[str, int, str, int]] = {}
    async for page in log.read_pages(start=start, up_to=cut, strict=False):
        for s in page:
            checked += 1
            ev = s.event
            if not isinstance(ev, RolloutEvent):
                continue
            spec = spec_of(ev)
            call_id: str = getattr(ev, "call_id", "")
            if reported is not None and spec.call is CallStep.OPENS:
                open_calls[call_id] = (ev.instance, s.seq, ev.rollout_id, ev.attempt)
            elif reported is not None and spec.call is CallStep.ENDS:
                open_calls.pop(call_id, None)
            receipt = spec.receipt_of(ev)
            if receipt is not None:
                if tokens is None or snapshot is None:
                    problems.append(
                        f"seq {s.seq}: call {call_id} has a token receipt but no token store is bound"
                    )
                elif not tokens.in_snapshot(snapshot, receipt):
                    problems.append(
                        f"seq {s.seq}: receipt {receipt.receipt_id} of call {call_id} "
                        f"({ev.rollout_id}/{ev.attempt}) is not in token snapshot {snapshot.snapshot_id}"
                    )
            elif isinstance(ev, AgentBoundary):
                rec = ev.record
                if (
                    rec.last_model_call_id
                    and ledger.call_status(ev.rollout_id, ev.attempt, rec.last_model_call_id) is None
                ):
                    problems.append(
                        f"seq {s.seq}: boundary of {ev.rollout_id}/{ev.attempt} names model call "
                        f"{rec.last_model_call_id}, which never completed"
                    )
                for session, rev in rec.resources_revisions.items():
                    have = ledger.revision(ev.rollout_id, ev.attempt, session)
                    if have < rev:
                        problems.append(
                            f"seq {s.seq}: boundary of {ev.rollout_id}/{ev.attempt} names {session} revision "
                            f"{rev}, but only {have} was recorded"
                        )
            if len(problems) >= limit:
                return problems, checked
    for call_id, (instance, seq, rollout_id, attempt) in open_calls.items():
        if reported is None or instance not in reported:
            continue
        if _attempt_closed(ledger, rollout_id, attempt):
            continue  # its attempt was superseded or retired: the fence refuses its outcome for good
        calls, started = reported[instance]
        if seq > started and call_id not in calls:
            problems.append(f"seq {seq}: {instance} admitted call {call_id} but its prepare reply omits it")
    return problems[:limit], checked


def _attempt_closed(ledger: Ledger, rollout_id: str, attempt: int) -> bool:
    rec = ledger.rollout(rollout_id)
    if rec is None:
        return False
    return attempt in rec.tombstoned_attempts or attempt < rec.current_attempt or rec.retired_seq is not None
