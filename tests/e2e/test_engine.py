"""Generation cuts on a real inference engine, with real processes: the model server SIGKILLed while
the engine lives, continuation after restore, reuse, and several workers cut at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollcut.bus import (
    EventLog,
    ModelCallCompleted,
    ModelCallContinued,
    ModelCallPrefixCut,
    ModelCallReused,
    TokenReceipt,
)
from rollcut.gym import owner_of
from rollcut.ledger import Ledger
from rollcut.participants import CheckpointResult, Coordinator
from rollcut.testing import ServerProcess
from rollcut.tokens import LocalTokenStore, call_store

from ..engine import Engine
from ..helpers import until


def engine_model_server(
    url: str, namespace: str, tokens: Path, engine: Engine, *, workers: int = 1, extra: tuple[str, ...] = ()
) -> ServerProcess:
    """`rollcut serve model --backend engine` as its own process tree, training data on."""
    argv = ["model", "--url", url, "--namespace", namespace, "--tokens", str(tokens), "--port", "0"]
    argv += ["--workers", str(workers), "--return-token-ids", *engine.serve_args(), *extra]
    return ServerProcess(argv, workers=workers).start()


def _headers(rollout_id: str, attempt: int) -> dict[str, str]:
    return {"x-rollout-id": rollout_id, "x-rollout-attempt": str(attempt)}


async def _stream(
    client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str], seen: list[str]
) -> None:
    """A streamed chat call; every content delta lands in ``seen`` as it arrives."""
    async with client.stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers
    ) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        seen.append(choice["delta"]["content"])


@dataclass
class _Scene:
    """A long call cut by a checkpoint while it ran, then its model server SIGKILLed."""

    res: CheckpointResult
    cut: ModelCallPrefixCut
    body: dict[str, Any]
    seen: list[str]
    tried: int


def _has(seen: list[str], n: int) -> bool:
    return len(seen) >= n


async def _cut_and_kill(
    log: EventLog,
    coord: Coordinator,
    start: Callable[[], ServerProcess],
    body_of: Callable[[int], dict[str, Any]],
    *,
    rollout_id: str,
    at_least: int,
) -> _Scene:
    """Stream ``body_of(try)`` on a server ``start()`` makes, checkpoint once ``at_least`` tokens came,
    SIGKILL the server. The scene holds only if the cut took the call running and it had not ended by
    the kill: under a full run's load a generation once ended before the prepare (vLLM's 3,500 tokens)
    and once between the cut and the kill (its whole answer was in the cut, llama.cpp's 600), and a
    call that ended is reused whole, not continued. Then the scene again with another request (so the
    continuation cannot reuse the ended one), three times at most; the last one is returned as it is,
    for the caller's assertions to name what went wrong."""
    since = 0  # the cut of the last try set aside: what it cut or ended is not this try's
    why = ""
    for tried in range(3):
        body = body_of(tried)
        srv = start()
        seen: list[str] = []
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            call = asyncio.ensure_future(_stream(client, body, _headers(rollout_id, 1), seen))
            await until(partial(_has, seen, at_least), timeout=60, what=f"{at_least} tokens streamed")
            # the server is expected for half the deadline: beside vLLM's CPU engine generating on
            # two cores, with the other worker's test running, its answer once took over 5 s
            res = await coord.checkpoint(deadline_s=30, expect=set(srv.instances))
            srv.kill()  # SIGKILL the model server; the engine lives on
            with contextlib.suppress(httpx.HTTPError):  # the stream broke with its server
                await call  # what it had seen is in `seen`
        tail = [s async for s in log.read(rollout_id=rollout_id) if s.seq > since]
        cuts = [s.event for s in tail if isinstance(s.event, ModelCallPrefixCut) and s.seq <= res.record.cut]
        ended = any(isinstance(s.event, ModelCallCompleted) for s in tail if s.seq > res.record.cut)
        boundary = cuts[0].token_boundary if len(cuts) == 1 else None
        if boundary is not None and boundary < body["max_tokens"] and not ended:
            return _Scene(res, cuts[0], body, seen, tried)
        why += f" try {tried + 1}: {len(cuts)} cuts, boundary {boundary}, ended {ended}, seen {len(seen)};"
        since = res.record.cut
    pytest.fail(f"no running call was cut in three tries:{why}")


async def test_a_call_cut_on_the_engine_continues_after_sigkill_of_the_model_server_with_only_the_rest(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], engine: Engine
) -> None:
    tokens_dir = tmp_path / "tokens"
    short = {"messages": [{"role": "user", "content": "the tool"}], "max_tokens": 30, "logprobs": True}
    n = max(1500, engine.long)  # long enough to be running when the checkpoint cuts it
    srv = engine_model_server(nats_url, namespace, tokens_dir, engine)
    servers.append(srv)
    await log.dispatch("r1", {"task": 1}, instance="collector")
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tokens_dir) as tokens:
        coord = Coordinator(log, led, tokens)
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            first = (await client.post("/v1/chat/completions", json=short, headers=_headers("r1", 1))).json()
            # log-probs name the engine's own tokens (llama.cpp's, vLLM's): one entry per token, its
            # bytes where the engine's text says them (a random model's tokens end mid-character)
            named = first["choices"][0]["logprobs"]["content"]
            assert [e["logprob"] for e in named] == first["choices"][0]["message"]["generation_log_probs"]
            assert all(
                e["bytes"] is None or bytes(e["bytes"]).decode("utf-8", "backslashreplace") == e["token"]
                for e in named
            )

        firsts = [srv]  # the first try on the server that answered `short`

        def start() -> ServerProcess:
            if firsts:
                return firsts.pop()
            made = engine_model_server(nats_url, namespace, tokens_dir, engine)
            servers.append(made)
            return made

        scene = await _cut_and_kill(
            log,
            coord,
            start,
            lambda tried: {
                "messages": [{"role": "user", "content": f"the agent, at length ({tried})"}],
                "max_tokens": n,
                "logit_bias": engine.no_eos,
            },
            rollout_id="r1",
            at_least=30,
        )
        res, long, seen, cuts = scene.res, scene.body, scene.seen, [scene.cut]
        assert 30 <= cuts[0].token_boundary < n
        k = cuts[0].token_boundary
        prefix = await call_store(tokens, tokens.get, cuts[0].receipt)
        # the durable prefix is what the client was streamed before the cut, token for token
        said = await engine.detokenize(prefix.output_ids)
        # (a chunk may carry several tokens' text: vLLM streams ahead in steps)
        assert "".join(seen).startswith(said) and len(said) > 0
        assert len(prefix.logprobs) == k

        await until(engine.idle, timeout=30, what="the engine stopped the dead server's request")
        restarted = engine_model_server(nats_url, namespace, tokens_dir, engine)
        servers.append(restarted)
        await log.supersede(
            "r1", 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=res.record.cut
        )
        async with httpx.AsyncClient(base_url=restarted.url, timeout=120) as client:
            before = engine.tokens_predicted()
            again = (await client.post("/v1/chat/completions", json=short, headers=_headers("r1", 2))).json()
            assert engine.tokens_predicted() == before  # a reused call: zero tokens generated
            msg, msg0 = again["choices"][0]["message"], first["choices"][0]["message"]
            assert again["rollcut"]["served_from_log"]
            for field in ("generation_token_ids", "generation_log_probs", "prompt_token_ids", "content"):
                assert msg[field] == msg0[field]
            out = (await client.post("/v1/chat/completions", json=long, headers=_headers("r1", 2))).json()
            generated = engine.tokens_predicted() - before
        ids = out["choices"][0]["message"]["generation_token_ids"]
        assert out["rollcut"]["started_over"] is None  # else it names why the prefix was not taken
        assert out["rollcut"]["continued_from"] == k, f"cut in try {scene.tried + 1}: {out['rollcut']}"
        assert ids[:k] == prefix.output_ids and len(ids) == n
        assert out["choices"][0]["message"]["generation_log_probs"][:k] == prefix.logprobs
        assert len(out["choices"][0]["message"]["generation_log_probs"]) == n
        assert generated == n - k  # the engine generated only the rest
        kinds = [type(s.event) async for s in log.read(rollout_id="r1", attempt=2)]
        assert ModelCallReused in kinds and ModelCallContinued in kinds


