"""What a call's plan answers: the assistant message it returns (and the log keeps for reuse), and a
plan rebuilt from the log for a call answered again."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._backend import Plan
from ._bytes import decode

if TYPE_CHECKING:
    from ...replay import ModelCall
    from ...tokens import TokenRecord

__all__ = ["replayed_plan", "response_message"]


def replayed_plan(record: TokenRecord, call: ModelCall) -> Plan:
    """A plan rebuilt from the log and the token store: what the reused call returned, ended as it
    ended (a tool call, a stop string, the token limit)."""
    msg = call.response if isinstance(call.response, dict) else {}
    return Plan(
        prompt_ids=list(record.prompt_ids),
        output_ids=list(record.output_ids),
        logprobs=list(record.logprobs),
        finish_reason="tool_calls" if msg.get("tool_calls") else call.finish_reason,
        text=msg.get("content"),
        tool_calls=list(msg.get("tool_calls") or []),
        stop_sequence=call.stop_sequence,
    )


def response_message(plan: Plan, output_ids: list[int]) -> dict[str, Any]:
    """The assistant message a call returns (and the log keeps for reuse)."""
    complete = len(output_ids) == len(plan.output_ids)
    if plan.tool_calls and complete:
        return {"role": "assistant", "content": None, "tool_calls": plan.tool_calls}
    if (
        complete and plan.text is not None
    ):  # the backend's own text (an upstream's ids are not ours to decode)
        return {"role": "assistant", "content": plan.text}
    return {"role": "assistant", "content": decode(output_ids)}
