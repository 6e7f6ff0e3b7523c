"""Checking that every reference below a cut resolves, incrementally.

A checkpoint may be published only if what the log refers to exists: each
completed or prefix-cut model call's token receipt is inside the token-store
snapshot bound to the checkpoint (with the same digest), and each agent
boundary's last model call and resources revisions were recorded. Checking
the whole history at every checkpoint would make checkpoint time grow with
the number of rollouts; instead the ledger remembers ``validated_seq``, and
each checkpoint checks only the events after it. Receipts are immutable once
in the store, so what validated once stays valid.

The check is fed page by page (:class:`ReferenceCheck`), so the coordinator
runs it on the very pages the projector applies: each event is read and decoded
once per checkpoint, not once to project and again to validate.
"""

from __future__ import annotations

from ..bus import AgentBoundary, CallStep, EventLog, RolloutEvent, StoredEvent, spec_of
from ..tokens import LineageStore, TokenSnapshot
from ._ledger import Ledger

__all__ = ["ReferenceCheck", "validate_references"]


class ReferenceCheck:
    """The reference checks over pages of events, fed in stream order.

    Receipts are checked as pages come; what an agent boundary names, at :meth:`finish`, against
    the ledger projected to the cut. ``reported`` maps a model participant instance to the
    calls its prepare reply accounted for: a call that instance admitted in the range (after its
    process started) and did not finish below the cut must be among them, or the
    acknowledgement is partial. Calls a previous, crashed process of the same instance admitted
    are not the new process's to know, and a call of an attempt closed below the cut (superseded
    or retired) can never end on the log: the fence refuses its outcome.
    """

    def __init__(
        self,
        ledger: Ledger,
        tokens: LineageStore | None,
        snapshot: TokenSnapshot | None,
        *,
        limit: int = 20,
        reported: dict[str, tuple[set[str], int]] | None = None,
    ) -> None:
        self.ledger, self.tokens, self.snapshot = ledger, tokens, snapshot
        self.limit = limit
        self.reported = reported
        self.problems: list[str] = []
        self.checked = 0
        # call_id -> (instance, seq, rollout, attempt) admitted, not yet ended
        self._open: dict[str, tuple[str, int, str, int]] = {}
        self._boundaries: list[tuple[int, AgentBoundary]] = []

    def page(self, page: list[StoredEvent]) -> None:
        """Check one page (stops adding problems at the limit)."""
        for s in page:
            if len(self.problems) >= self.limit:
                return
            self.checked += 1
            ev = s.event
            if isinstance(ev, RolloutEvent):
                self._event(s.seq, ev)

    def _event(self, seq: int, ev: RolloutEvent) -> None:
        spec = spec_of(ev)
        call_id: str = getattr(ev, "call_id", "")
        if self.reported is not None and spec.call is CallStep.OPENS:
            self._open[call_id] = (ev.instance, seq, ev.rollout_id, ev.attempt)
        elif self.reported is not None and spec.call is CallStep.ENDS:
            self._open.pop(call_id, None)
        receipt = spec.receipt_of(ev)
        if receipt is not None:
            if self.tokens is None or self.snapshot is None:
                self.problems.append(
                    f"seq {seq}: call {call_id} has a token receipt but no token store is bound"
                )
            elif not self.tokens.in_snapshot(self.snapshot, receipt):
                self.problems.append(
                    f"seq {seq}: receipt {receipt.receipt_id} of call {call_id} "
                    f"({ev.rollout_id}/{ev.attempt}) is not in token snapshot {self.snapshot.snapshot_id}"
                )
        elif isinstance(ev, AgentBoundary) and (
            ev.record.last_model_call_id or ev.record.resources_revisions
        ):
            # checked once everything up to the cut is projected: what a boundary names must exist
            # below the cut, and writers on different connections may land in either order
            self._boundaries.append((seq, ev))

    def _boundary(self, seq: int, ev: AgentBoundary) -> None:
        rec = ev.record
        if (
            rec.last_model_call_id
            and self.ledger.call_status(ev.rollout_id, ev.attempt, rec.last_model_call_id) is None
        ):
            self.problems.append(
                f"seq {seq}: boundary of {ev.rollout_id}/{ev.attempt} names model call "
                f"{rec.last_model_call_id}, which never completed"
            )
        for session, rev in rec.resources_revisions.items():
            have = self.ledger.revision(ev.rollout_id, ev.attempt, session)
            if have < rev:
                self.problems.append(
                    f"seq {seq}: boundary of {ev.rollout_id}/{ev.attempt} names {session} revision "
                    f"{rev}, but only {have} was recorded"
                )

    def finish(self) -> list[str]:
        """Every problem found (at most ``limit``), once every page up to the cut was fed (and the
        ledger projected to the cut)."""
        for seq, ev in self._boundaries:
            if len(self.problems) >= self.limit:
                break
            self._boundary(seq, ev)
        for call_id, (instance, seq, rollout_id, attempt) in self._open.items():
            if self.reported is None or instance not in self.reported:
                continue
            if _attempt_closed(self.ledger, rollout_id, attempt):
                continue  # its attempt was superseded or retired: the fence refuses its outcome for good
            calls, started = self.reported[instance]
            if seq > started and call_id not in calls:
                self.problems.append(
                    f"seq {seq}: {instance} admitted call {call_id} but its prepare reply omits it"
                )
        return self.problems[: self.limit]


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
    """Problems found among events ``start..cut`` (at most ``limit``), and events checked; the
    ledger must already be projected up to ``cut`` (see :class:`ReferenceCheck`)."""
    check = ReferenceCheck(ledger, tokens, snapshot, limit=limit, reported=reported)
    async for page in log.read_pages(start=start, up_to=cut, strict=False):
        check.page(page)
        if len(check.problems) >= limit:
            break
    return check.finish(), check.checked


def _attempt_closed(ledger: Ledger, rollout_id: str, attempt: int) -> bool:
    rec = ledger.rollout(rollout_id)
    if rec is None:
        return False
    return attempt in rec.tombstoned_attempts or attempt < rec.current_attempt or rec.retired_seq is not None
