"""Durable custody of model calls, through the HTTP surface, on the real bus."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from rollcut.bus import EventLog, ModelCallAdmitted, ModelCallCompleted, ModelCallReused
from rollcut.gym.model import decode

from ..helpers import until
from .conftest import TOOLS, ModelRig


async def _events(rig: ModelRig, rollout_id: str) -> list[Any]:
    return [s async for s in rig.log.read(rollout_id=rollout_id) if s.event.component == "model"]


async def test_non_streamed_call_has_admitted_then_completed_custody(rig: ModelRig) -> None:
    await rig.log.dispatch("r1", {"q": 1}, instance="collector")
    body = {"model": "rollcut-local", "messages": [{"role": "user", "content": "hello"}]}
    resp = await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1"))
    assert resp.status_code == 200, resp.text
    out = resp.json()
    ext = out["rollcut"]
    evs = await _events(rig, "r1")
    kinds = [type(s.event) for s in evs]
    assert kinds == [ModelCallAdmitted, ModelCallCompleted]
    admitted, completed = evs[0], evs[1]
    assert admitted.seq < completed.seq and completed.event.call_id == out["id"] == ext["call_id"]
    assert completed.event.receipt.receipt_id == ext["receipt_id"]
    record = rig.tokens.get(completed.event.receipt)
    msg = out["choices"][0]["message"]
    assert record.output_ids == msg["generation_token_ids"] and record.prompt_ids == msg["prompt_token_ids"]
    assert decode(record.output_ids) == out["choices"][0]["message"]["content"]
    assert len(record.logprobs) == len(record.output_ids) == out["usage"]["completion_tokens"]


async def test_streamed_call_has_the_same_custody_and_content(rig: ModelRig) -> None:
    await rig.log.dispatch("r1", {}, instance="collector")
    await rig.log.dispatch("r2", {}, instance="collector")
    body = {"messages": [{"role": "user", "content": "stream me"}]}
    plain = (await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1"))).json()
    async with rig.client.stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=rig.headers("r2")
    ) as resp:
        assert resp.status_code == 200
        lines = [ln async for ln in resp.aiter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == plain["choices"][0]["message"]["content"]
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] == "stop"
    completed = [s.event for s in await _events(rig, "r2") if isinstance(s.event, ModelCallCompleted)]
    assert [c.call_id for c in completed] == [final["rollcut"]["call_id"]]
    assert completed[0].receipt.receipt_id == final["rollcut"]["receipt_id"]


async def test_lineage_across_three_chained_calls(rig: ModelRig) -> None:
    await rig.log.dispatch("r1", {}, instance="collector")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add three times"}]
    ids = []
    for _ in range(3):
        out = (
            await rig.client.post(
                "/v1/chat/completions", json={"messages": messages, "tools": TOOLS}, headers=rig.headers("r1")
            )
        ).json()
        msg = out["choices"][0]["message"]
        ids.append(out["id"])
        messages += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "ok"}]
    completed = [s.event for s in await _events(rig, "r1") if isinstance(s.event, ModelCallCompleted)]
    assert [c.call_id for c in completed] == ids
    assert [c.parent_call_id for c in completed] == [None, ids[0], ids[1]]
    assert rig.tokens.chain(ids[2]) == ids


async def test_stale_attempt_is_refused_and_generates_nothing(rig: ModelRig) -> None:
    await rig.log.dispatch("r1", {}, instance="collector")
    await rig.log.supersede("r1", 1, instance="coordinator")
    before = dict(rig.service.stats)
    resp = await rig.client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}]},
        headers=rig.headers("r1", 1),
    )
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "stale_attempt"
    assert "attempt 2 is current" in resp.json()["error"]["message"]
    assert rig.service.stats["tokens_generated"] == before["tokens_generated"]
    assert await _events(rig, "r1") == []


async def test_call_without_identity_is_refused(rig: ModelRig) -> None:
    resp = await rig.client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
    )
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "missing_identity"


async def test_closed_admission_answers_503_with_retry_after(rig: ModelRig) -> None:
    await rig.log.dispatch("r1", {}, instance="collector")
    rig.participant.gate.close("ck-test", until=asyncio.get_running_loop().time() + 10)
    resp = await rig.client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}]},
        headers=rig.headers("r1"),
    )
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "admission_closed"
    assert int(resp.headers["retry-after"]) >= 1


async def test_a_streamed_call_refused_at_admission_is_a_503_not_an_error_in_a_stream(rig: ModelRig) -> None:
    """A refusal before the call ran must be an HTTP answer a client can retry on; inside a 200 stream
    the openai SDK raises it to the agent instead. The end of a refused call used to race its first
    token, and often won (an opaque agent's relay, which retries 503s, met it in the stream)."""
    await rig.log.dispatch("r1", {}, instance="collector")
    rig.participant.gate.close("ck-test", until=asyncio.get_running_loop().time() + 10)
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
    for _ in range(20):
        resp = await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1"))
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "admission_closed", resp.text


async def test_repeated_call_after_restore_is_served_from_the_log(rig: ModelRig) -> None:
    await rig.log.dispatch("r1", {}, instance="collector")
    body = {"messages": [{"role": "user", "content": "expensive"}], "tools": TOOLS}
    first = (await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1"))).json()
    res = await rig.coordinator.checkpoint(deadline_s=5)
    await rig.log.supersede(
        "r1", 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=res.record.cut
    )
    generated = rig.service.stats["tokens_generated"]
    again = (await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1", 2))).json()
    assert again["rollcut"]["served_from_log"] is True
    assert rig.service.stats["tokens_generated"] == generated  # zero tokens generated
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    assert (
        again["choices"][0]["message"]["generation_token_ids"]
        == first["choices"][0]["message"]["generation_token_ids"]
    )
    reused = [s.event for s in await _events(rig, "r1") if isinstance(s.event, ModelCallReused)]
    assert [(r.attempt, r.source_call_id, r.source_attempt) for r in reused] == [(2, first["id"], 1)]


async def test_responses_route_speaks_the_responses_shape(rig: ModelRig) -> None:
    await rig.log.dispatch("r1", {}, instance="collector")
    tools = [
        {
            "type": "function",
            "name": "add",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
        }
    ]
    out = (await rig.client.post("/r/r1/1/v1/responses", json={"input": "add", "tools": tools})).json()
    assert out["object"] == "response" and out["output"][0]["type"] == "function_call"
    assert out["output"][0]["name"] == "add" and json.loads(out["output"][0]["arguments"])["n"] >= 1
    assert out["usage"]["output_tokens"] == len(out["output"][0]["generation_token_ids"])


async def test_call_for_an_undispatched_rollout_is_refused_clearly(rig: ModelRig) -> None:
    resp = await rig.client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}]},
        headers=rig.headers("ghost"),
    )
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "unknown_rollout"
    assert "never dispatched" in resp.json()["error"]["message"]


