"""Generation cuts: at an aligned prepare, every admitted model call gets exactly one disposition.

A call that never started is ``never_started``; one that finished is
``completed``; one that failed, ``failed``. A call that is generating has its
active buffer swapped: the tokens so far are frozen, written to the token store
and recorded as ``model.prefix_cut`` (the call goes on; a continuation resumes
from that prefix). A backend that cannot cut marks a running call ``excluded``
(it runs again after a crash), never a false prefix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from ...bus import ModelCallExcluded, ModelCallPrefixCut
from ...participants import CallDisposition, ExportReport
from ...tokens import TokenRecord

if TYPE_CHECKING:
    from ._service import ModelService

__all__ = ["cut_in_flight"]


class _Base(TypedDict):
    call_id: str
    rollout_id: str
    attempt: int


async def cut_in_flight(service: ModelService, checkpoint_id: str) -> ExportReport:
    """Give every in-flight call one disposition; swap the buffers of running ones."""
    calls: list[CallDisposition] = []
    for fl in list(service._inflight.values()):
        base = _Base(call_id=fl.call_id, rollout_id=fl.ident.rollout_id, attempt=fl.ident.attempt)
        if fl.state in ("admitting", "queued") or (
            fl.state == "generating" and service.backend.can_cut and not fl.emitted
        ):
            calls.append(CallDisposition(**base, disposition="never_started"))
        elif fl.state == "generating" and not service.backend.can_cut:
            await service._append(
                ModelCallExcluded(
                    **service._ev(fl.ident),
                    call_id=fl.call_id,
                    reason=f"the {service.backend.name} backend cannot cut a running generation",
                )
            )
            calls.append(CallDisposition(**base, disposition="excluded"))
        elif fl.state == "generating":
            frozen = list(fl.emitted)  # the swap: no await between reading and recording the boundary
            fl.cuts += 1
            assert fl.plan is not None
            receipt = await service.writes.put(
                f"{fl.call_id}-p{len(frozen)}",
                TokenRecord(
                    prompt_ids=fl.plan.prompt_ids,
                    output_ids=frozen,
                    mask=[1] * len(frozen),
                    logprobs=fl.plan.logprobs[: len(frozen)],
                    policy_version=service.backend.policy_version,
                ),
            )
            await service._append(
                ModelCallPrefixCut(
                    **service._ev(fl.ident),
                    call_id=fl.call_id,
                    receipt=receipt,
                    token_boundary=len(frozen),
                    buffer_id=f"{fl.call_id}-b{fl.cuts}",
                )
            )
            service.stats["prefix_cuts"] += 1
            calls.append(
                CallDisposition(**base, disposition="prefix_cut", receipt=receipt, token_boundary=len(frozen))
            )
        elif fl.state == "done":
            calls.append(CallDisposition(**base, disposition="completed"))
        else:
            calls.append(CallDisposition(**base, disposition="failed"))
    return ExportReport(calls=calls)
