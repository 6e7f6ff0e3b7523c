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
from typing import Any

import msgspec
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError

from .._errors import (
    CheckpointConflictError,
    CheckpointError,
    CheckpointFailedError,
    RollcutError,
)
from .._telemetry import PhaseTimer, count_outcome
from ..bus import (
    CheckpointAborted,
    CheckpointCommitted,
    CheckpointPrepared,
    CheckpointSealed,
    EventLog,
)
from ..ledger import CheckpointRecord, Ledger, Projector, validate_references
from ..tokens import TokenSnapshot, TokenStore, call_store
from ._protocol import Capabilities, ControlReply, ControlRequest, Op
from ._runtime import service_name

__all__ = ["CheckpointResult", "Coordinator", "InstanceInfo", "new_checkpoint_id"]

_reply_decoder = msgspec.json.Decoder(ControlReply)
# components that call the others: parked first at prepare, released last
CALLERS = frozenset({"agent", "environment"})


def new_checkpoint_id() -> str:
    """A fresh, sortable checkpoint id."""
    return f"ck-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.urandom(3).hex()}"


class InstanceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One live participant instance, as discovered by ``$SRV.PING``."""

    service_id: str
    instance: str
    component: str
    group: str
    worker: int
    workers: int
    mode: str
    control: str


class CheckpointResult(msgspec.Struct, kw_only=True):
    """A published checkpoint: its record, participants and how long each phase took."""

    record: CheckpointRecord
    participants: list[str]
    unreproducible: dict[str, list[str]]
    validated_events: int
    phases_ms: dict[str, float]
    resumed: list[str]


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
        self.discovery_s = discovery_s
        self.discovery_idle_s = discovery_idle_s
        self.grace_s = grace_s
        self.per_try_s = per_try_s
        self.projector = Projector(ledger, log)
        # test seam: awaited after each phase (a fault test kills the process here)
        self.after_phase: Callable[[str], Awaitable[None]] | None = None

    # --- discovery ----------------------------------------------------------------

    async def discover(self, *, timeout: float | None = None) -> list[InstanceInfo]:
        """Every live participant instance: replies to one ping, until replies stop coming."""
        nc = self.log.nc
        inbox = nc.new_inbox()
        got: list[InstanceInfo] = []
        first = asyncio.Event()
        last_at = [0.0]

        async def on_reply(msg: Any) -> None:
            try:
                ping = msgspec.json.decode(msg.data)
                md = ping.get("metadata") or {}
                got.append(
                    InstanceInfo(
                        service_id=ping["id"],
                        instance=md["instance"],
                        component=md["component"],
                        group=md.get("group", md["instance"]),
                        worker=int(md.get("worker", 0)),
                        workers=int(md.get("workers", 1)),
                        mode=md.get("mode", ""),
                        control=md["control"],
                    )
                )
            except (KeyError, ValueError, TypeError, msgspec.DecodeError):
                return  # not one of ours
            last_at[0] = time.monotonic()
            first.set()

        sub = await nc.subscribe(inbox, cb=on_reply)
        try:
            await nc.publish(f"$SRV.PING.{service_name(self.log.subjects.namespace)}", b"", reply=inbox)
            await asyncio.shield(nc.flush())  # nats-py: a cancelled flush kills its read loop
            limit = time.monotonic() + (timeout if timeout is not None else self.discovery_s)
            while time.monotonic() < limit:
                await asyncio.sleep(self.discovery_idle_s / 2)
                # quiet is not enough while a group is short of a worker: under load a live worker
                # answers late, and naming it missing would fail the checkpoint for nothing
                quiet = first.is_set() and time.monotonic() - last_at[0] >= self.discovery_idle_s
                if quiet and _groups_complete(got):
                    break
        finally:
            await sub.unsubscribe()
        by_name: dict[str, InstanceInfo] = {}
        for info in got:
            other = by_name.get(info.instance)
            if other is not None and other.service_id != info.service_id:
                raise CheckpointError(f"two live processes both claim instance name {info.instance!r}")
            by_name[info.instance] = info
        return sorted(by_name.values(), key=lambda i: i.instance)

    @staticmethod
    def check_membership(found: list[InstanceInfo], expect: set[str]) -> None:
        """Every worker of every coordinated group, and every expected instance, must be live."""
        names = {i.instance for i in found}
        missing = sorted(expect - names)
        for group, (want, have) in sorted(_groups(found).items()):
            missing += [f"{group} worker {w} of {want}" for w in range(want) if w not in have]
        if missing:
            raise CheckpointFailedError(f"missing participant instances: {', '.join(missing)}")

    # --- control calls ------------------------------------------------------------

    async def call(
        self, info: InstanceInfo, op: Op, checkpoint_id: str, deadline: float, *, cut: int | None = None
    ) -> ControlReply:
        """One control op, retried on silence until the deadline (ops are idempotent)."""
        req = msgspec.json.encode(
            ControlRequest(op=op, checkpoint_id=checkpoint_id, deadline=deadline, cut=cut)
        )
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise CheckpointFailedError(
                    f"{info.instance} did not answer {op} before the deadline",
                    checkpoint_id=checkpoint_id,
                    participant=info.instance,
                )
            try:
                msg = await self.log.nc.request(info.control, req, timeout=min(left, self.per_try_s))
            except (NatsTimeoutError, NatsError):
                continue  # a lost request or reply: ask again, the op is idempotent
            try:
                return _reply_decoder.decode(msg.data)
            except msgspec.DecodeError as exc:
                raise CheckpointFailedError(
                    f"{info.instance} answered {op} with an unreadable reply: {exc}",
                    checkpoint_id=checkpoint_id,
                    participant=info.instance,
                ) from exc

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

    def _commit_marker(self, rec: CheckpointRecord) -> CheckpointCommitted:
        return CheckpointCommitted(
            component="coordinator",
            instance=self.instance,
            checkpoint_id=rec.checkpoint_id,
            cut=rec.cut,
            token_snapshot_id=rec.token_snapshot_id,
            token_snapshot_digest=rec.token_snapshot_digest,
            participants=rec.participants,
            ts=rec.ts,
        )

    # --- the checkpoint -------------------------------------------------------------

    async def checkpoint(
        self, checkpoint_id: str | None = None, *, deadline_s: float = 30.0, expect: set[str] | None = None
    ) -> CheckpointResult:
        """Take and publish one checkpoint, or raise CheckpointFailedError having published nothing."""
        cid = checkpoint_id or new_checkpoint_id()
        deadline = time.time() + deadline_s
        timer = PhaseTimer(cid)
        with timer.phase("acquire"):
            lane_seq = await self._acquire(cid, deadline)
        found: list[InstanceInfo] = []
        try:
            with timer.phase("discover"):
                found = await self.discover()
                self.check_membership(found, expect or set())
            with timer.phase("prepare", participants=len(found)):
                # agents park at a safe boundary first (they may still need the model and tools
                # to finish a turn); then the servers they call close admission
                first = [i for i in found if i.component in CALLERS]
                rest = [i for i in found if i.component not in CALLERS]
                replies = list(
                    await asyncio.gather(*(self._timed(timer, i, "prepare", cid, deadline) for i in first))
                )
                if all(r.ok for r in replies):
                    replies += await asyncio.gather(
                        *(self._timed(timer, i, "prepare", cid, deadline) for i in rest)
                    )
            refused = [r for r in replies if not r.ok]
            if refused:
                raise CheckpointFailedError(
                    "; ".join(f"{r.instance} refused prepare ({r.error_kind}): {r.error}" for r in refused),
                    checkpoint_id=cid,
                    participant=refused[0].instance,
                ) from refused[0].refusal()
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
            with timer.phase("validate"):
                await self.projector.catch_up(up_to=cut)
                snapshot = await call_store(self.tokens, self.tokens.snapshot, cid) if self.tokens else None
                await self._check_store_kept(snapshot, cid)
                start = int(self.ledger.meta("validated_seq", 0)) + 1
                reported = {
                    r.instance: ({c.call_id for c in r.calls}, r.started_seq)
                    for r in replies
                    if r.calls is not None
                }
                problems, checked = await validate_references(
                    self.log, self.ledger, self.tokens, snapshot, start=start, cut=cut, reported=reported
                )
                for r in replies:
                    for c in r.calls or []:
                        if c.receipt is not None and (self.tokens is None or not self.tokens.has(c.receipt)):
                            problems.append(
                                f"{r.instance}: call {c.call_id} ({c.disposition}) names receipt "
                                f"{c.receipt.receipt_id}, which does not match the token store"
                            )
                if problems:
                    raise CheckpointFailedError(
                        "references do not resolve below the cut: " + "; ".join(problems), checkpoint_id=cid
                    )
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
                )
                with self.ledger.write() as wb:  # this transaction is the publication
                    wb.put_checkpoint(record)
                    wb.set_meta("validated_seq", cut)
        except BaseException as exc:
            await self._abort(cid, lane_seq, found, exc)
            count_outcome("aborted")
            if isinstance(exc, CheckpointFailedError):
                raise
            if isinstance(exc, RollcutError | OSError):
                raise CheckpointFailedError(f"checkpoint {cid} aborted: {exc}", checkpoint_id=cid) from exc
            raise
        count_outcome("published")
        with timer.phase("release"):
            with contextlib.suppress(RollcutError):
                await self.log.append_expecting(self._commit_marker(record), lane_seq)
            release_by = time.time() + max(2.0, min(10.0, deadline - time.time()))
            committed = await asyncio.gather(
                *(self._best_effort(i, "commit", cid, release_by) for i in found)
            )
            # the reverse of prepare: the servers reopen before the agents that call them go on
            # (released first, an agent would meet a still-closed model with its next call)
            ok: dict[str, bool] = {}
            for wave in (
                [i for i in found if i.component not in CALLERS],
                [i for i in found if i.component in CALLERS],
            ):
                done = await asyncio.gather(*(self._best_effort(i, "resume", cid, release_by) for i in wave))
                ok.update({i.instance: r for i, r in zip(wave, done, strict=True)})
        return CheckpointResult(
            record=record,
            participants=record.participants,
            unreproducible={r.instance: r.unreproducible for r in replies if r.unreproducible},
            validated_events=checked,
            phases_ms=timer.ms,
            resumed=[i.instance for i, c in zip(found, committed, strict=True) if c and ok.get(i.instance)],
        )

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
        reply = await self.call(info, op, cid, deadline)
        timer.participant(op, info.instance, time.perf_counter() - t0)
        return reply

    async def _best_effort(self, info: InstanceInfo, op: Op, cid: str, deadline: float) -> bool:
        try:
            return (await self.call(info, op, cid, deadline)).ok
        except CheckpointError:
            return False  # its lease will reopen it

    async def _abort(self, cid: str, lane_seq: int, found: list[InstanceInfo], cause: BaseException) -> None:
        """Release the lane and reopen admission everywhere; never raises."""
        reason = f"{type(cause).__name__}: {cause}"[:500]
        with contextlib.suppress(Exception):
            await self.log.append_expecting(
                CheckpointAborted(
                    component="coordinator", instance=self.instance, checkpoint_id=cid, reason=reason
                ),
                lane_seq,
            )
        by = time.time() + 3.0
        with contextlib.suppress(Exception):
            await asyncio.gather(*(self._best_effort(i, "abort", cid, by) for i in found))


def _groups(found: list[InstanceInfo]) -> dict[str, tuple[int, set[int]]]:
    """Each coordinated group: how many workers it declares, and which were heard from."""
    groups: dict[str, tuple[int, set[int]]] = {}
    for i in found:
        groups.setdefault(i.group, (i.workers, set()))[1].add(i.worker)
    return groups


def _groups_complete(found: list[InstanceInfo]) -> bool:
    """Whether every coordinated group heard from has every one of its workers."""
    return all(have >= set(range(want)) for want, have in _groups(found).values())
