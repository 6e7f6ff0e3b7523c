"""The Simple Agent's chat loop: rollcut's task rows over chat completions.

Seed the resources session, call the policy model, run each tool call against
the resources server, append the outputs, until the model answers without tool
calls or ``max_steps``; then ``/verify`` and close. After every completed
nonterminal turn it records a boundary (the messages so far, usage, the last
model call, the resources revisions), and a continued attempt starts from the
lineage's last boundary.
"""

from __future__ import annotations

from typing import Any

from ...bus import AgentBoundaryRecord
from ._loop import RunContext

__all__ = ["run_chat"]


_MODEL_PARAMS = ("tool_choice", "temperature", "top_p", "seed", "logit_bias", "response_format")


def _model_params(task: dict[str, Any]) -> dict[str, Any]:
    """The sampling and structured-output settings a task row asks of every model call (a base model
    on an engine is held to tool calls with ``tool_choice``: docs/engines.md)."""
    given = task.get("model_params") or {}
    return {k: given[k] for k in _MODEL_PARAMS if k in given}


async def run_chat(ctx: RunContext, task: dict[str, Any]) -> dict[str, Any]:
    """One attempt of a rollcut task row; returns the reward, the verdict and the episode's figures."""
    start = ctx.start
    env = task["env"]
    res_url = ctx.resources[env].rstrip("/")
    model = ctx.model_url.rstrip("/")
    await ctx.post(f"{res_url}/seed_session", task.get("seed", {}))
    tools = (await ctx.http.get(f"{res_url}/tools")).json()
    if start is not None:
        ctx.count("runs_continued")
    if start is not None and start.output_items:
        messages: list[dict[str, Any]] = list(start.output_items)
        turn, usage = start.turn, dict(start.usage)
        revisions, last_call = dict(start.resources_revisions), start.last_model_call_id
    else:
        messages = [
            {"role": "system", "content": ctx.system_prompt},
            {"role": "user", "content": task["prompt"]},
        ]
        turn, usage, revisions, last_call = 0, {"input_tokens": 0, "output_tokens": 0}, {}, None
    answer = ""
    max_steps = int(task.get("max_steps", 8))
    while turn < max_steps:
        ctx.check_retired()
        out = await ctx.chat(
            f"{model}/v1/chat/completions",
            {
                "messages": messages,
                "tools": tools,
                "max_tokens": task.get("max_tokens", 256),
                **_model_params(task),
            },
        )
        msg = out["choices"][0]["message"]
        messages.append(msg)
        last_call = out.get("rollcut", {}).get("call_id", last_call)
        usage["input_tokens"] += out["usage"]["prompt_tokens"]
        usage["output_tokens"] += out["usage"]["completion_tokens"]
        if not msg.get("tool_calls"):
            answer = msg.get("content") or ""
            break
        calls = [
            (tc["function"]["name"], tc["function"].get("arguments"), tc["id"]) for tc in msg["tool_calls"]
        ]
        for call_id, answer in await ctx.answer_tools(res_url, calls, revisions, env):
            messages.append({"role": "tool", "tool_call_id": call_id, "content": answer})
        turn += 1
        await ctx.boundary(
            AgentBoundaryRecord(
                turn=turn,
                output_items=messages,
                usage=usage,
                last_model_call_id=last_call,
                resources_revisions=revisions,
                agent_state={"env": env},
            )
        )
    verdict = await ctx.post(f"{res_url}/verify", {**task.get("verify", {}), "answer": answer})
    await ctx.post(f"{res_url}/close_session", {})
    ctx.count("runs_finished")
    return {
        "reward": verdict.get("reward", 0.0),
        "verified": verdict,
        "turns": turn,
        "answer": answer,
        "usage": usage,
        "continued": start is not None,
    }
