"""The coordinator: prepare, seal, validate, publish; or abort, fail closed.

One checkpoint at a time per namespace. Every coordinator marker goes to one
lane of the stream (``rc.<ns>.mark.checkpoint``) and each is appended with a
compare-and-set on that lane's last sequence, so of two concurrent
checkpoints exactly one can even start. A coordinator that dies mid-way
leaves its prepare or seal as the lane's last marker; the next coordinator
aborts it once its deadline and grace have passed (or completes it, if this
coordinator's ledger shows it was already published).

Publication is the LMDB transaction that writes the checkpoint record: a
checkpoint exists exactly when the ledger says so. The ``checkpoint.commit``
marker appended afterwards lets a ledger rebuilt from the stream find it
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable

from .._errors import CheckpointConflictError, CheckpointError, CheckpointFailedError, RollcutError
from .._telemetry import PhaseTimer, count_outcome
from .._tracing import span
from ..bus import (
    CheckpointAborted,
    CheckpointCommitted,
    CheckpointPrepared,
    CheckpointSealed,
    EventLog,
)
from ..ledger import CheckpointRecord, Finding, Ledger, TailValidator
from ..tokens import TokenSnapshot, TokenStore, call_store
from ._ask import ask
from ._membership import InstanceInfo, Membership, check_membership
from ._protocol import WAITING, Capabilities, ControlErrorKind, ControlReply, ControlRequest, Op
from ._quarantine import quarantines
from ._result import CheckpointResult

__all__ = ["CheckpointResult", "Coordinator", "InstanceInfo", "new_checkpoint_id"]

# components that call the others: a restore releases them after the servers (not a pause anyone
# measures; a checkpoint releases everyone in one wave)
CALLERS = frozenset({"agent", "environment"})


def new_checkpoint_id() -> str:
    """A fresh, sortable checkpoint id."""
    return f"ck-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.urandom(3).hex()}"


class Coordinator:
    """Takes checkpoints of everything running on one namespace."""

    def __init__(
        self,
        log: EventLog,
        ledger: Ledger,
        tokens: TokenStore | None,
        *,
        instance: str = "coordinator",
        discovery_s: float = 0.5,
        discovery_idle_s: float = 0.05,
        grace_s: float = 5.0,
        per_try_s: float = 2.0,
    ) -> None:
        self.log = log
        self.ledger = ledger
        self.tokens = tokens
        self.instance = instance
        self.membership = Membership(log, timeout_s=discovery_s, idle_s=discovery_idle_s)
        self.grace_s = grace_s
        self.per_try_s = per_try_s
        # projects the ledger and checks references; started in the background (``validator.start()``)
        # it keeps up with the stream, and a checkpoint is left with the tail
        self.validator = TailValidator(log, ledger, tokens)
        self._suspects: set[str] = set()  # rollouts the last failed validation found
        # test seam: awaited after each phase (a fault test kills the process here)
        self.after_phase: Callable[[str], Awaitable[None]] | None = None

    # --- discovery ----------------------------------------------------------------

    async def discover(self) -> list[InstanceInfo]:
        """Every live participant instance now (a round of :class:`Membership` ends when every known
        member answered; a checkpoint also waits for the instances it was told to expect)."""
        return await self.membership.discover()

    # --- control calls ------------------------------------------------------------

    async def call(
        self, info: InstanceInfo, op: Op, checkpoint_id: str, deadline: float, *, cut: int | None = None
    ) -> ControlReply:
        """One control op, asked again until the deadline (:func:`._ask.ask` says when)."""
        req = ControlRequest(op=op, checkpoint_id=checkpoint_id, deadline=deadline, cut=cut)
        return await ask(self.log.nc, info, req, per_try_s=self.per_try_s)

    async def call_past_the_dead(
        self, info: InstanceInfo, op: Op, checkpoint_id: str, deadline: float, *, cut: int | None = None
    ) -> ControlReply:
        """:meth:`call`, past a dead checkpoint: a participant busy with one whose marker is not the
        lane's last entry (its seal, appended expecting that marker, can never land) is told to abort
        it and asked again. Its lease would end it too, but on the participant's clock and timer,
        which need not agree with the coordinator's: a collection requeued after a partition cleared
        the lane, then met a server still holding the checkpoint the partition cut off. Only a
        participant whose hook has finished (it waits to be told) is told: one still preparing or
        restoring for the dead checkpoint would run two hooks at once. (A participant answers its
        control requests one at a time, so today it cannot say so while its hook runs; the check
        keeps that true if it ever answers them side by side.)"""
        reply = await self.call(info, op, checkpoint_id, deadline, cut=cut)
        held = reply.active_checkpoint
        if (
            reply.error_kind != ControlErrorKind.BUSY
            or held in (None, checkpoint_id)
            or reply.state not in WAITING
        ):
            return reply
        last = await self.log.last_on(self.log.subjects.mark())
        ev = None if last is None else last.event
        if isinstance(ev, CheckpointPrepared | CheckpointSealed) and ev.checkpoint_id == held:
            return reply  # its coordinator may still seal it
        await self._best_effort(info, "abort", held, deadline)
        return await self.call(info, op, checkpoint_id, deadline, cut=cut)

    async def capabilities(self) -> list[Capabilities]:
        deadline = time.time() + 10
        out = []
        for info in await self.discover():
            reply = await self.call(info, "capabilities", "capabilities", deadline)
            if reply.capabilities is not None:
                out.append(reply.capabilities)
        return out

    # --- the coordinator lane -------------------------------------------------------

    async def _acquire(self, checkpoint_id: str, deadline: float) -> int:
        """Append our prepare marker as the lane's next entry, clearing a dead checkpoint first."""
        lane = self.log.subjects.mark()
        for _ in range(8):
            last = await self.log.last_on(lane)
            expect = 0 if last is None else last.seq
            ev = None if last is None else last.event
            if isinstance(ev, CheckpointAborted):  # what the last failed validation found, whoever ran it
                self._suspects |= set(ev.suspects)
            elif isinstance(ev, CheckpointCommitted):  # a validation passed since
                self._suspects = set()
            if isinstance(ev, CheckpointPrepared | CheckpointSealed) and ev.checkpoint_id != checkpoint_id:
                await self._clear_unfinished(ev, last.seq)  # type: ignore[union-attr]
                continue
            marker = CheckpointPrepared(
                component="coordinator",
                instance=self.instance,
                checkpoint_id=checkpoint_id,
                deadline=deadline,
            )
            seq = await self.log.append_expecting(marker, expect)
            if seq is not None:
                return seq
        raise CheckpointConflictError(
            "the coordinator lane keeps moving: another coordinator is active", checkpoint_id=checkpoint_id
        )

    async def _clear_unfinished(self, ev: CheckpointPrepared | CheckpointSealed, seq: int) -> None:
        published = self.ledger.checkpoint(ev.checkpoint_id)
        if published is not None and isinstance(ev, CheckpointSealed):
            # we published it and died before the marker: finish the marker now
            await self.log.append_expecting(self._commit_marker(published), seq)
            return
        if time.time() <= ev.deadline + self.grace_s:
            left = ev.deadline - time.time()
            raise CheckpointConflictError(
                f"checkpoint {ev.checkpoint_id} is in progress (deadline in {left:.1f}s)",
                checkpoint_id=ev.checkpoint_id,
            )
        await self.log.append_expecting(
            CheckpointAborted(
                component="coordinator",
                instance=self.instance,
                checkpoint_id=ev.checkpoint_id,
                reason="its coordinator went silent past the deadline",
            ),
            seq,
        )

    def _commit_marker(
        self, rec: CheckpointRecord, pause_ms: float = 0.0, waited_ms: dict[str, float] | None = None
    ) -> CheckpointCommitted:
        return CheckpointCommitted(
            component="coordinator",
            instance=self.instance,
            checkpoint_id=rec.checkpoint_id,
            cut=rec.cut,
            token_snapshot_id=rec.token_snapshot_id,
            token_snapshot_digest=rec.token_snapshot_digest,
            participants=rec.participants,
            quarantined=rec.quarantined,
            ts=rec.ts,
            pause_ms=round(pause_ms, 2),
            waited_ms=waited_ms or {},
        )

    # --- the checkpoint -------------------------------------------------------------

    async def checkpoint(
        self, checkpoint_id: str | None = None, *, deadline_s: float = 30.0, expect: set[str] | None = None
    ) -> CheckpointResult:
        """Take and publish one checkpoint, or raise CheckpointFailedError having published nothing."""
        cid = checkpoint_id or new_checkpoint_id()
        deadline = time.time() + deadline_s
        timer = PhaseTimer(cid)
        with span("rollcut.checkpoint", attributes={"rollcut.checkpoint_id": cid}):  # the phases' parent
            with timer.phase("acquire"):
                lane_seq = await self._acquire(cid, deadline)
            async with self.validator.lock:  # from before the seal: the validator stays at or below the cut
                return await self._checkpoint(cid, deadline, timer, lane_seq, expect)

    async def _checkpoint(
        self, cid: str, deadline: float, timer: PhaseTimer, lane_seq: int, expect: set[str] | None
    ) -> CheckpointResult:
        found: list[InstanceInfo] = []
        resumed: list[str] | None = None  # set once the participants are released
        try:
            with timer.phase("discover"):
                # an instance the caller named is waited for up to half the deadline (the rest: prepare)
                found = await self.membership.discover(
                    expect=frozenset(expect or ()), expect_s=(deadline - time.time()) / 2
                )
                check_membership(found, expect or set())
            paused_at = time.perf_counter()
            replies = await self._prepare(timer, found, cid, deadline)
            with timer.phase("seal"):
                seal = CheckpointSealed(
                    component="coordinator",
                    instance=self.instance,
                    checkpoint_id=cid,
                    participants=[r.instance for r in replies],
                    last_seqs={r.instance: r.last_seq for r in replies},
                    deadline=deadline,
                )
                cut = await self.log.append_expecting(seal, lane_seq)
                if cut is None:
                    raise CheckpointConflictError("the coordinator lane moved under us", checkpoint_id=cid)
                lane_seq = cut
            if self.after_phase is not None:
                await self.after_phase("seal")
            # the cut is fixed: nothing after the seal needs anyone to wait. Everyone goes on now;
            # validation and publication follow, and a checkpoint that fails them is not published
            with timer.phase("release"):
                resumed = await self._release(found, cid, deadline)
            pause_ms = (time.perf_counter() - paused_at) * 1000
            if self.after_phase is not None:
                await self.after_phase("release")
            sealed_at = time.perf_counter()
            with timer.phase("validate"):
                checked, snapshot, quarantined = await self._validate(replies, cid, cut)
            if time.time() > deadline:
                raise CheckpointFailedError("the deadline passed before publication", checkpoint_id=cid)
            with timer.phase("publish"):
                record = CheckpointRecord(
                    checkpoint_id=cid,
                    cut=cut,
                    token_snapshot_id=snapshot.snapshot_id if snapshot else "",
                    token_snapshot_digest=snapshot.digest if snapshot else "",
                    participants=[r.instance for r in replies],
                    ts=time.time(),
                    quarantined=quarantined,
                )
                with self.ledger.write() as wb:  # this transaction is the publication
                    wb.put_checkpoint(record)
                    wb.set_meta("validated_seq", cut)
                self.validator.published()
            publish_ms = (time.perf_counter() - sealed_at) * 1000
        except BaseException as exc:
            # participants already released are not told: their checkpoint ended at the release
            await self._abort(cid, lane_seq, found if resumed is None else [], exc)
            count_outcome("aborted")
            if isinstance(exc, CheckpointFailedError):
                raise
            if isinstance(exc, RollcutError | OSError):
                raise CheckpointFailedError(f"checkpoint {cid} aborted: {exc}", checkpoint_id=cid) from exc
            raise
        count_outcome("published")
        waited = {r.instance: timer.ms.get(f"prepare:{r.instance}", 0.0) for r in replies}
        with contextlib.suppress(RollcutError):
            await self.log.append_expecting(self._commit_marker(record, pause_ms, waited), lane_seq)
        return CheckpointResult(
            record=record,
            participants=record.participants,
            unreproducible={r.instance: r.unreproducible for r in replies if r.unreproducible},
            validated_events=checked,
            phases_ms=timer.ms,
            resumed=resumed,
            pause_ms=round(pause_ms, 2),
            publish_ms=round(publish_ms, 2),
            waited_ms={r.instance: {"round_trip": waited[r.instance], **r.phases_ms} for r in replies},
            components={i.instance: i.component for i in found},
        )

    async def _prepare(
        self, timer: PhaseTimer, found: list[InstanceInfo], cid: str, deadline: float
    ) -> list[ControlReply]:
        """Every participant prepares, or the checkpoint fails naming who refused."""
        with timer.phase("prepare", participants=len(found)):
            # everyone at once: an agent's loop awaiting the model or a tool counts as parked (that
            # server's prepare settles the call), so no agent needs a server open to reach its
            # boundary, and the agents' wave no longer has to finish before the servers' starts
            replies = list(
                await asyncio.gather(*(self._timed(timer, i, "prepare", cid, deadline) for i in found))
            )
        refused = [r for r in replies if not r.ok]
        if refused:
            raise CheckpointFailedError(
                "; ".join(f"{r.instance} refused prepare ({r.error_kind}): {r.error}" for r in refused),
                checkpoint_id=cid,
                participant=refused[0].instance,
            ) from refused[0].refusal()
        return replies

    async def _release(self, found: list[InstanceInfo], cid: str, deadline: float) -> list[str]:
        """Reopen everyone at once, in one wave: the cut is fixed, so no order is needed for what is
        kept, and a wave of servers before the agents that call them cost the pause a whole control
        round trip. An agent that meets a server whose resume is still in flight is refused and in
        again within milliseconds (``admission_backoff``). Best effort: a participant that does not
        answer reopens when its lease runs out. Who answered."""
        release_by = time.time() + max(2.0, min(10.0, deadline - time.time()))
        done = await asyncio.gather(*(self._best_effort(i, "resume", cid, release_by) for i in found))
        return [i.instance for i, ok in zip(found, done, strict=True) if ok]

    async def _validate(
        self, replies: list[ControlReply], cid: str, cut: int
    ) -> tuple[int, TokenSnapshot | None, dict[str, str]]:
        """Every reference below the cut resolves, and every model participant accounted for the
        calls it admitted. A finding that belongs to one rollout (a receipt missing, a call a reply
        omits, a boundary naming what was never recorded) fails this checkpoint and, found again by
        the next, quarantines that rollout there; one that belongs to none fails every checkpoint.
        How many events were checked, the token
        store's snapshot the checkpoint binds (taken after the release: a superset of every record
        referenced below the cut, as records are stored before the events naming them), and the
        rollouts quarantined (with the latest checkpoint's that are still running)."""
        snapshot = await call_store(self.tokens, self.tokens.snapshot, cid) if self.tokens else None
        await self._check_store_kept(snapshot, cid)
        reported = {
            r.instance: ({c.call_id for c in r.calls}, r.started_seq) for r in replies if r.calls is not None
        }
        # whatever the validator has not reached yet (all of it, if it does not run in the background)
        findings, checked = await self.validator.at_cut(cut, snapshot, reported)
        for r in replies:
            for c in r.calls or []:
                if c.receipt is not None and (self.tokens is None or not self.tokens.has(c.receipt)):
                    message = (
                        f"{r.instance}: call {c.call_id} ({c.disposition}) names receipt "
                        f"{c.receipt.receipt_id}, which does not match the token store"
                    )
                    findings.append(Finding(cut, message, c.rollout_id, c.attempt))
        unowned = [str(f) for f in findings if f.rollout_id is None]
        if unowned:
            raise CheckpointFailedError(
                "references do not resolve below the cut: " + "; ".join(unowned), checkpoint_id=cid
            )
        found = {f.rollout_id for f in findings if f.rollout_id is not None}
        if found - self._suspects:
            # a finding is quarantined only if the next checkpoint still finds it: a race that resolves
            # itself (a record landing after its reference) fails one checkpoint, as it always did, and
            # costs no rollout; a record that can never resolve (forged, lost) fails one, not all
            self._suspects = found
            raise CheckpointFailedError(
                "references do not resolve below the cut (quarantined if the next checkpoint still finds "
                "them): " + "; ".join(str(f) for f in findings[:10]),
                checkpoint_id=cid,
            )
        self._suspects = set()
        told = {rid: f"{r.instance}: {why}" for r in replies for rid, why in r.quarantined.items()}
        return checked, snapshot, quarantines(self.ledger, findings, told)

    async def _check_store_kept(self, snapshot: TokenSnapshot | None, cid: str) -> None:
        """Validation is incremental, so it trusts that what the published checkpoints rely on is still
        in the token store. Prove it cheaply: the store must still hold the latest published checkpoint's
        snapshot as it was bound, and the new one must not hold fewer records. A wiped, rolled-back or
        swapped store fails the checkpoint, named."""
        prev = self.ledger.latest_checkpoint()
        if prev is None or not prev.token_snapshot_id:
            return
        where = getattr(self.tokens, "path", None) or getattr(self.tokens, "name", "the token store")
        kept = (
            await call_store(self.tokens, self.tokens.find_snapshot, prev.token_snapshot_id)
            if self.tokens
            else None
        )
        if kept is None or kept.digest != prev.token_snapshot_digest:
            raise CheckpointFailedError(
                f"token store {where} no longer holds snapshot {prev.token_snapshot_id} of checkpoint "
                f"{prev.checkpoint_id} as published: it was wiped, rolled back or replaced",
                checkpoint_id=cid,
            )
        if snapshot is None or snapshot.count < kept.count:
            raise CheckpointFailedError(
                f"token store {where} holds {snapshot.count if snapshot else 0} records, fewer than the "
                f"{kept.count} checkpoint {prev.checkpoint_id} relies on",
                checkpoint_id=cid,
            )

    async def _timed(
        self, timer: PhaseTimer, info: InstanceInfo, op: Op, cid: str, deadline: float
    ) -> ControlReply:
        t0 = time.perf_counter()
        reply = await self.call_past_the_dead(info, op, cid, deadline)
        timer.participant(op, info.instance, time.perf_counter() - t0)
        return reply

    async def _best_effort(self, info: InstanceInfo, op: Op, cid: str, deadline: float) -> bool:
        try:
            req = ControlRequest(op=op, checkpoint_id=cid, deadline=deadline)
            return (await ask(self.log.nc, info, req, per_try_s=self.per_try_s, gone_is_final=True)).ok
        except CheckpointError:
            return False  # its lease will reopen it

    async def _abort(self, cid: str, lane_seq: int, found: list[InstanceInfo], cause: BaseException) -> None:
        """Release the lane and reopen admission everywhere; never raises."""
        reason = f"{type(cause).__name__}: {cause}"[:500]
        suspects = sorted(self._suspects)[:10_000]
        with contextlib.suppress(Exception):
            await self.log.append_expecting(
                CheckpointAborted(
                    component="coordinator",
                    instance=self.instance,
                    checkpoint_id=cid,
                    reason=reason,
                    suspects=suspects,
                ),
                lane_seq,
            )
        by = time.time() + 3.0
        with contextlib.suppress(Exception):
            await asyncio.gather(*(self._best_effort(i, "abort", cid, by) for i in found))