async def test_verify_command_catches_a_corrupted_token_record(
    rig: ModelRig, nats_url: str, namespace: str, tmp_path: Any
) -> None:
    import subprocess
    import sys

    await rig.log.dispatch("r1", {}, instance="collector")
    out = (
        await rig.client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "q"}]},
            headers=rig.headers("r1"),
        )
    ).json()
    res = await rig.coordinator.checkpoint(deadline_s=5)
    cmd = [
        sys.executable,
        "-m",
        "rollcut",
        "checkpoints",
        "verify",
        res.record.checkpoint_id,
        "--url",
        nats_url,
        "--namespace",
        namespace,
        "--ledger",
        str(tmp_path / "ledger"),
        "--tokens",
        str(tmp_path / "tokens"),
    ]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    key = out["rollcut"]["receipt_id"].encode()
    with rig.tokens.env.begin(write=True) as txn:  # bit rot in the stored tokens of that call
        v = bytearray(txn.get(key, db=rig.tokens._records))
        v[-1] ^= 0x10
        txn.put(key, bytes(v), db=rig.tokens._records)
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert out["rollcut"]["receipt_id"] in bad.stderr + bad.stdout


async def _in_flight(rig: ModelRig, body: dict[str, Any]) -> asyncio.Future[Any]:
    rig.service.backend.token_delay_s = 0.05  # long enough to be caught mid-generation
    call = asyncio.ensure_future(
        rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1"))
    )
    await until(
        lambda: any(len(f.emitted) >= 3 for f in rig.service._inflight.values()),
        timeout=30,
        what="tokens flowing",
    )
    return call


