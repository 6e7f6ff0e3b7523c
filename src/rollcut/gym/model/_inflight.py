"""The model calls running in one worker, and the generation cut that settles them at a prepare.

At an aligned prepare every admitted call gets exactly one disposition. A call
that never started is ``never_started``; one that finished is ``completed``;
one that failed, ``failed``. A call that is generating has its active buffer
swapped: the tokens so far are frozen, written to the token store and recorded
as ``model.prefix_cut`` (the call goes on; a continuation resumes from that
prefix). A backend that cannot cut marks a running call ``excluded`` (it runs
again after a crash), never a false prefix.

:class:`InFlightCalls` owns the running calls and their cut; the model service
registers each call with it and hands it what a cut writes with (the backend,
the token writes, the append), so neither reaches into the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypedDict

from ...bus import Event, ModelCallExcluded, ModelCallPrefixCut, TokenReceipt
from ...participants import CallDisposition, PrepareReport
from ...tokens import TokenRecord, TokenWrites
from .._writes import envelope
from ..wire import ErrorKind, GymError, Identity
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


class InFlightCalls:
    """The calls running in one worker, by call id, and the cut that settles them."""

    def __init__(
        self,
        backend: Backend,
        writes: TokenWrites,
        append: Callable[[Event], Awaitable[int]],
        *,
        instance: str,
    ) -> None:
        self.backend = backend
        self.writes = writes
        self.append = append
        self.instance = instance
        self._calls: dict[str, InFlightCall] = {}
        self.prefix_cuts = 0

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
        running call."""
        backend = self.backend
        calls: list[CallDisposition] = []
        excluded: list[tuple[InFlightCall, _Base]] = []
        frozen: list[tuple[InFlightCall, _Base, list[int], Plan]] = []
        for fl in list(self._calls.values()):
            base = _Base(call_id=fl.call_id, rollout_id=fl.ident.rollout_id, attempt=fl.ident.attempt)
            if fl.state in (CallState.ADMITTING, CallState.QUEUED) or (
                fl.state == CallState.GENERATING and backend.can_cut and not fl.emitted
            ):
                calls.append(CallDisposition(**base, disposition="never_started"))
            elif fl.state == CallState.GENERATING and not backend.can_cut:
                excluded.append((fl, base))
            elif (
                fl.state == CallState.GENERATING
                and fl.durable is not None
                and fl.durable[0] == len(fl.emitted)
            ):
                # nothing generated since its last cut: that prefix still stands, and the request asked
                # anew then goes on untouched. A call whose re-prefill outlasts the checkpoint interval
                # (a real model on a CPU) is not aborted again and again, never to make progress
                n, receipt = fl.durable
                calls.append(
                    CallDisposition(**base, disposition="prefix_cut", receipt=receipt, token_boundary=n)
                )
            elif fl.state == CallState.GENERATING:
                assert fl.plan is not None
                frozen.append((fl, base, list(fl.emitted), fl.plan))  # the swap
                fl.cuts += 1
                backend.interrupt(fl.plan)  # an engine's request stops here; the rest is asked anew
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
        for (fl, base, tokens, _), receipt, ok in zip(frozen, receipts, written, strict=True):
            if not ok:
                calls.append(CallDisposition(**base, disposition="failed"))
                continue
            self.prefix_cuts += 1
            fl.durable = (len(tokens), receipt)
            calls.append(
                CallDisposition(**base, disposition="prefix_cut", receipt=receipt, token_boundary=len(tokens))
            )
        return PrepareReport(calls=calls)

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
