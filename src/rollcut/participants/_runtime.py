"""The participant runtime: one object turns a server process into a checkpoint participant.

It answers a coordinator's membership ping on its own subject
``rc.<ns>.hello.<component>.<instance>``, so a coordinator finds every live
worker instead of trusting a configured count (and, with per-instance
identities, knows who answered from where the answer was published), and it
answers control operations on its own subject, ``rc.<ns>.ctl.<component>.<instance>``
(a NATS micro service endpoint, so ``nats micro`` tools see it too).

Control operations are idempotent per ``(checkpoint_id, op)``: a repeated
request (a retry after a lost reply) gets the same answer and causes no
second effect. At most one checkpoint is active at a time; a request naming
another checkpoint is refused as stale or busy, so a stale or concurrent
checkpoint can neither commit nor reopen admission. If the coordinator goes
silent, the lease (the checkpoint's deadline plus a grace period) runs out,
the participant reopens admission by itself and records that on the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
from nats.errors import Error as NatsError
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from .._bounded import remember
from .._errors import ConfigError
from .._telemetry import ms as _ms
from .._tracing import SpanKind, extract, span
from .._version import __version__
from ..bus import COORDINATOR_LANE, Component, Event, EventLog, check_token
from ._admission import AdmissionGate
from ._hooks import LifecycleWatch, ParticipantHooks, ReleaseHook, RetireHook, _NoHooks
from ._lane import record_expiry, record_reply
from ._presence import Presence
from ._protocol import (
    WAITING,
    Capabilities,
    CheckpointMode,
    ControlErrorKind,
    ControlReply,
    ControlRequest,
    ParticipantState,
    PrepareReport,
    ProcessMode,
    names_itself,
)

__all__ = ["Participant", "service_name"]


_req_decoder = msgspec.json.Decoder(ControlRequest)
Refusal = ControlErrorKind


def service_name(namespace: str) -> str:
    """The micro service name every participant of a namespace registers under."""
    return f"rollcut-{namespace}"


@dataclass
class _Active:
    checkpoint_id: str
    deadline: float
    state: ParticipantState
    prepared: asyncio.Future[ControlReply] | None = None


class Participant:
    """Capabilities, admission gate and control-plane endpoint of one process."""

    def __init__(
        self,
        log: EventLog,
        *,
        component: Component,
        instance: str,
        mode: CheckpointMode,
        hooks: ParticipantHooks | None = None,
        role: str = "primary",
        group: str = "",
        worker: int = 0,
        workers: int = 1,
        process_mode: ProcessMode = "single",
        concurrency_contract: str = "serialized_per_session",
        lease_grace_s: float = 5.0,
        remember: int = 256,
        drain: bool = True,
    ) -> None:
        check_token(instance, "instance")
        if instance == COORDINATOR_LANE:
            raise ConfigError(f"instance name {instance!r} is reserved for the coordinator")
        if not 0 <= worker < workers:
            raise ConfigError(f"worker index {worker} is outside 0..{workers - 1}")
        if not names_itself(instance, group or instance, worker, workers):
            raise ConfigError(
                f"instance {instance!r} must be its group's worker name {group}-w{worker} "
                "(or the group itself, alone): membership reads group and worker from the name"
            )
        self.log = log
        self.component = component
        self.instance = instance
        self.mode: CheckpointMode = mode
        self.hooks: ParticipantHooks = hooks or _NoHooks()
        self.role, self.group, self.worker, self.workers = role, group or instance, worker, workers
        self.process_mode: ProcessMode = process_mode
        self.concurrency_contract = concurrency_contract
        self.lease_grace_s = lease_grace_s
        # exported participants wait for accepted work unless they cut it instead (model servers)
        self.drain = drain
        self.started_seq = 0
        self.gate = AdmissionGate(instance)
        self.lease_expiries = 0
        self._active: _Active | None = None
        self._finished: OrderedDict[str, ParticipantState] = OrderedDict()  # checkpoint id -> how it ended
        self._remember = remember
        self._service: Service | None = None
        self._presence = Presence(
            log, component, instance, group=self.group, worker=worker, workers=workers, mode=mode
        )
        self._lease_task: asyncio.Task[None] | None = None
        self._watch: LifecycleWatch | None = None
        # test seam: drop this many replies on the wire (the effect still happens)
        self.drop_replies = 0
        self.on_control: Callable[[ControlRequest], Awaitable[None]] | None = None

    # --- lifecycle ----------------------------------------------------------------

    @property
    def rollouts_retired(self) -> int:
        """Rollouts this participant dropped because they were retired or handed off."""
        return self._watch.dropped if self._watch is not None else 0

    @property
    def control_subject(self) -> str:
        return self.log.subjects.control(f"{self.component}.{self.instance}")

    async def start(self) -> Participant:
        identity = self.log.config.identity_name
        if identity is not None and identity != self.instance:
            raise ConfigError(
                f"this process's bus identity is {identity!r}, not instance {self.instance!r}: it could "
                "answer no ping and write no marker (log in with as_role(creds, role, instance))"
            )
        self.started_seq = await self.log.last_seq()
        self._service = await add_service(
            self.log.nc,
            name=service_name(self.log.subjects.namespace),
            version=__version__,
            description=f"rollcut {self.component} participant",
            metadata={
                "instance": self.instance,
                "component": self.component,
                "group": self.group,
                "worker": str(self.worker),
                "workers": str(self.workers),
                "mode": self.mode,
                "control": self.control_subject,
            },
        )
        await self._service.add_endpoint(name="control", subject=self.control_subject, handler=self._handle)
        await self._presence.start()
        if isinstance(self.hooks, RetireHook):
            self._watch = LifecycleWatch(self.log, self.hooks)
            await self._watch.start()
        # a round trip: once start() returns, the server has our subscriptions, so we are discoverable
        await asyncio.shield(self.log.nc.flush())  # nats-py: a cancelled flush kills its read loop
        # discoverable now: tell standing coordinators to wait for us from their next round on
        await self._presence.hello("")
        self._lease_task = asyncio.get_running_loop().create_task(self._lease_watch())
        return self

    async def stop(self) -> None:
        """Stop every part. On a connection the bus closed for good (a revoked identity), a part's
        goodbye on the bus fails and is let go: the process is exiting, and says why."""
        await self._bus_part(self._presence.stop())
        if self._watch is not None:
            await self._bus_part(self._watch.stop())
        if self._lease_task is not None:
            self._lease_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lease_task
        if self._service is not None:
            await self._bus_part(self._service.stop())
            self._service = None

    async def _bus_part(self, step: Awaitable[None]) -> None:
        try:
            await step
        except NatsError:
            if not self.log.nc.is_closed:
                raise

    async def __aenter__(self) -> Participant:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- state --------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        a = self._active
        return Capabilities(
            component=self.component,
            instance=self.instance,
            role=self.role,
            group=self.group,
            worker=self.worker,
            workers=self.workers,
            checkpoint_mode=self.mode,
            process_mode=self.process_mode,
            concurrency_contract=self.concurrency_contract,
            active_checkpoint=a.checkpoint_id if a else None,
            state=a.state if a else ParticipantState.IDLE,
            admission=self.gate.state,
            lease_expiries=self.lease_expiries,
        )

    async def append(self, event: Event) -> int:
        """Append through the participant's log (its last sequence is what prepare reports)."""
        return await self.log.append(event)

    def _finish(self, checkpoint_id: str, how: ParticipantState) -> None:
        remember(self._finished, checkpoint_id, how, self._remember)
        if self._active is not None and self._active.checkpoint_id == checkpoint_id:
            self._active = None
        self.gate.open()
        if isinstance(self.hooks, ReleaseHook):  # e.g. parked agent loops go on
            self.hooks.release(checkpoint_id)

    # --- control plane --------------------------------------------------------------

    async def _handle(self, req: Request) -> None:
        try:
            creq = _req_decoder.decode(req.data)
        except msgspec.DecodeError as exc:
            reply = ControlReply(
                ok=False,
                op="?",
                checkpoint_id="",
                instance=self.instance,
                error=f"bad control request: {exc}",
                error_kind=Refusal.BAD_REQUEST,
            )
        else:
            if self.on_control is not None:
                await self.on_control(creq)
            attrs = {"rollcut.checkpoint_id": creq.checkpoint_id, "rollcut.participant": self.instance}
            with span(f"rollcut.participant.{creq.op}", SpanKind.SERVER, attrs, extract(req.headers)):
                reply = await self.handle(creq)
        if self.drop_replies > 0:
            self.drop_replies -= 1
            return
        await req.respond(msgspec.json.encode(reply))

    async def handle(self, req: ControlRequest) -> ControlReply:
        """Apply one control operation; safe to call again with the same request."""
        self._expire_lease()
        op = req.op
        if op == "capabilities":
            caps = self.capabilities()
            return self._reply(req, True, capabilities=caps)
        if op == "prepare":
            return await self._prepare(req)
        if op == "restore":
            return await self._restore(req)
        a = self._active
        if a is not None and a.checkpoint_id == req.checkpoint_id:
            if op == "commit":
                if a.state not in WAITING:
                    return self._reply(req, False, error=f"cannot commit when {a.state}", kind=Refusal.FAILED)
                if a.state != ParticipantState.RESTORED:
                    a.state = ParticipantState.COMMITTED
                return self._reply(req, True)
            if op in ("resume", "abort"):
                self._finish(
                    req.checkpoint_id,
                    ParticipantState.RESUMED if op == "resume" else ParticipantState.ABORTED,
                )
                return self._reply(req, True)
        ended = self._finished.get(req.checkpoint_id)
        if ended is not None:
            # a repeat after the fact: same answer, no second effect
            agrees = {
                "commit": (ParticipantState.RESUMED,),
                "resume": (ParticipantState.RESUMED,),
                "abort": (ParticipantState.ABORTED, ParticipantState.LEASE_EXPIRED),
            }
            if ended in agrees.get(op, ()):
                return self._reply(req, True, state=ended)
            return self._reply(
                req,
                False,
                error=f"checkpoint {req.checkpoint_id} already {ended}",
                kind=Refusal.STALE,
                state=ended,
            )
        if op == "abort" and a is None:
            return self._reply(req, True)  # nothing active: aborting is a no-op
        active = a.checkpoint_id if a else "none"
        return self._reply(
            req,
            False,
            kind=Refusal.STALE,
            error=f"{op} for checkpoint {req.checkpoint_id}, but the active one is {active}",
        )

    async def _prepare(self, req: ControlRequest) -> ControlReply:
        a = self._active
        if a is not None and a.checkpoint_id != req.checkpoint_id:
            return self._reply(
                req,
                False,
                kind=Refusal.BUSY,
                error=f"checkpoint {a.checkpoint_id} is active ({a.state})",
            )
        if req.checkpoint_id in self._finished:
            return self._reply(
                req,
                False,
                kind=Refusal.STALE,
                error=f"checkpoint {req.checkpoint_id} already {self._finished[req.checkpoint_id]}",
            )
        if a is None:
            if req.deadline <= time.time():
                return self._reply(req, False, kind=Refusal.DEADLINE, error="the deadline has already passed")
            a = self._active = _Active(req.checkpoint_id, req.deadline, ParticipantState.PREPARING)
            a.prepared = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().create_task(self._do_prepare(req, a))
        assert a.prepared is not None
        return await asyncio.shield(a.prepared)

    async def _do_prepare(self, req: ControlRequest, a: _Active) -> None:
        assert a.prepared is not None
        t0 = time.perf_counter()
        phases: dict[str, float] = {}
        try:
            report = PrepareReport()
            if self.mode == "exported":
                self.gate.close(req.checkpoint_id, req.deadline + self.lease_grace_s)
                if self.drain and not await self.gate.drain(req.deadline):
                    busy = self.gate.inflight
                    raise TimeoutError(f"{busy} accepted requests still running at the deadline")
                t1 = time.perf_counter()
                phases["drain"] = _ms(t1 - t0)
                # in this task, not one of its own (``wait_for``'s): on a loop busy with requests
                # each hop to another task waits a whole turn of the ready queue
                async with asyncio.timeout(max(0.0, req.deadline - time.time())):
                    out = await self.hooks.prepare(req.checkpoint_id)
                phases["export"] = _ms(time.perf_counter() - t1)
                report = out if isinstance(out, PrepareReport) else PrepareReport(unreproducible=list(out))
            elif self.mode == "restart_only":
                report = PrepareReport(
                    unreproducible=[f"{self.instance}: restart_only, sessions cannot continue"]
                )
            a.state = ParticipantState.PREPARED
            phases["total"] = _ms(time.perf_counter() - t0)
            reply = self._reply(req, True, last_seq=self.log.last_appended, report=report, phases=phases)
        except Exception as exc:  # any failure fails this prepare, closed-open: reopen admission
            self._finish(req.checkpoint_id, ParticipantState.ABORTED)
            kind = Refusal.DEADLINE if isinstance(exc, TimeoutError) else Refusal.FAILED
            reply = self._reply(req, False, kind=kind, error=f"prepare failed: {exc!r}")
        a.prepared.set_result(reply)
        if reply.ok:  # on its own lane, after the answer: the record costs the pause nothing
            asyncio.get_running_loop().create_task(record_reply(self.log, self.component, reply))

    async def _restore(self, req: ControlRequest) -> ControlReply:
        a = self._active
        if a is not None and a.checkpoint_id != req.checkpoint_id:
            return self._reply(req, False, kind=Refusal.BUSY, error=f"checkpoint {a.checkpoint_id} is active")
        if req.cut is None:
            return self._reply(req, False, kind=Refusal.BAD_REQUEST, error="restore needs the cut")
        if a is None or a.state != ParticipantState.RESTORED:
            self._finished.pop(req.checkpoint_id, None)
            self._active = _Active(req.checkpoint_id, req.deadline, ParticipantState.RESTORING)
            self.gate.close(req.checkpoint_id, req.deadline + self.lease_grace_s)
            try:
                await self.hooks.restore(req.checkpoint_id, req.cut)
            except Exception as exc:  # a restore that cannot complete says so; it never half-activates
                self._finish(req.checkpoint_id, ParticipantState.ABORTED)
                return self._reply(req, False, kind=Refusal.FAILED, error=f"restore failed: {exc!r}")
            self._active.state = ParticipantState.RESTORED  # paused until an explicit resume
        return self._reply(req, True)

    def _reply(
        self,
        req: ControlRequest,
        ok: bool,
        *,
        error: str = "",
        kind: ControlErrorKind | None = None,
        state: ParticipantState | None = None,
        last_seq: int = 0,
        report: PrepareReport | None = None,
        capabilities: Capabilities | None = None,
        phases: dict[str, float] | None = None,
    ) -> ControlReply:
        a = self._active
        report = report or PrepareReport()
        return ControlReply(
            ok=ok,
            op=req.op,
            checkpoint_id=req.checkpoint_id,
            instance=self.instance,
            state=state or (a.state if a else ParticipantState.IDLE),
            last_seq=last_seq,
            unreproducible=list(report.unreproducible),
            error=error,
            error_kind=kind or "",
            capabilities=capabilities,
            calls=report.calls,
            started_seq=self.started_seq,
            phases_ms=phases or {},
            quarantined={k: v[:300] for k, v in list(report.quarantined.items())[:10_000]},
            active_checkpoint=a.checkpoint_id if a else None,
        )

    # --- lease ----------------------------------------------------------------------

    def _expire_lease(self) -> bool:
        a = self._active
        if a is None or time.time() <= a.deadline + self.lease_grace_s:
            return False
        self.lease_expiries += 1
        self._finish(a.checkpoint_id, ParticipantState.LEASE_EXPIRED)
        asyncio.get_running_loop().create_task(
            record_expiry(self.log, self.component, self.instance, a.checkpoint_id)
        )
        return True

    async def _lease_watch(self) -> None:
        while True:
            a = self._active
            left = 1.0 if a is None else a.deadline + self.lease_grace_s - time.time() + 0.01
            await asyncio.sleep(max(0.01, min(1.0, left)))
            self._expire_lease()