async def test_a_prepare_reply_that_omits_an_admitted_call_quarantines_its_rollout(rig: ModelRig) -> None:
    """Fail closed for the rollout, never for the namespace (issue 29): the checkpoint publishes, and
    the rollout whose call the reply did not account for starts over from its input."""
    from rollcut import CheckpointFailedError
    from rollcut.participants import PrepareReport, plan_recovery

    await rig.log.dispatch("r1", {}, instance="collector")
    call = await _in_flight(rig, {"messages": [{"role": "user", "content": "long"}]})

    async def forgetful(checkpoint_id: str) -> PrepareReport:
        return PrepareReport(calls=[])  # says nothing about the running call

    rig.participant.hooks = type(
        "H", (), {"prepare": staticmethod(forgetful), "restore": rig.service.restore}
    )()
    with pytest.raises(CheckpointFailedError, match="prepare reply omits it"):  # once: it might resolve
        await rig.coordinator.checkpoint(deadline_s=5)
    assert rig.coordinator.ledger.checkpoints() == []
    result = await rig.coordinator.checkpoint(deadline_s=5)
    assert (
        list(result.record.quarantined) == ["r1"]
        and "prepare reply omits it" in result.record.quarantined["r1"]
    )
    rig.service.backend.token_delay_s = 0.0
    assert (await call).status_code == 200
    plan = await plan_recovery(rig.log, rig.coordinator.ledger, ["r1"])
    assert plan.fresh_dispatch == ["r1"] and plan.continue_ == [] and "r1" in plan.quarantined
    assert plan.reuse_completed == set()  # a quarantined rollout's earlier calls are not served again


async def test_a_prepare_reply_with_a_receipt_the_store_lacks_quarantines_its_rollout(rig: ModelRig) -> None:
    from rollcut import CheckpointFailedError
    from rollcut.bus import TokenReceipt
    from rollcut.participants import CallDisposition, PrepareReport

    await rig.log.dispatch("r1", {}, instance="collector")
    call = await _in_flight(rig, {"messages": [{"role": "user", "content": "long"}]})
    real_cut = rig.service.cut

    async def forged(checkpoint_id: str) -> PrepareReport:
        report = await real_cut(checkpoint_id)
        bad = [
            CallDisposition(
                **{
                    **msgspec.structs.asdict(c),
                    "receipt": TokenReceipt(receipt_id="forged", count=1, digest="0" * 32),
                }
            )
            for c in report.calls or []
        ]
        return PrepareReport(calls=bad)

    rig.participant.hooks = type("H", (), {"prepare": staticmethod(forged), "restore": rig.service.restore})()
    with pytest.raises(CheckpointFailedError, match="does not match the token store"):
        await rig.coordinator.checkpoint(deadline_s=5)
    result = await rig.coordinator.checkpoint(deadline_s=5)
    assert "does not match the token store" in result.record.quarantined["r1"]
    rig.service.backend.token_delay_s = 0.0
    assert (await call).status_code == 200


async def test_the_same_call_three_times_in_one_attempt_is_generated_once(rig: ModelRig) -> None:
    await rig.log.dispatch("r-same", {}, instance="collector")
    body = {"messages": [{"role": "user", "content": "once, please"}]}

    async def call() -> dict[str, Any]:
        resp = await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r-same"))
        assert resp.status_code == 200, resp.text
        out: dict[str, Any] = resp.json()
        return out

    first, second = await asyncio.gather(call(), call())  # concurrent: the second joins the first
    third = await call()  # after: answered from what it produced
    assert first["id"] == second["id"] == third["id"]
    assert first["choices"] == second["choices"] == third["choices"]
    kinds = [type(s.event) for s in await _events(rig, "r-same")]
    assert kinds == [ModelCallAdmitted, ModelCallCompleted]  # one generation, on the log once
    assert rig.service.stats["calls_generated"] == 1 and rig.service.stats["calls_joined"] == 2


