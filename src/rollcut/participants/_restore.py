"""Restore and resume: the one owner of recovery, used by the collector, the CLI and tests.

Recovery is four steps, always in this order:

1. **Plan** (:meth:`Restorer.plan`): from a published checkpoint, one
   disposition per rollout: completed, continue, fresh dispatch or retired.
2. **Open** (:meth:`Restorer.open_attempts`): each planned rollout's next
   attempt is opened on its fence, continued from the cut or from its input.
   This tombstones the old attempt, so the server refuses its late writes.
3. **Restore** (:meth:`Restorer.restore`): every live participant rebuilds
   its sessions at the cut and stays paused.
4. **Resume** (:meth:`Restorer.resume`): servers first, then agents, so a
   released agent never meets a server still closed.

It lives beside the :class:`~rollcut.participants.Coordinator` because it
speaks the same control plane (discovery and idempotent control calls) and
reads the same ledger; ``replay`` sits below the ledger and cannot own it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum

from .._errors import CheckpointConflictError, CheckpointError, ConfigError
from .._tracing import span
from ..bus import EventLog
from ..ledger import Ledger, Projector
from ..replay import replay
from ._coordinator import CALLERS, CheckpointResult, Coordinator

__all__ = ["RecoveryMode", "RecoveryPlan", "RecoveryResult", "Restorer", "plan_recovery"]


class RecoveryMode(StrEnum):
    """Where a recovery continues from."""

    TAIL = "tail"
    """Seal the stream's end as a checkpoint and continue from it (rollcut's default)."""
    CHECKPOINT = "checkpoint"
    """Continue from the last checkpoint published before the crash only."""
    RESTART = "restart"
    """Every unfinished rollout from its input (what frameworks do without rollcut)."""


@dataclass
class RecoveryPlan:
    """One disposition per rollout, as of one checkpoint's cut."""

    checkpoint_id: str | None
    cut: int
    completed: list[str] = field(default_factory=list)
    continue_: list[str] = field(default_factory=list)
    fresh_dispatch: list[str] = field(default_factory=list)
    retired: list[str] = field(default_factory=list)
    # fresh dispatches that never started: attempt 1 is open and has no event, so it *is* a
    # dispatch from the input; opening another attempt would only spend the attempt budget
    unstarted: list[str] = field(default_factory=list)
    opened: dict[str, int] = field(default_factory=dict)  # rollout -> the attempt recovery opened for it
    # rollouts a bad record cost their continuation (the checkpoint's quarantines: they start over from
    # their input), or that have records but were never dispatched (skipped: nothing to open)
    quarantined: dict[str, str] = field(default_factory=dict)
    # fresh dispatches for lack of a checkpoint that covers the rollout's progress, nothing bad on
    # record: their next attempt still serves the model calls earlier attempts completed, for the same
    # exact request (``AttemptOpened.reuse_completed``); not a quarantined or corrupt rollout's, nor
    # any in a recovery other than the tail's (the demo's baselines: last checkpoint, restart)
    reuse_completed: set[str] = field(default_factory=set)

    def counts(self) -> dict[str, int]:
        """How many rollouts got each disposition."""
        return {
            "completed": len(self.completed),
            "continue": len(self.continue_),
            "fresh_dispatch": len(self.fresh_dispatch),
            "retired": len(self.retired),
        }


@dataclass
class RecoveryResult:
    """What :meth:`Restorer.recover` did: the plan it applied and the tail seal, if any."""

    plan: RecoveryPlan
    sealed: CheckpointResult | None = None
    seal_error: str | None = None


