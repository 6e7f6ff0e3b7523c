"""The Simple Agent on NeMo Gym's contract: a run row in, the verify response out, over the Responses API.

``/run`` takes ``{responses_create_params, ...the environment's fields}``.
The loop is NeMo Gym's Simple Agent's: seed the session (its cookie rides on
every later resources call), call the model's ``/v1/responses`` with the
input plus every output so far, run each ``function_call`` against the
resources server and append its ``function_call_output``, until the model
answers without a call or ``max_steps``; then ``/verify`` with the final
``response`` (the last model response, its output replaced by every output
of the episode and its usage summed) and return what ``/verify`` returns.

rollcut's part is the same as in the chat loop: a boundary after every
completed turn (the outputs so far, the model calls' receipts, the
resources revisions), parking at boundaries, and continuation from the
last boundary below a cut, where re-issued operations are answered from the
log. The receipts ride out on the result as ``rollcut.model_calls`` so a
trainer can check every token array against the token store.
"""

from __future__ import annotations

from typing import Any

from ...bus import AgentBoundaryRecord
from ..resources import task_fields
from ..wire import ErrorKind, GymError
from ._loop import RunContext

__all__ = ["run_responses", "serve_responses"]

_MODE = "responses"


def _environment(resources: dict[str, str], fields: dict[str, Any]) -> str:
    env = fields.get("env")
    if env is None and len(resources) == 1:
        return next(iter(resources))
    if env not in resources:
        raise GymError(
            ErrorKind.BAD_REQUEST,
            f"name the environment (`env`) among {sorted(resources)}, got {env!r}",
        )
    return str(env)


def _sum_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return total
    if total is None:
        return dict(usage)
    out = dict(total)
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        out[key] = int(out.get(key) or 0) + int(usage.get(key) or 0)
    return out


async def run_responses(ctx: RunContext, body: dict[str, Any]) -> dict[str, Any]:
    """One attempt of a NeMo Gym run row; returns the verify response."""
    fields = task_fields(body)
    env = _environment(ctx.resources, fields)
    res_url = ctx.resources[env].rstrip("/")
    seeded = await ctx.send(f"{res_url}/seed_session", body, None)
    cookies = dict(seeded.cookies)
    response, calls, turn = await _episode(
        ctx, dict(body["responses_create_params"]), env, cookies, int(fields.get("max_steps", 8))
    )
    verdict = await ctx.send(f"{res_url}/verify", {**body, "response": response}, cookies)
    ctx.count("runs_finished")
    out: dict[str, Any] = verdict.json()
    out["rollcut"] = {"model_calls": calls, "turns": turn, "continued": ctx.start is not None}
    return out


async def serve_responses(ctx: RunContext, params: dict[str, Any]) -> dict[str, Any]:
    """NeMo Gym's agent ``/v1/responses``: the loop alone on a Responses request, in a session the
    caller seeded (as NeMo Gym's ``/run`` calls it between ``/seed_session`` and ``/verify``);
    returns the episode's Response (every output item, usage summed) with rollcut's receipts."""
    body = dict(params)
    env = _environment(ctx.resources, {"env": body.pop("env")} if "env" in body else {})
    max_steps = int(body.pop("max_steps", 8))
    response, calls, turn = await _episode(ctx, body, env, {}, max_steps)
    ctx.count("runs_finished")
    return {**response, "rollcut": {"model_calls": calls, "turns": turn, "continued": ctx.start is not None}}


async def _episode(
    ctx: RunContext, params: dict[str, Any], env: str, cookies: dict[str, str], max_steps: int
) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    """The loop: the model, then each of its function calls against the environment, until it answers
    without one or ``max_steps``; a boundary after every turn. Returns the episode's Response, the
    model calls' receipts and the turns taken."""
    start = ctx.start
    res_url, model = ctx.resources[env].rstrip("/"), ctx.model_url.rstrip("/")
    if not params.get("tools"):
        schemas = (await ctx.http.get(f"{res_url}/tools")).json()
        params["tools"] = [{"type": "function", **t["function"]} for t in schemas]
    given = params.get("input") or []
    inputs: list[Any] = [{"role": "user", "content": given}] if isinstance(given, str) else list(given)
    state = start.agent_state if start is not None and isinstance(start.agent_state, dict) else {}
    resumed = start is not None and state.get("mode") == _MODE and bool(start.output_items)
    if start is not None:
        ctx.count("runs_continued")
    outputs: list[Any] = list(start.output_items) if resumed and start else []
    turn = start.turn if resumed and start else 0
    calls: list[dict[str, Any]] = list(state.get("model_calls") or []) if resumed else []
    revisions = dict(start.resources_revisions) if resumed and start else {}
    usage: dict[str, Any] | None = dict(state["usage"]) if resumed and state.get("usage") else None
    last: dict[str, Any] = {}
    while turn < max_steps:
        ctx.check_retired()
        last = await ctx.chat(f"{model}/v1/responses", {**params, "input": inputs + outputs})
        items = list(last.get("output") or [])
        outputs.extend(items)
        usage = _sum_usage(usage, last.get("usage"))
        ext = last.get("rollcut") or {}
        if ext:
            calls.append(
                {k: ext[k] for k in ("call_id", "receipt_id", "receipt_digest", "receipt_count") if k in ext}
            )
        function_calls = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call"]
        if not function_calls:
            break
        asked = [(c["name"], c.get("arguments"), c["call_id"]) for c in function_calls]
        for call_id, output in await ctx.answer_tools(res_url, asked, revisions, env, cookies):
            outputs.append({"type": "function_call_output", "call_id": call_id, "output": output})
        turn += 1
        await ctx.boundary(
            AgentBoundaryRecord(
                turn=turn,
                output_items=outputs,
                usage={k: int(v) for k, v in (usage or {}).items() if isinstance(v, int)},
                last_model_call_id=calls[-1]["call_id"] if calls else None,
                resources_revisions=revisions,
                agent_state={"env": env, "mode": _MODE, "model_calls": calls, "usage": usage},
            ),
        )
    response = {**last, "output": outputs, "usage": usage}
    response.pop("rollcut", None)
    return response, calls, turn