async def test_a_full_stream_answers_503_stores_nothing_and_the_retry_goes_through(rig: ModelRig) -> None:
    """The stream at its byte limit (discard new) refuses the call's admission: the caller gets a
    retryable 503 in OpenAI's shape, not a 500; once room is made the same call is served."""
    await rig.log.dispatch("r1", {}, instance="collector")
    js = rig.log.nc.jetstream()
    info = await js.stream_info(rig.log.stream)
    room, cfg = info.config.max_bytes, info.config
    cfg.max_bytes = info.state.bytes + 16
    await js.update_stream(cfg)
    before = await rig.log.last_seq()
    body = {"messages": [{"role": "user", "content": "hello"}]}
    resp = await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1"))
    assert resp.status_code == 503 and resp.headers["retry-after"] == "30", resp.text
    assert resp.json()["error"]["code"] == "storage_unavailable"
    assert "maximum bytes" in resp.json()["error"]["message"]
    assert await rig.log.last_seq() == before and await _events(rig, "r1") == []
    cfg.max_bytes = room
    await js.update_stream(cfg)
    again = await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1"))
    assert again.status_code == 200, again.text
    assert [type(s.event) for s in await _events(rig, "r1")] == [ModelCallAdmitted, ModelCallCompleted]


async def test_a_lone_surrogate_in_a_body_is_a_400_and_stores_nothing(rig: ModelRig) -> None:
    """JSON may escape a lone surrogate; no UTF-8 record can hold it (the fuzz found it as a 500)."""
    await rig.log.dispatch("r1", {}, instance="collector")
    raw = b'{"messages": [{"role": "user", "content": "\\udb9d"}]}'
    headers = {**rig.headers("r1"), "content-type": "application/json"}
    resp = await rig.client.post("/v1/chat/completions", content=raw, headers=headers)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "bad_request", resp.text
    assert "not valid Unicode" in resp.json()["error"]["message"]
    assert await _events(rig, "r1") == []


async def test_an_integer_the_log_cannot_hold_is_a_400_and_stores_nothing(rig: ModelRig) -> None:
    await rig.log.dispatch("r1", {}, instance="collector")
    body = {"messages": [{"role": "user", "content": "hi"}], "seed": 10**30}
    resp = await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1"))
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "bad_request", resp.text
    assert await _events(rig, "r1") == []


@pytest.mark.parametrize(
    ("route", "body", "where"),
    [
        ("/v1/chat/completions", {"messages": True}, "$.messages"),  # found by the fuzz: was a 500
        ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, "$.messages[0]"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"text": 5}]}]}, "$.messages[0]"),
        (
            "/v1/chat/completions",
            {"messages": [], "tools": [{"function": {"name": "f", "parameters": {"properties": 5}}}]},
            "$.tools[0]",
        ),
        ("/v1/responses", {"input": 7}, "$.input"),
        ("/v1/responses", {"input": [{"role": 3, "content": "x"}]}, "$.messages[0].role"),
    ],
)
async def test_a_body_of_the_wrong_shape_is_a_400_naming_the_field_and_nothing_is_logged(
    rig: ModelRig, log: EventLog, route: str, body: dict[str, Any], where: str
) -> None:
    await log.dispatch("r1", {}, instance="collector")
    before = [s.seq async for s in log.read(rollout_id="r1")]
    resp = await rig.client.post(route, json=body, headers=rig.headers("r1"))
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "bad_request" and where in err["message"], err
    assert [s.seq async for s in log.read(rollout_id="r1")] == before