async def test_a_call_cut_under_one_policy_version_and_continued_under_the_next_has_both_segments(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], engine: Engine
) -> None:
    """The weights changed between the cut and the continuation (the model server restarted under
    version 2): the prefix keeps version 1 and its log-probs, the rest is version 2 and flagged as
    re-prefilled, on the answer and in the token store."""
    tokens_dir = tmp_path / "tokens"

    def start() -> ServerProcess:
        made = engine_model_server(nats_url, namespace, tokens_dir, engine, extra=("--policy-version", "1"))
        servers.append(made)
        return made

    await log.dispatch("v1", {"task": 1}, instance="collector")
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tokens_dir) as tokens:
        scene = await _cut_and_kill(
            log,
            Coordinator(log, led, tokens),
            start,
            lambda tried: {
                "messages": [{"role": "user", "content": f"the long one ({tried})"}],
                "max_tokens": engine.long,
                "logit_bias": engine.no_eos,
            },
            rollout_id="v1",
            at_least=20,
        )
        res, cut, body = scene.res, scene.cut, scene.body
        prefix = await call_store(tokens, tokens.get, cut.receipt)
        assert [(s.version, s.start, s.end) for s in prefix.spans()] == [(1, 0, cut.token_boundary)]
        await until(engine.idle, timeout=30, what="the engine stopped the dead server's request")
        again = engine_model_server(nats_url, namespace, tokens_dir, engine, extra=("--policy-version", "2"))
        servers.append(again)
        await log.supersede(
            "v1", 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=res.record.cut
        )
        async with httpx.AsyncClient(base_url=again.url, timeout=120) as client:
            out = (await client.post("/v1/chat/completions", json=body, headers=_headers("v1", 2))).json()
        k = cut.token_boundary
        msg = out["choices"][0]["message"]
        assert out["rollcut"]["continued_from"] == k
        assert msg["generation_log_probs"][:k] == prefix.logprobs
        assert msg["policy_segments"] == [
            {"version": 1, "start": 0, "end": k, "reprefilled": False},
            {"version": 2, "start": k, "end": engine.long, "reprefilled": True},
        ]
        receipt = TokenReceipt(
            receipt_id=out["rollcut"]["receipt_id"],
            count=out["rollcut"]["receipt_count"],
            digest=out["rollcut"]["receipt_digest"],
        )
        stored = await call_store(tokens, tokens.get, receipt)
        assert stored.versions() == [1] * k + [2] * (engine.long - k)