async def plan_recovery(
    log: EventLog, ledger: Ledger, rollouts: list[str] | None = None, checkpoint_id: str | None = None
) -> RecoveryPlan:
    """One disposition per rollout (default: every rollout the ledger knows), from a checkpoint
    (default: the latest published one)."""
    await Projector(ledger, log).catch_up()
    if rollouts is None:
        rollouts = [r.rollout_id for r in ledger.rollouts()]
    ck = ledger.checkpoint(checkpoint_id) if checkpoint_id else ledger.latest_checkpoint()
    if checkpoint_id and ck is None:
        raise ConfigError(f"no published checkpoint {checkpoint_id}")
    plan = RecoveryPlan(ck.checkpoint_id if ck else None, ck.cut if ck else 0)
    # a finished rollout is never rebuilt: the streaming fold holds only the running ones
    at_cut = await replay(log, up_to=plan.cut, keep_finished=False) if ck else None
    bad = dict(ck.quarantined) if ck else {}
    for rid in rollouts:  # each looked up, not every rollout the namespace ever had held in sets
        rec = ledger.rollout(rid)
        accepted = rec is not None and rec.accepted_seq is not None
        retired = rec is not None and rec.retired_seq is not None
        if rec is not None and not rec.dispatch_seq and not accepted and not retired:
            # records on a rollout's subjects with no dispatch before them (written by a participant
            # role, or left by a purge): there is no attempt to open; they cost nothing else
            plan.quarantined[rid] = "never dispatched: its records are skipped"
            continue
        if accepted:
            plan.completed.append(rid)
            continue
        if retired:
            plan.retired.append(rid)
            continue
        st = at_cut.rollouts.get(rid) if at_cut else None
        # progress anywhere in the lineage counts: an attempt a second crash killed before it did
        # anything still continues what its predecessor had reached by the cut it continued from
        if rid in bad:
            plan.quarantined[rid] = bad[rid]
        elif st is not None and (foreign := st.foreign_at(plan.cut)) is not None:
            plan.quarantined[rid] = bad[rid] = foreign
        if st is None or not st.open or st.corrupt_seqs or rid in bad or not st.progressed(plan.cut):
            plan.fresh_dispatch.append(rid)
            if rid not in bad and not (st is not None and st.corrupt_seqs):
                plan.reuse_completed.add(rid)
            if rec and rec.open and rec.current_attempt == 1 and rec.last_seq == rec.attempt_opened_seq:
                plan.unstarted.append(rid)
        else:
            plan.continue_.append(rid)
    return plan


