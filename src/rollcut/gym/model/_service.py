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
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..._bounded import remember
from ..._errors import AdmissionClosedError, RollcutError
from ..._tracing import CHAT_ATTRS, SpanKind, of_attempt, span
from ...bus import (
    EventLog,
    ModelCallAdmitted,
    ModelCallCompleted,
    ModelCallContinued,
    ModelCallFailed,
    ModelCallReused,
    TokenReceipt,
    input_digest,
)
from ...participants import Participant, PrepareReport
from ...replay import AttemptView, AttemptViews, ModelCall
from ...tokens import TokenRecord, TokenStore, TokenWrites, call_store
from .._attempts import view_of
from .._stats import MODEL_STATS, tally
from .._writes import Envelope, append_or_refuse, envelope
from ..wire import ErrorKind, GymError, Identity
from ._backend import Backend, OnToken, Plan
from ._inflight import CallState, InFlightCall, InFlightCalls
from ._plans import replayed_plan, response_message
from ._policy import PolicyClock, Segments

__all__ = ["DEFAULT_MODEL", "CallResult", "ModelService"]

DEFAULT_MODEL = "rollcut-local"
"""The model name answered when a request names none (and the ``model_name`` of its metrics)."""

_DIGEST_SKIP = frozenset({"stream", "stream_options", "user"})


@dataclass
class CallResult:
    call_id: str
    plan: Plan
    output_ids: list[int]
    receipt: TokenReceipt
    served_from_log: bool = False
    continued_from: int = 0
    started_over: str | None = None
    """Why an earlier attempt's part of this call was not used (None: there was none, or it was)."""


_FIRST = "\x00first"  # no model call in this attempt yet: the parent comes from the lineage


