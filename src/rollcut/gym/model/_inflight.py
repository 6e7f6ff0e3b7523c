"""The model calls running in one worker, and the generation cut that settles them at a prepare.

At an aligned prepare every admitted call gets exactly one disposition. A call
that never started is ``never_started``; one that finished is ``completed``;
one that failed, ``failed``. A call that is generating has its active buffer
swapped: the tokens so far are frozen, written to the token store and recorded
as ``model.prefix_cut`` (the call goes on; a continuation resumes from that
prefix). A backend that cannot cut marks a running call ``excluded`` (it runs
again after a crash), never a false prefix.

Once prepares come at a steady period the cuts are taken ahead of the next one
(:mod:`._ahead`), and that prepare writes nothing: a running call is reported at
its last durable prefix, and one whose first tokens came after the cut ahead as
``never_started`` (nothing of it is kept; a crash costs it a lead's tokens).

:class:`InFlightCalls` owns the running calls and their cut; the model service
registers each call with it and hands it what a cut writes with (the backend,
the token writes, the append), so neither reaches into the other.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from typing import TypedDict

from ..._errors import RollcutError
from ..._metrics import Tally
from ...bus import Event, ModelCallExcluded, ModelCallPrefixCut, TokenReceipt
from ...participants import CallDisposition, PrepareReport
from ...tokens import TokenRecord, TokenWrites
from .._writes import envelope
from ..wire import ErrorKind, GymError, Identity
from ._ahead import CutAhead
from ._backend import Backend, Plan
from ._policy import Segments

__all__ = ["CallState", "InFlightCall", "InFlightCalls"]


class CallState(StrEnum):
    """Where a running call stands in this server (what a cut gives it as its disposition)."""

    ADMITTING = "admitting"
    """Its admission is being recorded: a cut says ``never_started``."""
    QUEUED = "queued"
    """Admitted, waiting for its backend: ``never_started``."""
    GENERATING = "generating"
    """Tokens coming: a cut takes them as its prefix (or excludes it, on a backend that cannot cut)."""
    DONE = "done"
    """Its ``model.completed`` is appended: ``completed``."""
    FAILED = "failed"
    """It ended in an error: ``failed``."""


@dataclass
class InFlightCall:
    """One call from admission to its end: what it has emitted so far, and where it stands."""

    ident: Identity
    call_id: str
    plan: Plan | None = None
    emitted: list[int] = field(default_factory=list)
    state: CallState = CallState.ADMITTING
    cuts: int = 0
    segments: Segments | None = None  # which policy version generated which of ``emitted``
    durable: tuple[int, TokenReceipt] | None = None  # the prefix already durable: (tokens, receipt)


class _Base(TypedDict):
    call_id: str
    rollout_id: str
    attempt: int


def _base(fl: InFlightCall) -> _Base:
    return _Base(call_id=fl.call_id, rollout_id=fl.ident.rollout_id, attempt=fl.ident.attempt)


@dataclass(eq=False)
class InFlightCalls:
    """The calls running in one worker, by call id, and the cut that settles them."""

    backend: Backend
    writes: TokenWrites
    append: Callable[[Event], Awaitable[int]]
    _: KW_ONLY
    instance: str
    stats: Tally
    ahead: CutAhead = field(default_factory=CutAhead)
    _calls: dict[str, InFlightCall] = field(default_factory=dict, init=False)
    _writing: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)  # cuts ahead and a prepare's
    _prepares: int = field(default=0, init=False)
    _ahead_at: float = field(default=-math.inf, init=False)  # when the last cut ahead was taken (loop clock)
    _ahead_task: asyncio.Task[int] | None = field(default=None, init=False)

    def open(self, ident: Identity, call_id: str) -> InFlightCall:
        """A call is in flight from here (a prepare meanwhile says ``never_started``)."""
        fl = self._calls[call_id] = InFlightCall(ident, call_id)
        return fl

    def close(self, call_id: str) -> None:
        self._calls.pop(call_id, None)

    def values(self) -> Iterator[InFlightCall]:
        return iter(list(self._calls.values()))

    def __len__(self) -> int:
        return len(self._calls)

    def of_rollout(self, rollout_id: str) -> bool:
        """Whether any call of the rollout is running here."""
        return any(f.ident.rollout_id == rollout_id for f in self._calls.values())

    async def cut(self, checkpoint_id: str) -> PrepareReport:
        """Give every in-flight call one disposition; swap the buffers of running ones.

        Every swap happens in one synchronous pass (no await between reading one call's boundary
        and the next), so all cuts are taken at the same instant; their records are then written
        together, one grouped token-store transaction and concurrent appends, not one fsync per
        running call. A call cut ahead of this prepare (:mod:`._ahead`) is reported at that cut,
        durable already, with nothing written now."""
        now = asyncio.get_running_loop().time()
        fresh_since = self.ahead.fresh_since(now)
        self._prepares += 1
        self.ahead.prepared(now, self._take_ahead)
        async with self._writing:  # a cut ahead still writing ends first: this cut may report it
            return await self._cut(ahead=self._ahead_at >= fresh_since)

    async def _cut(self, *, ahead: bool) -> PrepareReport:
        """``ahead``: a cut was taken ahead of this prepare, so everything generated before it is
        durable, and nothing is written now."""
        backend = self.backend
        calls: list[CallDisposition] = []
        excluded: list[tuple[InFlightCall, _Base]] = []
        frozen: list[tuple[InFlightCall, _Base, list[int], Plan]] = []
        for fl in list(self._calls.values()):
            base = _base(fl)
            if fl.state in (CallState.ADMITTING, CallState.QUEUED) or (
                fl.state == CallState.GENERATING and backend.can_cut and not fl.emitted
            ):
                calls.append(CallDisposition(**base, disposition="never_started"))
            elif fl.state == CallState.GENERATING and not backend.can_cut:
                excluded.append((fl, base))
            elif (
                fl.state == CallState.GENERATING
                and fl.durable is not None
                and (fl.durable[0] == len(fl.emitted) or ahead)
            ):
                # nothing generated since its last cut, or a cut ahead of this prepare took all it had
                # then: that prefix stands, and the call goes on untouched. A call whose re-prefill
                # outlasts the checkpoint interval (a real model on a CPU) is not aborted again and again
                n, receipt = fl.durable
                calls.append(
                    CallDisposition(**base, disposition="prefix_cut", receipt=receipt, token_boundary=n)
                )
            elif fl.state == CallState.GENERATING and ahead:
                # its first tokens came after the cut ahead: nothing of it is kept at this cut (a crash
                # costs it a lead's tokens at most), and nothing is written in the pause
                calls.append(CallDisposition(**base, disposition="never_started"))
            elif fl.state == CallState.GENERATING:
                frozen.append(self._freeze(fl, base))
            elif fl.state == CallState.DONE:
                calls.append(CallDisposition(**base, disposition="completed"))
            else:
                calls.append(CallDisposition(**base, disposition="failed"))
        reason = f"the {backend.name} backend cannot cut a running generation"
        written = await asyncio.gather(
            *(
                self._fenced(
                    ModelCallExcluded(
                        **envelope("model", self.instance, fl.ident), call_id=fl.call_id, reason=reason
                    ),
                )
                for fl, _ in excluded
            )
        )
        calls += [
            CallDisposition(**base, disposition="excluded" if ok else "failed")
            for (_, base), ok in zip(excluded, written, strict=True)
        ]
        for base, kept in await self._write(frozen):
            if kept is None:
                calls.append(CallDisposition(**base, disposition="failed"))
            else:
                n, receipt = kept
                calls.append(
                    CallDisposition(**base, disposition="prefix_cut", receipt=receipt, token_boundary=n)
                )
        return PrepareReport(calls=calls)

    def _freeze(self, fl: InFlightCall, base: _Base) -> tuple[InFlightCall, _Base, list[int], Plan]:
        """The swap: the call's tokens so far become its next prefix; an engine's request stops here
        and the rest is asked anew."""
        assert fl.plan is not None
        fl.cuts += 1
        self.backend.interrupt(fl.plan)
        return fl, base, list(fl.emitted), fl.plan

    async def _write(
        self, frozen: list[tuple[InFlightCall, _Base, list[int], Plan]]
    ) -> list[tuple[_Base, tuple[int, TokenReceipt] | None]]:
        """The frozen prefixes' records (one grouped transaction), then their ``model.prefix_cut``
        appends; each call's kept prefix, or None where its attempt is no longer current."""
        backend = self.backend
        receipts = await asyncio.gather(
            *(
                self.writes.put(
                    f"{fl.call_id}-p{len(tokens)}",
                    TokenRecord(
                        prompt_ids=plan.prompt_ids,
                        output_ids=tokens,
                        mask=[1] * len(tokens),
                        logprobs=plan.logprobs[: len(tokens)],
                        policy_version=backend.policy_version,
                        segments=fl.segments.close(len(tokens)) if fl.segments is not None else [],
                    ),
                )
                for fl, _, tokens, plan in frozen
            )
        )
        written = await asyncio.gather(
            *(
                self._fenced(
                    ModelCallPrefixCut(
                        **envelope("model", self.instance, fl.ident),
                        call_id=fl.call_id,
                        receipt=receipt,
                        token_boundary=len(tokens),
                        buffer_id=f"{fl.call_id}-b{fl.cuts}",
                    ),
                )
                for (fl, _, tokens, _), receipt in zip(frozen, receipts, strict=True)
            )
        )
        out: list[tuple[_Base, tuple[int, TokenReceipt] | None]] = []
        for (fl, base, tokens, _), receipt, ok in zip(frozen, receipts, written, strict=True):
            if ok:
                self.stats.inc("prefix_cuts")
                fl.durable = (len(tokens), receipt)
            out.append((base, (len(tokens), receipt) if ok else None))
        return out

    def _take_ahead(self) -> None:
        if self._ahead_task is None or self._ahead_task.done():
            self._ahead_task = asyncio.ensure_future(self.cut_ahead(self._prepares))

    async def cut_ahead(self, prepares: int | None = None) -> int:
        """Cut every running call now, admission open, as the next prepare would (:mod:`._ahead`);
        how many were cut. Nothing if a prepare came first (``prepares``: the count when this was
        scheduled), and nothing lost if a write fails: that prepare then cuts anew."""
        async with self._writing:
            if (prepares is not None and prepares != self._prepares) or not self.backend.can_cut:
                return 0
            frozen = [
                self._freeze(fl, _base(fl))
                for fl in list(self._calls.values())
                if fl.state == CallState.GENERATING
                and fl.emitted
                and (fl.durable is None or fl.durable[0] < len(fl.emitted))
            ]
            taken_at = asyncio.get_running_loop().time()
            try:
                kept = sum(k is not None for _, k in await self._write(frozen))
            except (RollcutError, OSError):
                return 0
            self._ahead_at = taken_at
            self.stats.inc("cuts_ahead", kept)
            return kept

    async def _fenced(self, event: Event) -> bool:
        """Append a cut's record of a call; False if its attempt is no longer current: a newer
        attempt holds the rollout, so this call's work is over (reported ``failed``: whatever it
        writes next is refused too), never a reason to fail the prepare (issue 49)."""
        try:
            await self.append(event)  # the service's append: a fence refusal comes back as a GymError
        except GymError as exc:
            if exc.kind not in (ErrorKind.STALE_ATTEMPT, ErrorKind.RETIRED):
                raise
            return False
        return True