@dataclass
class Restorer:
    """Plans a recovery, opens the next attempts, restores and resumes every participant."""

    log: EventLog
    ledger: Ledger
    coordinator: Coordinator
    _: KW_ONLY
    instance: str = "coordinator"
    """Written as the writer of the fence events it appends."""
    deadline_s: float = 30.0
    """How long restore and resume wait for every participant."""
    checkpoint_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Shared with whoever else takes checkpoints through the same coordinator (the collector)."""

    async def plan(self, rollouts: list[str] | None = None, checkpoint_id: str | None = None) -> RecoveryPlan:
        """See :func:`plan_recovery`."""
        return await plan_recovery(self.log, self.ledger, rollouts, checkpoint_id)

    async def open_attempts(self, plan: RecoveryPlan) -> None:
        """Open each planned rollout's next attempt (continued from the cut, or from its input)."""
        for rid in plan.continue_:
            plan.opened[rid] = await self.next_attempt(
                rid,
                from_cut=plan.cut,
                checkpoint_id=plan.checkpoint_id or "",
                reason="continue from checkpoint",
            )
        unstarted = set(plan.unstarted)
        for rid in plan.fresh_dispatch:
            if rid not in unstarted:
                plan.opened[rid] = await self.next_attempt(
                    rid, from_cut=0, reason="fresh dispatch", reuse_completed=rid in plan.reuse_completed
                )

    async def next_attempt(
        self, rid: str, *, from_cut: int, reason: str, checkpoint_id: str = "", reuse_completed: bool = False
    ) -> int:
        """Tombstone the rollout's open attempt (if any) and open the next one; its number."""
        state = await self.log.fence_state(rid)
        if state is None:
            raise ConfigError(f"rollout {rid} was never dispatched")
        if not state.open:
            await self.log.open_attempt(
                rid,
                state.attempt + 1,
                instance=self.instance,
                reason=reason,
                checkpoint_id=checkpoint_id,
                from_cut=from_cut,
                reuse_completed=reuse_completed,
            )
            return state.attempt + 1
        return await self.log.supersede(
            rid,
            state.attempt,
            instance=self.instance,
            reason=reason,
            checkpoint_id=checkpoint_id,
            from_cut=from_cut,
            reuse_completed=reuse_completed,
        )

    async def restore(self, checkpoint_id: str, cut: int) -> list[str]:
        """Every live participant rebuilds its sessions at the cut and stays paused."""
        deadline = time.time() + self.deadline_s
        found = await self.coordinator.discover()
        ask = self.coordinator.call_past_the_dead  # a server may still hold a checkpoint a crash cut off
        replies = await asyncio.gather(*(ask(i, "restore", checkpoint_id, deadline, cut=cut) for i in found))
        bad = [r for r in replies if not r.ok]
        if bad:
            # all or nothing: the participants that did restore are paused, and left so they would
            # hold admission closed until their leases ran out; release them at once
            await self.resume(checkpoint_id)
            raise bad[0].refusal()
        return [r.instance for r in replies]

    async def resume(self, checkpoint_id: str) -> list[str]:
        """Release everyone the restore paused: servers first, then the agents that call them."""
        deadline = time.time() + self.deadline_s
        found = await self.coordinator.discover()
        released: list[str] = []
        for wave in (False, True):
            replies = await asyncio.gather(
                *(
                    self.coordinator.call(i, "resume", checkpoint_id, deadline)
                    for i in found
                    if (i.component in CALLERS) is wave
                )
            )
            released += [r.instance for r in replies if r.ok]
        return released

    async def seal_tail(self) -> CheckpointResult:
        """Publish a checkpoint at the stream's end. After a crash every durable event is part of
        a consistent prefix, so the end is the best cut: everything completed before the crash is
        then served from the log, not redone."""
        give_up = time.time() + self.deadline_s + self.coordinator.grace_s + 5
        while True:
            try:
                async with self.checkpoint_lock:
                    return await self.coordinator.checkpoint(deadline_s=self.deadline_s)
            except CheckpointConflictError:
                # a checkpoint the crash interrupted still holds the lane until its deadline passes
                if time.time() > give_up:
                    raise
                await asyncio.sleep(0.2)

    async def recover(
        self,
        rollouts: list[str] | None,
        mode: RecoveryMode = RecoveryMode.TAIL,
        checkpoint_id: str | None = None,
    ) -> RecoveryResult:
        """The whole recovery: (tail seal,) plan, open the next attempts, restore, resume.
        ``checkpoint_id``: with :attr:`RecoveryMode.CHECKPOINT`, the checkpoint to plan from (default:
        the latest published)."""
        with span(
            "rollcut.restore",
            attributes={"rollcut.recovery_mode": str(mode), "rollcut.rollouts": len(rollouts or [])},
        ):
            return await self._recover(rollouts, mode, checkpoint_id)

    async def _recover(
        self, rollouts: list[str] | None, mode: RecoveryMode, checkpoint_id: str | None
    ) -> RecoveryResult:
        sealed, seal_error = None, None
        if mode is RecoveryMode.TAIL:
            try:
                sealed = await self.seal_tail()
            except CheckpointError as exc:
                seal_error = str(exc)[:300]  # plan from the latest checkpoint that did publish
        plan = await self.plan(rollouts, checkpoint_id if mode is RecoveryMode.CHECKPOINT else None)
        if mode is RecoveryMode.RESTART:
            plan.fresh_dispatch, plan.continue_ = plan.fresh_dispatch + plan.continue_, []
        if mode is not RecoveryMode.TAIL:  # a baseline measured as one (the demo's other ways) reuses
            plan.reuse_completed = set()  # nothing past what its checkpoint kept
        await self.open_attempts(plan)
        if plan.checkpoint_id and plan.continue_:
            # under the checkpoint lock: a periodic checkpoint that found the participants mid-restore
            # would be refused as busy, and would make them refuse the restore
            async with self.checkpoint_lock:
                await self.restore(plan.checkpoint_id, plan.cut)
                await self.resume(plan.checkpoint_id)
        return RecoveryResult(plan, sealed, seal_error)