@dataclass(frozen=True)
class _Call:
    """One call as the service handles it: its attempt, identity, request, stream and view."""

    ident: Identity
    call_id: str
    digest: str
    body: dict[str, Any]
    on_token: OnToken | None
    view: AttemptView
    envelope: Envelope  # the fields every event of the call starts with


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
        policy: PolicyClock | None = None,
        model_name: str = DEFAULT_MODEL,
    ) -> None:
        self.log = log
        self.model_name = model_name
        self.policy = policy or PolicyClock()  # the version each token is recorded under
        self.tokens = tokens
        self.writes = TokenWrites(tokens)  # concurrent calls' records share a transaction
        self.backend = backend
        self.instance = instance
        self.participant = participant
        self.views = AttemptViews(log)  # what each continued attempt starts from, read once
        self._running: dict[str, asyncio.Future[CallResult]] = {}  # call id -> the call, while it runs
        self._settled: OrderedDict[str, CallResult] = OrderedDict()  # call id -> what it produced; bounded
        self._retired: OrderedDict[str, str] = OrderedDict()  # rollout -> why; bounded, newest last
        self._lag_checked: OrderedDict[str, bool] = OrderedDict()  # attempts whose lineage passed
        self.stats = tally(MODEL_STATS, model_name)
        self._inflight = InFlightCalls(
            backend, self.writes, self._append, instance=instance, stats=self.stats
        )

    def retire(self, rollout_id: str, reason: str) -> None:
        """The rollout is over: its restore contexts go, and a running generation stops at its next
        token (a retirement's fence refuses whatever it would record anyway)."""
        self.views.forget(rollout_id)
        if reason != "accepted" and self._inflight.of_rollout(rollout_id):
            remember(self._retired, rollout_id, reason, 10_000)

    async def _parent(self, ident: Identity) -> str | None:
        last = await self.log.last_on(self.log.subjects.event(ident.rollout_id, ident.attempt, "model", "*"))
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
        self, ident: Identity, body: dict[str, Any], on_token: OnToken | None = None
    ) -> CallResult:
        digest, call_id = self.call_identity(ident, body)
        self.stats.inc("calls_admitted")
        model = str(body.get("model") or self.model_name)
        attrs = {**CHAT_ATTRS, "gen_ai.request.model": model, "rollcut.call_id": call_id, **of_attempt(ident)}
        with span(f"chat {model}", SpanKind.SERVER, attrs) as s:
            result, disposition = await self._answer(ident, body, digest, call_id, on_token)
            if s.is_recording():
                s.set_attributes(
                    {
                        "gen_ai.response.model": self.model_name,
                        "gen_ai.response.id": call_id,
                        "gen_ai.response.finish_reasons": [result.plan.finish_reason],
                        "gen_ai.usage.input_tokens": len(result.plan.prompt_ids),
                        "gen_ai.usage.output_tokens": len(result.output_ids),
                        "rollcut.call.disposition": disposition,
                        "rollcut.cut": result.continued_from,
                    }
                )
            return result

    async def _answer(
        self, ident: Identity, body: dict[str, Any], digest: str, call_id: str, on_token: OnToken | None
    ) -> tuple[CallResult, str]:
        """The call's result and how it came: ``joined`` (the same call, running or just run),
        ``served_from_log``, ``continued`` (from an earlier attempt's cut) or ``generated``."""
        # the same request in the same attempt is the same call: join it while it runs, answer it
        # from what it produced once it ran; never generate it twice
        settled = self._settled.get(call_id)
        if settled is not None:
            self.stats.inc("calls_joined")
            return dataclasses.replace(settled, served_from_log=True), "joined"
        running = self._running.get(call_id)
        if running is not None:
            self.stats.inc("calls_joined")
            return dataclasses.replace(await asyncio.shield(running), served_from_log=True), "joined"
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
            how = (
                "served_from_log" if result.served_from_log else "continued" if result.continued_from else ""
            )
            return result, how or "generated"
        finally:
            self._running.pop(call_id, None)

    async def _call(
        self,
        ident: Identity,
        body: dict[str, Any],
        digest: str,
        call_id: str,
        on_token: OnToken | None,
    ) -> CallResult:
        view = await view_of(self.views, ident)
        call = _Call(ident, call_id, digest, body, on_token, view, envelope("model", self.instance, ident))
        if self.policy.max_lag is not None and ident.attempt > 1:
            await self._check_carried(ident, view)
        # lineage is looked up while the call runs: only the completed event needs it
        parent = asyncio.ensure_future(self._parent(ident))
        gate = self.participant.gate.admit() if self.participant else None
        try:
            if gate is not None:
                await gate.__aenter__()
        except AdmissionClosedError as exc:
            raise GymError.admission_closed(exc) from exc
        try:
            source = view.reusable_calls.get(digest)
            if source is not None and source[1].settled:
                first = await parent
                # a continued attempt's first call hangs under the call it repeats' own parent
                first = source[1].parent_call_id if first == _FIRST else first
                return await self._reuse(call, first, source)
            return await self._generate(call, parent, source)
        finally:
            if not parent.done():
                parent.cancel()
            if gate is not None:
                await gate.__aexit__(None, None, None)

    async def _check_carried(self, ident: Identity, view: AttemptView) -> None:
        """A continued attempt carries its lineage's calls into its row (from its boundary, reused, or
        continued from a prefix): if any is older than ``--max-policy-lag`` allows, the rollout starts
        over. Checked once per attempt, at its first call."""
        key = f"{ident.rollout_id}|{ident.attempt}"
        if key in self._lag_checked:
            return
        for _, call in view.reusable_calls.values():
            assert call.receipt is not None  # reusable calls have one
            record = await call_store(self.tokens, self.tokens.get, call.receipt)
            self.policy.check_lag(record, rollout_id=ident.rollout_id, what=f"call {call.call_id}")
        remember(self._lag_checked, key, True, 4096)

    async def _append(self, event: Any) -> int:
        return await append_or_refuse(self.log, event)

    @staticmethod
    def _taken_over(call: _Call, source: tuple[int, ModelCall]) -> dict[str, Any]:
        """The fields of an event whose call takes over an earlier attempt's (reused or continued)."""
        src_attempt, src = source
        return {
            **call.envelope,
            "call_id": call.call_id,
            "request_digest": call.digest,
            "source_call_id": src.call_id,
            "source_attempt": src_attempt,
        }

    def _policy_version(self) -> str:
        return self.backend.last_policy_version or self.backend.policy_version

    async def training_record(self, result: CallResult) -> TokenRecord:
        """What an answer's token arrays show: the token store's record of the call, so a call served
        from the log or continued from a prefix shows exactly what was stored."""
        record: TokenRecord = await call_store(self.tokens, self.tokens.get, result.receipt)
        return record

    async def _reuse(self, call: _Call, parent: str | None, source: tuple[int, ModelCall]) -> CallResult:
        src = source[1]
        assert src.receipt is not None
        record = await call_store(self.tokens, self.tokens.get, src.receipt)  # verifies the digest
        plan = replayed_plan(record, src)
        await self._append(
            ModelCallReused(
                **self._taken_over(call, source),
                receipt=src.receipt,
                parent_call_id=parent,
                response=src.response,
                finish_reason=plan.finish_reason,
                stop_sequence=plan.stop_sequence,
            )
        )
        await self.writes.link(call.call_id, parent, src.receipt.receipt_id)
        self.stats.inc("calls_served_from_log")
        self.stats.inc("tokens_reused", len(record.output_ids))
        return CallResult(call.call_id, plan, list(record.output_ids), src.receipt, served_from_log=True)

    async def _generate(
        self, call: _Call, parent_task: asyncio.Future[str | None], source: tuple[int, ModelCall] | None
    ) -> CallResult:
        """Generate the call (the rest of it, after an earlier attempt's durable prefix if it has one),
        its tokens durable and ``model.completed`` appended before it returns."""
        # a backend that plans ahead (local) knows its tokens now; an upstream only once it answers.
        # In flight from here (a prepare meanwhile says never_started): an engine's start awaits its
        # tokenizer, and a call admitted below the cut must be in the prepare's reply
        fl = self._inflight.open(call.ident, call.call_id)
        try:
            plan = fl.plan = await self.backend.start(call.body) if self.backend.plans_ahead else None
            start, why = 0, None
            if source is not None and source[1].receipt is not None:
                start, why = await self._continue(call, fl, plan, source)
            if start == 0:
                await self._append(
                    ModelCallAdmitted(**call.envelope, call_id=call.call_id, request_digest=call.digest)
                )
            if fl.segments is None:
                fl.segments = Segments(self.policy)
            fl.state = CallState.QUEUED
            if call.on_token is not None and plan is not None:  # a continued call streams its prefix first
                for i, tok in enumerate(fl.emitted):
                    await call.on_token(tok, self.backend.piece(plan, i), plan.logprob(i))
            fl.state = CallState.GENERATING
            if plan is None:
                plan = fl.plan = await self.backend.start(call.body)
            await self._tokens(call, fl, plan, start)
            result = await self._complete(call, fl, plan, start, await parent_task, why)
            fl.state = CallState.DONE
            return result
        except GymError:
            fl.state = CallState.FAILED
            raise
        except Exception as exc:
            fl.state = CallState.FAILED
            self.stats.inc("calls_failed")
            # the failure of recording a failure must not mask the failure
            with contextlib.suppress(RollcutError):
                await self.log.append(
                    ModelCallFailed(**call.envelope, call_id=call.call_id, error=repr(exc)[:500])
                )
            raise
        finally:
            self._inflight.close(call.call_id)

    async def _continue(
        self, call: _Call, fl: InFlightCall, plan: Plan | None, source: tuple[int, ModelCall]
    ) -> tuple[int, str | None]:
        """Take an earlier attempt's durable prefix as the start of this call, if the backend says it
        belongs to it (``model.continued``): the tokens it starts from, or 0 and why it starts over
        (fail closed: a prefix not shown to be this call's is never continued, and the answer says so)."""
        src = source[1]
        assert src.receipt is not None
        if plan is None:
            return 0, f"the {self.backend.name} backend cannot continue a cut call"
        record = await call_store(self.tokens, self.tokens.get, src.receipt)
        self.policy.check_lag(record, rollout_id=call.ident.rollout_id, what=f"the prefix of {src.call_id}")
        prefix = list(record.output_ids)
        if not await self.backend.adopt_prefix(plan, record):
            self.stats.inc("prefixes_refused")
            return 0, f"the {self.backend.name} backend refused {src.call_id}'s cut prefix as not this call's"
        fl.segments = Segments(self.policy, record, len(prefix))
        await self._append(
            ModelCallContinued(
                **self._taken_over(call, source),
                prefix_receipt=src.receipt,
                token_boundary=len(prefix),
                delivery="staged",
            )
        )
        fl.emitted = prefix
        fl.durable = (len(prefix), src.receipt)  # durable already: a cut need not redo it
        self.stats.inc("calls_continued")
        self.stats.inc("tokens_reused", len(prefix))
        return len(prefix), None

    async def _tokens(self, call: _Call, fl: InFlightCall, plan: Plan, start: int) -> None:
        """Run the backend from ``start``, each token into the call's buffer (what a cut takes) and
        its stream; a retired rollout's generation stops at its next token."""
        segments = fl.segments
        assert segments is not None
        plan.clock, plan.opened = self.policy.now, segments.opened
        async with contextlib.aclosing(self.backend.generate(plan, start=start)) as tokens:
            async for tok in tokens:
                if self._retired and call.ident.rollout_id in self._retired:
                    self.stats.inc("calls_stopped_by_retirement")
                    why = self._retired[call.ident.rollout_id]
                    raise GymError(ErrorKind.RETIRED, f"{call.ident.rollout_id} was retired: {why}")
                fl.emitted.append(tok)
                i = len(fl.emitted) - 1
                segments.token(i)
                self.stats.inc("tokens_generated")
                if call.on_token is not None:
                    await call.on_token(tok, self.backend.piece(plan, i), plan.logprob(i))

    async def _complete(
        self, call: _Call, fl: InFlightCall, plan: Plan, start: int, parent: str | None, why: str | None
    ) -> CallResult:
        """The call's tokens and lineage link in one grouped transaction, durable before the
        ``model.completed`` that names the receipt."""
        out = list(fl.emitted)
        assert fl.segments is not None
        if parent == _FIRST:
            parent = call.view.last_call_id
        custody = time.perf_counter()
        receipt = await self.writes.put(
            call.call_id,
            TokenRecord(
                prompt_ids=plan.prompt_ids,
                output_ids=out,
                mask=[1] * len(out),
                logprobs=plan.logprobs[: len(out)],
                policy_version=self._policy_version(),
                segments=fl.segments.close(len(out)),
            ),
            parent=parent,
            link=True,
        )
        await self._append(
            ModelCallCompleted(
                **call.envelope,
                call_id=call.call_id,
                request_digest=call.digest,
                receipt=receipt,
                parent_call_id=parent,
                finish_reason=plan.finish_reason,
                policy_version=self._policy_version(),
                response=response_message(plan, out),
                stop_sequence=plan.stop_sequence,
            )
        )
        self.stats.observe("custody", time.perf_counter() - custody)
        self.stats.inc("calls_generated")
        if start == 0 and call.digest in call.view.lost_calls:  # an earlier attempt's, lost with it
            self.stats.inc("calls_regenerated")
            self.stats.inc("tokens_regenerated", len(out))
            why = why or "an earlier attempt made this call and no checkpoint kept any of it"
        return CallResult(call.call_id, plan, out, receipt, continued_from=start, started_over=why)

    # --- generation cuts -----------------------------------------------------------------

    async def cut(self, checkpoint_id: str) -> PrepareReport:
        """Give every in-flight call one disposition; swap the buffers of running ones."""
        return await self._inflight.cut(checkpoint_id)

    async def prepare(self, checkpoint_id: str) -> PrepareReport:
        return await self.cut(checkpoint_id)

    async def restore(self, checkpoint_id: str, cut: int) -> None:
        self.views.clear()  # each attempt's view is read from the log again on its next call
