"""Generation cuts: at an aligned prepare, every admitted model call gets exactly one disposition.

A call that never started is ``never_started``; one that finished is
``completed``; one that failed, ``failed``. A call that is generating has its
active buffer swapped: the tokens so far are frozen, written to the token store
and recorded as ``model.prefix_cut`` (the call goes on; a continuation resumes
from that prefix). A backend that cannot cut marks a running call ``excluded``
(it runs again after a crash), never a false prefix.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, TypedDict

from ...bus import ModelCallExcluded, ModelCallPrefixCut
from ...participants import CallDisposition, ExportReport
from ...tokens import TokenRecord

if TYPE_CHECKING:
    from ._local import Plan
    from ._service import ModelService, _InFlight

__all__ = ["cut_in_flight"]


class _Base(TypedDict):
    call_id: str
    rollout_id: str
    attempt: int


async def cut_in_flight(service: ModelService, checkpoint_id: str) -> ExportReport:
    """Give every in-flight call one disposition; swap the buffers of running ones.

    Every swap happens in one synchronous pass (no await between reading one call's boundary and
    the next), so all cuts are taken at the same instant; their records are then written together,
    one grouped token-store transaction and concurrent appends, not one fsync per running call."""
    calls: list[CallDisposition] = []
    excluded: list[tuple[_InFlight, _Base]] = []
    frozen: list[tuple[_InFlight, _Base, list[int], Plan]] = []
    for fl in list(service._inflight.values()):
        base = _Base(call_id=fl.call_id, rollout_id=fl.ident.rollout_id, attempt=fl.ident.attempt)
        if fl.state in ("admitting", "queued") or (
            fl.state == "generating" and service.backend.can_cut and not fl.emitted
        ):
            calls.append(CallDisposition(**base, disposition="never_started"))
        elif fl.state == "generating" and not service.backend.can_cut:
            excluded.append((fl, base))
        elif fl.state == "generating":
            assert fl.plan is not None
            frozen.append((fl, base, list(fl.emitted), fl.plan))  # the swap
            fl.cuts += 1
            service.backend.interrupt(fl.plan)  # an engine's request stops here; the rest is asked anew
        elif fl.state == "done":
            calls.append(CallDisposition(**base, disposition="completed"))
        else:
            calls.append(CallDisposition(**base, disposition="failed"))
    reason = f"the {service.backend.name} backend cannot cut a running generation"
    await asyncio.gather(
        *(
            service._append(ModelCallExcluded(**service._ev(fl.ident), call_id=fl.call_id, reason=reason))
            for fl, _ in excluded
        )
    )
    calls += [CallDisposition(**base, disposition="excluded") for _, base in excluded]
    receipts = await asyncio.gather(
        *(
            service.writes.put(
                f"{fl.call_id}-p{len(tokens)}",
                TokenRecord(
                    prompt_ids=plan.prompt_ids,
                    output_ids=tokens,
                    mask=[1] * len(tokens),
                    logprobs=plan.logprobs[: len(tokens)],
                    policy_version=service.backend.policy_version,
                ),
            )
            for fl, _, tokens, plan in frozen
        )
    )
    await asyncio.gather(
        *(
            service._append(
                ModelCallPrefixCut(
                    **service._ev(fl.ident),
                    call_id=fl.call_id,
                    receipt=receipt,
                    token_boundary=len(tokens),
                    buffer_id=f"{fl.call_id}-b{fl.cuts}",
                )
            )
            for (fl, _, tokens, _), receipt in zip(frozen, receipts, strict=True)
        )
    )
    service.stats["prefix_cuts"] += len(frozen)
    calls += [
        CallDisposition(**base, disposition="prefix_cut", receipt=receipt, token_boundary=len(tokens))
        for (_, base, tokens, _), receipt in zip(frozen, receipts, strict=True)
    ]
    return ExportReport(calls=calls)
