"""NeMo Gym's server contracts, spoken by rollcut's servers beside rollcut's own.

Shapes (field names, routes, the session cookie, ``_ng_*`` identity with
0-based attempts, the ``/ng-rollout/<id>[-a<n>]`` prefix, verify and
aggregate-metrics bodies) are taken from NeMo Gym's public repository; the
recorded example bodies are in ``nemo_bodies.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

from rollcut.bus import AgentBoundary, EventLog, ModelCallCompleted, ModelCallReused, ResourcesMutated
from rollcut.gym.resources import Counter, MathVerifier, pass_at_k
from rollcut.gym.wire import SESSION_COOKIE

from .conftest import Stack
from .nemo_bodies import COUNTER_ROW, VERIFY_RESPONSES, with_identity


def _without_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in i.items() if k != "id"} for i in items]


async def test_a_nemo_run_row_runs_over_the_responses_api_and_returns_the_verify_response(
    log: EventLog, stack: Any
) -> None:
    s: Stack = await stack()
    await log.dispatch("0-0", COUNTER_ROW, instance="collector")
    resp = await s.client.post("/run", json=with_identity(COUNTER_ROW, "0-0", attempt_index=0))
    assert resp.status_code == 200, resp.text
    out = resp.json()
    # the verify response: the row, the whole response, the reward, the environment's verdict
    assert out["responses_create_params"] == COUNTER_ROW["responses_create_params"]
    assert out["reward"] == 1.0 and out["passed"] is True and out["_ng_task_index"] == 0
    items = out["response"]["output"]
    kinds = [i["type"] for i in items]
    assert kinds.count("function_call") == 3 and kinds.count("function_call_output") == 3
    assert kinds[-1] == "message"
    for item in items:  # every model-made item parses as OpenAI's and carries its training data
        if item["type"] == "function_call":
            ResponseFunctionToolCall.model_validate(item)
        elif item["type"] == "message":
            ResponseOutputMessage.model_validate(item)
        if item["type"] != "function_call_output":
            assert len(item["generation_token_ids"]) == len(item["generation_log_probs"]) > 0
    calls = [e async for e in log.read(rollout_id="0-0") if isinstance(e.event, ModelCallCompleted)]
    assert [c.event.call_id for c in calls] == [c["call_id"] for c in out["rollcut"]["model_calls"]]
    boundaries = [e.event async for e in log.read(rollout_id="0-0") if isinstance(e.event, AgentBoundary)]
    assert [b.record.turn for b in boundaries] == [1, 2, 3]


async def test_a_continued_nemo_attempt_repeats_nothing_and_ends_the_same(log: EventLog, stack: Any) -> None:
    s: Stack = await stack()
    await log.dispatch("1-0", COUNTER_ROW, instance="collector")
    first = (await s.client.post("/run", json=with_identity(COUNTER_ROW, "1-0", attempt_index=0))).json()
    events = [e async for e in log.read(rollout_id="1-0", attempt=1)]
    cut = next(e.seq for e in events if isinstance(e.event, ResourcesMutated) and e.event.revision == 2)
    await log.supersede("1-0", 1, instance="coordinator", from_cut=cut)
    generated, executed = s.model.stats["calls_generated"], s.resources.stats["tool_calls_executed"]
    second = (await s.client.post("/run", json=with_identity(COUNTER_ROW, "1-0", attempt_index=1))).json()
    assert second["reward"] == first["reward"] and second["value"] == first["value"]
    # the same episode; only the regenerated answer's item id differs (it names its call, which names
    # its attempt)
    assert _without_ids(second["response"]["output"]) == _without_ids(first["response"]["output"])
    assert second["rollcut"]["continued"] is True
    a2 = [e.event async for e in log.read(rollout_id="1-0", attempt=2)]
    # every call attempt 1 completed (below the cut, or after it for the very same request) is served
    # from the log; only turn 3's tool call runs again (the environment continues from the cut)
    assert len([e for e in a2 if isinstance(e, ModelCallReused)]) == 3
    assert s.model.stats["calls_generated"] - generated == 0
    assert s.resources.stats["tool_calls_served_from_log"] == 1  # turn 2's tool call, from the log
    assert s.resources.stats["tool_calls_executed"] - executed == 1


async def test_identities_that_disagree_are_refused(log: EventLog, stack: Any) -> None:
    s: Stack = await stack()
    await log.dispatch("2-0", COUNTER_ROW, instance="collector")
    body = with_identity(COUNTER_ROW, "2-0", attempt_index=1)  # attempt 2 in the body
    resp = await s.client.post("/run", json=body, headers={"x-rollout-id": "2-0", "x-rollout-attempt": "1"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "bad_identity"
    assert "conflicting identity" in resp.json()["error"]["message"]


async def test_the_session_cookie_carries_a_nemo_session_through_tools_and_verify(
    log: EventLog, stack: Any
) -> None:
    s: Stack = await stack()
    res = s.agent.http  # the in-process resources server, as NeMo Gym's agent calls it
    await log.dispatch("3-0", COUNTER_ROW, instance="collector")
    row = with_identity(COUNTER_ROW, "3-0", attempt_index=0)
    seeded = await res.post("http://res/seed_session", json=row)
    assert seeded.status_code == 200 and seeded.cookies[SESSION_COOKIE] == "3-0:1"
    res.cookies.clear()  # the session goes along only where the test sends it
    jar = {"cookie": f"{SESSION_COOKIE}={seeded.cookies[SESSION_COOKIE]}"}
    added = await res.post("http://res/add", json={"n": 4}, headers=jar)
    assert added.status_code == 200 and added.json()["result"] == {"value": 7}
    response = {
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "7"}]}
        ]
    }
    verified = await res.post("http://res/verify", json={**row, "response": response}, headers=jar)
    assert verified.status_code == 200
    body = verified.json()
    assert body["response"] == response and body["responses_create_params"] == row["responses_create_params"]
    assert body["value"] == 7 and isinstance(body["reward"], float)
    no_session = await res.post("http://res/add", json={"n": 1})
    assert no_session.status_code == 400 and no_session.json()["error"]["code"] == "missing_identity"


async def test_aggregate_metrics_has_nemo_gyms_shape(stack: Any) -> None:
    s: Stack = await stack()
    out = (
        await s.agent.http.post("http://res/aggregate_metrics", json={"verify_responses": VERIFY_RESPONSES})
    ).json()
    assert set(out) == {"group_level_metrics", "agent_metrics", "key_metrics"}
    assert out["agent_metrics"]["mean/reward"] == 0.5
    assert out["key_metrics"] == {
        "mean/reward": 0.5,
        "pass@2/accuracy": 50.0,
        "pass@1[avg-of-2]/accuracy": 50.0,
    }
    assert [g["_ng_task_index"] for g in out["group_level_metrics"]] == [0, 1]
    assert out["group_level_metrics"][1]["mean/reward"] == 0.0
    bad = await s.agent.http.post("http://res/aggregate_metrics", json={"verify_responses": "nope"})
    assert bad.status_code == 400
    # the counter's verification reads its session, gone once the episode ends: no reverification
    assert (await s.agent.http.get("http://res/reverify_mode")).json() == "unsupported"


def test_pass_at_k_is_nemo_gyms_estimate_binary_and_the_best_of_k_continuous() -> None:
    # one task of 4 binary rollouts, 1 correct: pass@1 = 1 - C(3,1)/C(4,1), pass@2 = 1 - C(3,2)/C(4,2), ...
    binary = pass_at_k([[0.0, 1.0, 0.0, 0.0]])
    assert binary["pass@1/accuracy"] == pytest.approx(25.0) and binary["pass@2/accuracy"] == pytest.approx(
        50.0
    )
    assert binary["pass@4/accuracy"] == 100.0 and binary["pass@1[avg-of-2]/accuracy"] == 50.0
    # continuous rewards: the best of the first k; a task with fewer rollouts counts only up to its own
    mixed = pass_at_k([[0.2, 0.7, 0.4], [0.5]])
    assert mixed["pass@1/accuracy"] == pytest.approx(35.0) and mixed["pass@2/accuracy"] == pytest.approx(70.0)
    assert mixed["pass@1[avg-of-3]/accuracy"] == pytest.approx(100 * ((0.2 + 0.7 + 0.4) / 3 + 0.5) / 2)


def test_reverify_mode_follows_what_verification_reads() -> None:
    assert MathVerifier().reverify_mode == "stateless" and Counter().reverify_mode == "unsupported"


async def test_an_id_that_is_not_a_subject_token_is_refused_before_anything_is_read(stack: Any) -> None:
    s: Stack = await stack()
    for bad in ("a.b", "*", ">", "a b", "../../etc", "x" * 129):
        resp = await s.client.post(
            "/run", json=with_identity(COUNTER_ROW, "0-0", attempt_index=0) | {"_ng_rollout_id": bad}
        )
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "bad_identity", bad
    negative = await s.client.post("/run", json=with_identity(COUNTER_ROW, "0-0", attempt_index=-1))
    assert negative.status_code == 400


async def test_the_agents_own_v1_responses_runs_the_loop_in_a_session_the_caller_seeded(
    log: EventLog, stack: Any
) -> None:
    """NeMo Gym's /run calls its agent's /v1/responses between /seed_session and /verify; a harness
    doing the same gets the episode's Response, under its attempt like /run, and the session's
    tools ran on the resources server."""
    s: Stack = await stack()
    await log.dispatch("5-0", COUNTER_ROW, instance="collector")
    ident = {"x-rollout-id": "5-0", "x-rollout-attempt": "1"}
    seeded = await s.agent.http.post("http://res/seed_session", json=COUNTER_ROW, headers=ident)
    assert seeded.status_code == 200, seeded.text
    params = COUNTER_ROW["responses_create_params"]
    resp = await s.client.post("/v1/responses", json=params, headers=ident)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    # NeMo Gym's Response of an episode (NeMoGymResponse): the function call outputs among its items
    kinds = [i["type"] for i in out["output"]]
    assert kinds.count("function_call") == kinds.count("function_call_output") == 3
    assert ResponseOutputMessage.model_validate(out["output"][-1]).content and out["object"] == "response"
    mutated = [e async for e in log.read(rollout_id="5-0") if isinstance(e.event, ResourcesMutated)]
    assert len(mutated) == 3 and len(out["rollcut"]["model_calls"]) == 4
    verdict = await s.agent.http.post(
        "http://res/verify", json={**COUNTER_ROW, "response": out}, headers=ident
    )
    assert verdict.json()["reward"] == 1.0
    # the same attempt again is refused as /run's would be: one run per attempt
    again = await s.client.post("/v1/responses", json=params, headers=ident)
    assert again.status_code == 409 and again.json()["error"]["code"] == "attempt_in_use"
    no_input = await s.client.post("/v1/responses", json={"model": "x"}, headers=ident)
    assert no_input.status_code == 400


async def test_the_agents_aggregate_metrics_are_the_resources_servers(stack: Any) -> None:
    s: Stack = await stack()
    body = {"verify_responses": VERIFY_RESPONSES}
    there = (await s.agent.http.post("http://res/aggregate_metrics", json=body)).json()
    assert (await s.client.post("/aggregate_metrics", json=body)).json() == there
    assert (await s.client.post("/aggregate_metrics", json={"verify_responses": 1})).status_code == 400
