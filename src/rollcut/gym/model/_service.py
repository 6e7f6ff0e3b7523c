"""Durable custody of model calls, independent of HTTP.

For every call: a fenced ``model.admitted`` event before generation starts (a
tombstoned attempt is refused by the server and nothing is generated); the
tokens into the token store; then ``model.completed`` with the receipt and
the parent call before the response leaves. A failure is recorded as
``model.failed``.

Generation cuts: while admission is closed for an aligned prepare, each
in-flight call gets exactly one disposition. A call that is generating has
its active buffer swapped: the tokens so far are frozen, written to the token
store and recorded as ``model.prefix_cut``; generation then goes on (the
HTTP request is still open).

Reuse: in attempt N+1 (opened from a checkpoint cut), a request whose digest
matches a call of an earlier attempt that completed below the cut is answered
from the log and the token store (``model.reused``, zero tokens generated);
one that matches a prefix-cut call continues from its durable prefix
(``model.continued``) and generates only the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..._bounded import remember
from ..._errors import AdmissionClosedError, RollcutError, StaleAttemptError
from ...bus import (
    AttemptOpened,
    EventLog,
    ModelCallAdmitted,
    ModelCallCompleted,
    ModelCallContinued,
    ModelCallFailed,
    ModelCallReused,
    RolloutEvent,
    TokenReceipt,
    input_digest,
)
from ...participants import ExportReport, Participant
from ...replay import ModelCall, ModelFold, ModelSession, replay
from ...tokens import TokenRecord, TokenStore, TokenWrites, call_store
from .._http import Envelope, append_or_refuse, envelope
from ..wire import ErrorKind, GymError, Identity
from ._backend import Backend
from ._cuts import cut_in_flight
from ._local import Plan, replayed_plan, response_message

__all__ = ["CallResult", "ModelService"]

_DIGEST_SKIP = frozenset({"stream", "stream_options", "user"})


@dataclass
class CallResult:
    call_id: str
    plan: Plan
    output_ids: list[int]
    receipt: TokenReceipt
    served_from_log: bool = False
    continued_from: int = 0


@dataclass
class _InFlight:
    ident: Identity
    call_id: str
    plan: Plan | None = None
    emitted: list[int] = field(default_factory=list)
    state: str = "admitting"  # admitting | queued | generating | done | failed
    cuts: int = 0


@dataclass
class _AttemptContext:
    from_cut: int
    reusable: dict[str, tuple[int, ModelCall]]  # request digest -> (source attempt, call)
    last_call: str | None = None  # the lineage's last completed call at the cut: the first parent


_FIRST = "\x00first"  # no model call in this attempt yet: the parent comes from the lineage


class ModelService:
    """One worker's model calls: custody, cuts, reuse."""

    def __init__(
        self,
        log: EventLog,
        tokens: TokenStore,
        backend: Backend,
        *,
        instance: str,
        participant: Participant | None = None,
    ) -> None:
        self.log = log
        self.tokens = tokens
        self.writes = TokenWrites(tokens)  # concurrent calls' records share a transaction
        self.backend = backend
        self.instance = instance
        self.participant = participant
        self._inflight: dict[str, _InFlight] = {}
        self._running: dict[str, asyncio.Future[CallResult]] = {}  # call id -> the call, while it runs
        self._settled: OrderedDict[str, CallResult] = OrderedDict()  # call id -> what it produced; bounded
        self._contexts: OrderedDict[Identity, _AttemptContext] = OrderedDict()
        self._retired: OrderedDict[str, str] = OrderedDict()  # rollout -> why; bounded, newest last
        self.stats = {
            "calls_generated": 0,
            "calls_served_from_log": 0,
            "calls_continued": 0,
            "calls_joined": 0,
            "calls_failed": 0,
            "tokens_generated": 0,
            "tokens_reused": 0,
            "prefix_cuts": 0,
            "calls_stopped_by_retirement": 0,
        }

    def retire(self, rollout_id: str, reason: str) -> None:
        """The rollout is over: its restore contexts go, and a running generation stops at its next
        token (a retirement's fence refuses whatever it would record anyway)."""
        for ident in [i for i in self._contexts if i.rollout_id == rollout_id]:
            del self._contexts[ident]
        if reason != "accepted" and any(f.ident.rollout_id == rollout_id for f in self._inflight.values()):
            remember(self._retired, rollout_id, reason, 10_000)

    # --- the attempt's restore context --------------------------------------------------

    async def _context(self, ident: Identity) -> _AttemptContext:
        ctx = self._contexts.get(ident)
        if ctx is not None:
            return ctx
        from_cut, opened_seq = 0, 0
        if ident.attempt > 1:
            opened = await self.log.last_on(self.log.subjects.fence(ident.rollout_id))
            ev = opened.event if opened else None
            if not (isinstance(ev, AttemptOpened) and ev.attempt == ident.attempt):
                state = await self.log.fence_state(ident.rollout_id)
                current = state.attempt if state and state.open else None
                stale = StaleAttemptError(ident.rollout_id, ident.attempt, current)
                raise GymError(
                    ErrorKind.STALE_ATTEMPT, str(stale), rollout_id=ident.rollout_id, attempt=ident.attempt
                )
            assert opened is not None  # it holds ev
            from_cut, opened_seq = ev.from_cut, opened.seq
        reusable: dict[str, tuple[int, ModelCall]] = {}
        r = None
        if from_cut:
            res = await replay(self.log, up_to=from_cut, rollout_id=ident.rollout_id)
            r = res.rollouts.get(ident.rollout_id)
            for attempt, a in sorted(r.attempts.items()) if r else []:
                if attempt >= ident.attempt or "model" not in a.sessions:
                    continue
                for call in a.sessions["model"].calls.values():
                    if call.status in ("completed", "reused", "prefix_cut") and call.receipt is not None:
                        reusable[call.request_digest] = (attempt, call)
        if from_cut and opened_seq > from_cut:
            await self._completed_after_cut(ident, from_cut, opened_seq, reusable)
        last_call: tuple[int, str] = (0, "")  # the conversation's last call at the cut
        for seg in r.lineage(from_cut) if from_cut and r is not None else []:
            a = r.attempts[seg.attempt]  # type: ignore[union-attr]
            for call in a.sessions["model"].calls.values() if "model" in a.sessions else []:
                done = call.status in ("completed", "reused") and call.final_seq <= seg.up_to
                if done and call.final_seq > last_call[0]:
                    last_call = (call.final_seq, call.call_id)
        ctx = _AttemptContext(from_cut, reusable, last_call[1] or None)
        remember(self._contexts, ident, ctx, 4096)
        return ctx

    async def _completed_after_cut(
        self, ident: Identity, from_cut: int, opened_seq: int, reusable: dict[str, tuple[int, ModelCall]]
    ) -> None:
        """Calls an earlier attempt completed after the cut, before the fence moved to this attempt.

        The cut is sealed first and the next attempt opened after it; between the two, the earlier
        attempt still runs (a generation in flight at the seal finishes, an agent takes its next
        step). A completion recorded there is a finished sample for its exact request: a call of
        this attempt with the same request digest (the same conversation, to the byte) reuses it
        instead of generating it again. Nothing after the fence can be an earlier attempt's: the
        fence refuses it."""
        fold, after = (
            ModelFold(),
            dict[int, ModelSession](),
        )  # earlier attempts' model sessions, past the cut, folded as replay does
        async for s in self.log.read(rollout_id=ident.rollout_id, start=from_cut + 1, up_to=opened_seq):
            ev = s.event
            if isinstance(ev, RolloutEvent) and ev.component == "model" and ev.attempt < ident.attempt:
                fold.apply(after.setdefault(ev.attempt, fold.initial()), s)
        for attempt, session in sorted(after.items()):
            for call in session.calls.values():
                have = reusable.get(call.request_digest)
                done = have is not None and have[1].status in ("completed", "reused")
                if call.status == "completed" and call.receipt is not None and not done:
                    reusable[call.request_digest] = (attempt, call)

    async def _parent(self, ident: Identity) -> str | None:
        last = await self.log.last_on(self.log.subjects.event(ident.rollout_id, ident.attempt, "model"))
        ev = last.event if last else None
        if ev is None:
            return _FIRST if ident.attempt > 1 else None
        if isinstance(ev, ModelCallCompleted | ModelCallReused):
            return ev.call_id
        return getattr(ev, "parent_call_id", None)

    # --- a call --------------------------------------------------------------------------

    @staticmethod
    def call_identity(ident: Identity, body: dict[str, Any]) -> tuple[str, str]:
        """The request digest and call id of a request: the same request in the same attempt is the
        same logical call (a retry), known before it runs (a stream names it in its first chunk)."""
        digest = input_digest({k: v for k, v in body.items() if k not in _DIGEST_SKIP})
        key = f"{ident.rollout_id}|{ident.attempt}|{digest}".encode()
        return digest, "c" + hashlib.blake2b(key, digest_size=10).hexdigest()

    async def call(
        self,
        ident: Identity,
        body: dict[str, Any],
        on_token: Callable[[int, str], Awaitable[None]] | None = None,
    ) -> CallResult:
        digest, call_id = self.call_identity(ident, body)
        # the same request in the same attempt is the same call: join it while it runs, answer it
        # from what it produced once it ran; never generate it twice
        settled = self._settled.get(call_id)
        if settled is not None:
            self.stats["calls_joined"] += 1
            return dataclasses.replace(settled, served_from_log=True)
        running = self._running.get(call_id)
        if running is not None:
            self.stats["calls_joined"] += 1
            return dataclasses.replace(await asyncio.shield(running), served_from_log=True)
        done: asyncio.Future[CallResult] = asyncio.get_running_loop().create_future()
        self._running[call_id] = done
        try:
            result = await self._call(ident, body, digest, call_id, on_token)
        except BaseException as exc:
            done.set_exception(exc)
            done.exception()  # retrieved: a call nobody joined must not warn
            raise
        else:
            done.set_result(result)
            remember(self._settled, call_id, result, 4096)
            return result
        finally:
            self._running.pop(call_id, None)

    async def _call(
        self,
        ident: Identity,
        body: dict[str, Any],
        digest: str,
        call_id: str,
        on_token: Callable[[int, str], Awaitable[None]] | None,
    ) -> CallResult:
        ctx = await self._context(ident)
        # lineage is looked up while the call runs: only the completed event needs it
        parent = asyncio.ensure_future(self._parent(ident))
        gate = self.participant.gate.admit() if self.participant else None
        try:
            if gate is not None:
                await gate.__aenter__()
        except AdmissionClosedError as exc:
            raise GymError.admission_closed(exc) from exc
        try:
            source = ctx.reusable.get(digest)
            if source is not None and source[1].status in ("completed", "reused"):
                first = await parent
                # a continued attempt's first call hangs under the call it repeats' own parent
                first = source[1].parent_call_id if first == _FIRST else first
                return await self._reuse(ident, call_id, digest, first, body, source)
            return await self._generate(ident, call_id, digest, parent, body, source, on_token, ctx)
        finally:
            if not parent.done():
                parent.cancel()
            if gate is not None:
                await gate.__aexit__(None, None, None)

    def _ev(self, ident: Identity) -> Envelope:
        return envelope("model", self.instance, ident)

    async def _append(self, event: Any) -> int:
        return await append_or_refuse(self.log, event)

    def _policy_version(self) -> str:
        return self.backend.last_policy_version or self.backend.policy_version

    async def _reuse(
        self,
        ident: Identity,
        call_id: str,
        digest: str,
        parent: str | None,
        body: dict[str, Any],
        source: tuple[int, ModelCall],
    ) -> CallResult:
        src_attempt, src = source
        assert src.receipt is not None
        record = await call_store(self.tokens, self.tokens.get, src.receipt)  # verifies the digest
        plan = replayed_plan(record, src.response)
        await self._append(
            ModelCallReused(
                **self._ev(ident),
                call_id=call_id,
                request_digest=digest,
                source_call_id=src.call_id,
                source_attempt=src_attempt,
                receipt=src.receipt,
                parent_call_id=parent,
                response=src.response,
            )
        )
        await self.writes.link(call_id, parent, src.receipt.receipt_id)
        self.stats["calls_served_from_log"] += 1
        self.stats["tokens_reused"] += len(record.output_ids)
        return CallResult(call_id, plan, list(record.output_ids), src.receipt, served_from_log=True)

    async def _generate(
        self,
        ident: Identity,
        call_id: str,
        digest: str,
        parent_task: asyncio.Future[str | None],
        body: dict[str, Any],
        source: tuple[int, ModelCall] | None,
        on_token: Callable[[int, str], Awaitable[None]] | None,
        ctx: _AttemptContext,
    ) -> CallResult:
        # a backend that plans ahead (local) knows its tokens now; an upstream only once it answers
        # in flight from here (a prepare meanwhile says never_started): an engine's start awaits its
        # tokenizer, and a call admitted below the cut must be in the prepare's reply
        fl = _InFlight(ident, call_id)
        self._inflight[call_id] = fl
        try:
            plan = fl.plan = await self.backend.start(body) if self.backend.plans_ahead else None
            start = 0
            if plan is not None and source is not None and source[1].receipt is not None:  # continue a prefix
                src_attempt, src = source
                assert src.receipt is not None
                record = await call_store(self.tokens, self.tokens.get, src.receipt)
                prefix = list(record.output_ids)
                if await self.backend.adopt_prefix(plan, record):
                    await self._append(
                        ModelCallContinued(
                            **self._ev(ident),
                            call_id=call_id,
                            request_digest=digest,
                            source_call_id=src.call_id,
                            source_attempt=src_attempt,
                            prefix_receipt=src.receipt,
                            token_boundary=len(prefix),
                            delivery="staged",
                        )
                    )
                    fl.emitted, start = prefix, len(prefix)
                    self.stats["calls_continued"] += 1
                    self.stats["tokens_reused"] += len(prefix)
            if start == 0:
                await self._append(
                    ModelCallAdmitted(
                        **self._ev(ident),
                        call_id=call_id,
                        request_digest=digest,
                    )
                )
            fl.state = "queued"
            if on_token is not None:
                for i, tok in enumerate(fl.emitted):
                    await on_token(tok, self.backend.piece(plan, i) if plan is not None else "")
            fl.state = "generating"
            if plan is None:
                plan = fl.plan = await self.backend.start(body)
            async with contextlib.aclosing(self.backend.generate(plan, start=start)) as tokens:
                async for tok in tokens:
                    if self._retired and ident.rollout_id in self._retired:
                        self.stats["calls_stopped_by_retirement"] += 1
                        raise GymError(
                            ErrorKind.RETIRED,
                            f"{ident.rollout_id} was retired: {self._retired[ident.rollout_id]}",
                        )
                    fl.emitted.append(tok)
                    self.stats["tokens_generated"] += 1
                    if on_token is not None:
                        await on_token(tok, self.backend.piece(plan, len(fl.emitted) - 1))
            out = list(fl.emitted)
            parent = await parent_task
            if parent == _FIRST:
                parent = ctx.last_call
            # the record and its lineage link in one grouped transaction, durable before the
            # completed event names the receipt
            receipt = await self.writes.put(
                call_id,
                TokenRecord(
                    prompt_ids=plan.prompt_ids,
                    output_ids=out,
                    mask=[1] * len(out),
                    logprobs=plan.logprobs[: len(out)],
                    policy_version=self._policy_version(),
                ),
                parent=parent,
                link=True,
            )
            await self._append(
                ModelCallCompleted(
                    **self._ev(ident),
                    call_id=call_id,
                    request_digest=digest,
                    receipt=receipt,
                    parent_call_id=parent,
                    finish_reason=plan.finish_reason,
                    policy_version=self._policy_version(),
                    response=response_message(plan, out),
                )
            )
            fl.state = "done"
            self.stats["calls_generated"] += 1
            return CallResult(call_id, plan, out, receipt, continued_from=start)
        except GymError:
            fl.state = "failed"
            raise
        except Exception as exc:
            fl.state = "failed"
            self.stats["calls_failed"] += 1
            # the failure of recording a failure must not mask the failure
            with contextlib.suppress(RollcutError):
                await self.log.append(
                    ModelCallFailed(**self._ev(ident), call_id=call_id, error=repr(exc)[:500])
                )
            raise
        finally:
            self._inflight.pop(call_id, None)

    # --- generation cuts -----------------------------------------------------------------

    async def cut(self, checkpoint_id: str) -> ExportReport:
        """Give every in-flight call one disposition; swap the buffers of running ones."""
        return await cut_in_flight(self, checkpoint_id)

    async def export(self, checkpoint_id: str) -> ExportReport:
        return await self.cut(checkpoint_id)

    async def restore(self, checkpoint_id: str, cut: int) -> None:
        self._contexts.clear()  # attempt contexts are rebuilt from the log on the next call
