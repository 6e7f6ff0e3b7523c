"""One synthetic agent turn as the log holds it: the benchmarks' shared workload piece.

A completed model call, the tool mutation it led to and the agent's boundary
after it, all of attempt 1 of one rollout, written by the instances the
benchmarks register (``model-0``, ``res-0``, ``agent-0``). ``bench log`` fills
them with random text (and puts the call's admission first); ``bench
checkpoint`` with small fixed values.
"""

from __future__ import annotations

from typing import Any

from ..bus import (
    AgentBoundary,
    AgentBoundaryRecord,
    Event,
    ModelCallAdmitted,
    ModelCallCompleted,
    ResourcesMutated,
    TokenReceipt,
)

__all__ = ["turn_events"]


def _of(component: str, rid: str) -> dict[str, Any]:
    instance = {"model": "model-0", "resources": "res-0", "agent": "agent-0"}[component]
    return {"component": component, "instance": instance, "rollout_id": rid, "attempt": 1}


def turn_events(
    rid: str,
    t: int,
    *,
    call: str,
    receipt: TokenReceipt,
    content: str,
    tool: tuple[str, dict[str, Any], Any],
    outputs: list[Any],
    usage: dict[str, int],
    digest: str = "ab" * 8,
    parent: str | None = None,
    admitted: bool = False,
    delta: Any = None,
) -> list[Event]:
    """Turn ``t`` of rollout ``rid``: (the admission,) the completion, the mutation (``tool`` is its
    name, arguments and result), the boundary."""
    name, arguments, result = tool
    out: list[Event] = []
    if admitted:
        out.append(
            ModelCallAdmitted(**_of("model", rid), call_id=call, request_digest=digest, parent_call_id=parent)
        )
    out += [
        ModelCallCompleted(
            **_of("model", rid),
            call_id=call,
            request_digest=digest,
            receipt=receipt,
            response={"role": "assistant", "content": content},
        ),
        ResourcesMutated(
            **_of("resources", rid),
            session="env",
            revision=t + 1,
            tool=name,
            arguments=arguments,
            result=result,
            delta=delta,
        ),
        AgentBoundary(
            **_of("agent", rid),
            record=AgentBoundaryRecord(
                turn=t,
                output_items=outputs,
                usage=usage,
                last_model_call_id=call,
                resources_revisions={"env": t + 1},
            ),
        ),
    ]
    return out
