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

from dataclasses import dataclass

from ..bus import AgentBoundary, CallStep, EventLog, RolloutEvent, StoredEvent, TokenReceipt, spec_of
from ..tokens import TokenSnapshot, TokenStore
from ._ledger import Ledger

__all__ = ["Finding", "ReferenceCheck", "validate_references"]


@dataclass(frozen=True)
class Finding:
    """A reference below a cut that does not resolve, and the rollout it belongs to.

    A finding with a rollout costs that rollout only (its checkpoint publishes with the rollout
    quarantined, and recovery starts it over from its input); one without (no token store bound)
    fails the checkpoint: it says nothing about any one rollout."""

    seq: int
    message: str
    rollout_id: str | None = None
    attempt: int | None = None

    def __str__(self) -> str:
        return self.message


class ReferenceCheck:
    """The reference checks over pages of events, fed in stream order, as early as they can be made.

    The ledger must be projected at least to the end of each page when it is fed (the projector
    applies a page, then hands it here), and never beyond the cut the check ends at. Each event is
    checked when it is fed, against what is known then: a receipt must be in the token store with
    its digest (``has``; with a ``snapshot`` given up front, in that snapshot), a boundary's model
    call must have completed and its resources revisions been recorded. What does not resolve yet
    stays pending (a writer on another connection may land later, still below the cut) and is
    checked again at :meth:`finish`, where it becomes a problem. Fed continuously (``TailValidator``),
    a checkpoint is left with only the tail since the last page, and what is pending.

    ``reported`` (at :meth:`finish`) maps a model participant instance to the calls its prepare
    reply accounted for: a call that instance admitted in the range (after its process started)
    and did not finish below the cut must be among them, or the acknowledgement is partial. Calls a
    previous, crashed process of the same instance admitted are not the new process's to know, and
    a call of an attempt closed below the cut (superseded or retired) can never end on the log: the
    fence refuses its outcome.
    """

    def __init__(
        self,
        ledger: Ledger,
        tokens: TokenStore | None,
        snapshot: TokenSnapshot | None = None,
        *,
        limit: int = 20,
    ) -> None:
        self.ledger, self.tokens, self.snapshot = ledger, tokens, snapshot
        self.limit = limit
        self.checked = 0
        # call_id -> (instance, seq, rollout, attempt) admitted, not yet ended
        self._open: dict[str, tuple[str, int, str, int]] = {}
        self._receipts: list[tuple[int, RolloutEvent, TokenReceipt]] = []  # not (yet) in the store
        self._boundaries: list[tuple[int, AgentBoundary]] = []  # naming what is not (yet) recorded

    def reset(self) -> None:
        """Forget the range: everything fed so far was published as valid."""
        self.checked = 0
        self._open.clear()
        self._receipts.clear()
        self._boundaries.clear()

    def page(self, page: list[StoredEvent]) -> None:
        """Check one page; what does not resolve yet is kept for :meth:`finish`."""
        for s in page:
            self.checked += 1
            ev = s.event
            if isinstance(ev, RolloutEvent):
                self._event(s.seq, ev)

    def _event(self, seq: int, ev: RolloutEvent) -> None:
        spec = spec_of(ev)
        call_id: str = getattr(ev, "call_id", "")
        if spec.call is CallStep.OPENS:
            self._open[call_id] = (ev.instance, seq, ev.rollout_id, ev.attempt)
        elif spec.call is CallStep.ENDS:
            self._open.pop(call_id, None)
        receipt = spec.receipt_of(ev)
        if receipt is not None:
            if not self._stored(receipt, self.snapshot):
                self._receipts.append((seq, ev, receipt))
        elif isinstance(ev, AgentBoundary) and self._boundary(seq, ev):
            self._boundaries.append((seq, ev))

    def _stored(self, receipt: TokenReceipt, snapshot: TokenSnapshot | None) -> bool:
        if self.tokens is None:
            return False
        return self.tokens.in_snapshot(snapshot, receipt) if snapshot else self.tokens.has(receipt)

    def _boundary(self, seq: int, ev: AgentBoundary) -> list[Finding]:
        """What the boundary names that the ledger does not hold (yet)."""
        rec, missing = ev.record, list[str]()
        if (
            rec.last_model_call_id
            and self.ledger.call_status(ev.rollout_id, ev.attempt, rec.last_model_call_id) is None
        ):
            missing.append(
                f"seq {seq}: boundary of {ev.rollout_id}/{ev.attempt} names model call "
                f"{rec.last_model_call_id}, which never completed"
            )
        for session, rev in rec.resources_revisions.items():
            have = self.ledger.revision(ev.rollout_id, ev.attempt, session)
            if have < rev:
                missing.append(
                    f"seq {seq}: boundary of {ev.rollout_id}/{ev.attempt} names {session} revision "
                    f"{rev}, but only {have} was recorded"
                )
        return [Finding(seq, m, ev.rollout_id, ev.attempt) for m in missing]

    def settle(self) -> None:
        """Check the pending boundaries again (the ledger has moved on): keep those still open."""
        self._boundaries = [(seq, ev) for seq, ev in self._boundaries if self._boundary(seq, ev)]

    def finish(
        self,
        snapshot: TokenSnapshot | None = None,
        reported: dict[str, tuple[set[str], int]] | None = None,
    ) -> list[Finding]:
        """Every problem of the range (at most ``limit``), once every page up to the cut was fed and
        the ledger projected to the cut. The state is kept: a checkpoint that fails leaves the range
        to be checked again, with what is fed after it."""
        problems: list[Finding] = []
        snap = snapshot or self.snapshot
        for seq, ev, receipt in self._receipts:
            call = getattr(ev, "call_id", "")
            if self.tokens is None or snap is None:
                problems.append(
                    Finding(seq, f"seq {seq}: call {call} has a token receipt but no token store is bound")
                )
            elif not self._stored(receipt, snap):
                problems.append(
                    Finding(
                        seq,
                        f"seq {seq}: receipt {receipt.receipt_id} of call {call} "
                        f"({ev.rollout_id}/{ev.attempt}) is not in token snapshot {snap.snapshot_id}",
                        ev.rollout_id,
                        ev.attempt,
                    )
                )
        for seq, ev in self._boundaries:
            problems += self._boundary(seq, ev)
        for call_id, (instance, seq, rollout_id, attempt) in self._open.items():
            if reported is None or instance not in reported:
                continue
            if _attempt_closed(self.ledger, rollout_id, attempt):
                continue  # its attempt was superseded or retired: the fence refuses its outcome for good
            calls, started = reported[instance]
            if seq > started and call_id not in calls:
                message = f"seq {seq}: {instance} admitted call {call_id} but its prepare reply omits it"
                problems.append(Finding(seq, message, rollout_id, attempt))
        return problems[: self.limit]


async def validate_references(
    log: EventLog,
    ledger: Ledger,
    tokens: TokenStore | None,
    snapshot: TokenSnapshot | None,
    *,
    start: int,
    cut: int,
    limit: int = 20,
    reported: dict[str, tuple[set[str], int]] | None = None,
) -> tuple[list[Finding], int]:
    """Problems found among events ``start..cut`` (at most ``limit``), and events checked; the
    ledger must already be projected up to ``cut`` (see :class:`ReferenceCheck`)."""
    check = ReferenceCheck(ledger, tokens, snapshot, limit=limit)
    async for page in log.read_pages(start=start, up_to=cut, strict=False):
        check.page(page)
    return check.finish(snapshot, reported), check.checked


def _attempt_closed(ledger: Ledger, rollout_id: str, attempt: int) -> bool:
    rec = ledger.rollout(rollout_id)
    if rec is None:
        return False
    return attempt in rec.tombstoned_attempts or attempt < rec.current_attempt or rec.retired_seq is not None