async def test_a_call_completed_after_the_cut_before_the_fence_moved_is_reused_not_generated(
    rig: ModelRig,
) -> None:
    """A recovery seals the cut, then opens the next attempt; the old attempt runs in between. A call
    it completed there is reused by the next attempt making the same request (seen in CI: a random
    sequence's restore, with runs going on, generated three such calls twice)."""
    await rig.log.dispatch("r1", {}, instance="collector")
    res = await rig.coordinator.checkpoint(deadline_s=5)
    body = {"messages": [{"role": "user", "content": "after the cut"}], "tools": TOOLS}
    first = (await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1"))).json()
    await rig.log.supersede(
        "r1", 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=res.record.cut
    )
    generated = rig.service.stats["tokens_generated"]
    again = (await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1", 2))).json()
    assert again["rollcut"]["served_from_log"] is True
    assert rig.service.stats["tokens_generated"] == generated
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    completed = [s.event for s in await _events(rig, "r1") if isinstance(s.event, ModelCallCompleted)]
    reused = [s.event for s in await _events(rig, "r1") if isinstance(s.event, ModelCallReused)]
    assert [c.attempt for c in completed] == [1]
    assert [(r.attempt, r.source_call_id, r.source_attempt) for r in reused] == [(2, first["id"], 1)]


async def test_a_running_call_of_a_superseded_attempt_is_settled_failed_and_the_checkpoint_publishes(
    rig: ModelRig,
) -> None:
    """A heal opened attempt 2 while attempt 1's call still generates here: the cut's record of that
    call is refused by the fence, which settles the call (``failed``), never the prepare (issue 49:
    before, "model-w0 refused prepare: ... attempt 1 is stale (attempt 2 is current)")."""
    await rig.log.dispatch("r1", {}, instance="collector")
    rig.service.backend.token_delay_s = 0.05  # long enough to be caught mid-generation
    body = {"messages": [{"role": "user", "content": "long"}]}
    call = asyncio.ensure_future(
        rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1"))
    )
    await until(
        lambda: any(len(f.emitted) >= 3 for f in rig.service._inflight.values()), what="tokens flowing"
    )
    await rig.log.supersede("r1", 1, instance="collector", reason="agent restarted")
    result = await rig.coordinator.checkpoint(deadline_s=10)
    assert result.participants == ["model-w0"] and result.record.quarantined == {}
    rig.service.backend.token_delay_s = 0.0
    late = await call
    assert late.status_code == 409 and late.json()["error"]["code"] == "stale_attempt", late.text


async def test_a_fresh_dispatch_for_lack_of_a_checkpoint_serves_what_its_first_attempt_completed(
    rig: ModelRig,
) -> None:
    """No published checkpoint covers the rollout's progress (a chaos trial's collector host was cut
    off early): recovery starts it over from its input, and the call its first attempt completed is
    served from the log for the same request, not generated again (it was, five calls in that
    trial). A restart measured as one (the demo's baseline) generates it again."""
    from rollcut.participants import RecoveryMode, Restorer

    await rig.log.dispatch("r1", {}, instance="collector")
    await rig.log.dispatch("r2", {}, instance="collector")
    await rig.coordinator.checkpoint(deadline_s=5)  # before either did anything
    body = {"messages": [{"role": "user", "content": "done before the crash"}], "tools": TOOLS}
    first = {
        rid: (await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers(rid))).json()
        for rid in ("r1", "r2")
    }
    restorer = Restorer(rig.log, rig.coordinator.ledger, rig.coordinator)
    plan = await restorer.plan(["r1"])
    assert (plan.fresh_dispatch, plan.reuse_completed) == (["r1"], {"r1"})
    await restorer.open_attempts(plan)  # r1 from its input, serving what it completed
    restart = await restorer.plan(["r2"])
    await restorer.recover(["r2"], RecoveryMode.RESTART)
    assert restart.fresh_dispatch == ["r2"]
    generated = rig.service.stats["tokens_generated"]
    again = (await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r1", 2))).json()
    assert again["rollcut"]["served_from_log"] is True
    assert again["choices"][0]["message"] == first["r1"]["choices"][0]["message"]
    assert rig.service.stats["tokens_generated"] == generated
    anew = (await rig.client.post("/v1/chat/completions", json=body, headers=rig.headers("r2", 2))).json()
    assert anew["rollcut"]["served_from_log"] is False
    assert rig.service.stats["tokens_generated"] > generated  # the restart baseline: generated again