async def test_eight_engine_calls_on_two_model_workers_are_cut_in_one_checkpoint_and_all_finish(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess], engine: Engine
) -> None:
    tokens_dir = tmp_path / "tokens"
    srv = engine_model_server(nats_url, namespace, tokens_dir, engine, workers=2)
    servers.append(srv)
    rollouts = [f"r{i}" for i in range(8)]
    assert {owner_of(r, 2) for r in rollouts} == {0, 1}  # both workers hold calls
    for r in rollouts:
        await log.dispatch(r, {}, instance="collector")
    body: dict[str, Any] = {"max_tokens": 1500, "logit_bias": engine.no_eos}
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tokens_dir) as tokens:
        coord = Coordinator(log, led, tokens)
        async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
            before = engine.tokens_predicted()
            calls = [
                asyncio.ensure_future(
                    client.post(
                        "/v1/chat/completions",
                        json={**body, "messages": [{"role": "user", "content": f"the call {r}"}]},
                        headers=_headers(r, 1),
                    )
                )
                for r in rollouts
            ]

            def under_way() -> bool:
                decoding = engine.decoding(at_least=20)
                return decoding == 8 if decoding is not None else engine.tokens_predicted() - before >= 160

            await until(under_way, timeout=30, what="the eight generations under way")
            res = await coord.checkpoint(deadline_s=10, expect=set(srv.instances))
            outs = {r: (await c).json() for r, c in zip(rollouts, calls, strict=True)}
        assert {"model-w0", "model-w1"} <= set(res.record.participants)
        cut_calls = 0
        for r in rollouts:
            ids = outs[r]["choices"][0]["message"]["generation_token_ids"]
            assert len(ids) == len(outs[r]["choices"][0]["message"]["generation_log_probs"]) == 1500
            for s in [s async for s in log.read(rollout_id=r, up_to=res.record.cut)]:
                if isinstance(s.event, ModelCallPrefixCut):
                    prefix = await call_store(tokens, tokens.get, s.event.receipt)
                    assert ids[: s.event.token_boundary] == prefix.output_ids
                    cut_calls += 1
        # every call was generating when the checkpoint came (the engine said so): each was cut
        assert cut_calls == 8 if engine.server is not None else cut_calls >= 1


ROLLCUT = [sys.executable, "-m", "rollcut"]


def _json(*args: str) -> dict[str, Any]:
    done = subprocess.run([*ROLLCUT, *args, "--json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.mark.slow
def test_the_demo_on_the_engine_writes_every_row_once_with_the_engines_tokens(tmp_path: Path) -> None:
    out = _json(
        "demo", "--engine", "llama.cpp", "--rollouts", "16", "--no-compare", "--home", str(tmp_path / "demo")
    )
    assert out["results_written"] == 16 and out["duplicate_results"] == 0 and out["crashes"] == 1
    assert out["model_calls"]["regenerated_after_crash"] == 0  # no completed call generated twice
    eng = out["engine"]
    assert eng["dialect"] == "llama.cpp" and eng["cuts"] is True
    assert out["model"] == {
        "backend": "engine",
        "engine": "llama.cpp",
        "name": "tiny",
        "upstream": out["model"]["upstream"],
    } and out["model"]["upstream"].startswith("http://127.0.0.1:")
    assert eng["tokens_generated"] >= eng["tokens_for_completed_calls"] > 0
    rows = [json.loads(line) for line in (tmp_path / "demo" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and all(r["response"]["output"] for r in rows)


@pytest.mark.slow
def test_bench_model_on_the_engine_measures_custody_and_what_cuts_save_after_a_crash() -> None:
    out = _json(
        "bench",
        "model",
        "--backend",
        "engine",
        "--calls",
        "8",
        "--clients",
        "1",
        "--repeat",
        "1",
        "--logprobs",
    )
    assert out["logprobs"] is True  # both sides asked for them
    lat = out["clients"]["1"]
    for key in ("direct_p50_ms", "custody_p99_ms", "added_p50_ms", "added_p99_ms"):
        assert lat[key]["min"] <= lat[key]["median"] <= lat[key]["max"], key
    crash = out["crash"]
    n, per_call = crash["calls"], crash["tokens_per_call"]
    cuts, excluded = crash["cuts"], crash["excluded"]
    # a scene where one call ended before the rest were in is set again, and said
    assert 1 <= cuts["tries"] <= 3 and 1 <= excluded["tries"] <= 3
    # every call was a quarter through at the cut: with cuts, the engine generated only the rest
    assert cuts["kept_by_cuts"] >= n * per_call // 4
    assert cuts["generated_after_restart"] == n * per_call - cuts["kept_by_cuts"]
    assert 0 <= cuts["regenerated"] == cuts["generated_before_crash"] - cuts["kept_by_cuts"]
    # without cuts, every call in flight starts over
    assert excluded["kept_by_cuts"] == 0 and excluded["generated_after_restart"] == n * per_call
    assert excluded["regenerated"] == excluded["generated_before_crash"] > cuts["regenerated"]
