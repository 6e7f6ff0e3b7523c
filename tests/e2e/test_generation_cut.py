"""The model server as real processes: workers, SIGKILL, restart, continuation."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollcut import CheckpointFailedError
from rollcut.bus import EventLog, ModelCallContinued, ModelCallPrefixCut
from rollcut.gym import owner_of
from rollcut.gym.model import LocalBackend
from rollcut.ledger import Ledger
from rollcut.participants import CheckpointResult, Coordinator
from rollcut.testing import ServerProcess
from rollcut.tokens import LocalTokenStore

from ..helpers import until


def model_server(
    url: str, namespace: str, tokens: Path, *, workers: int = 1, token_delay: float = 0.0, seed: int = 3
) -> ServerProcess:
    """`rollcut serve model` as its own process tree (one process per worker), with training data on."""
    argv = ["model", "--url", url, "--namespace", namespace, "--tokens", str(tokens), "--port", "0"]
    argv += [
        "--workers",
        str(workers),
        "--backend-option",
        f"seed={seed}",
        "--backend-option",
        f"token_delay={token_delay}",
    ]
    argv += ["--return-token-ids"]
    return ServerProcess(argv, workers=workers).start()


def _headers(rollout_id: str, attempt: int) -> dict[str, str]:
    return {"x-rollout-id": rollout_id, "x-rollout-attempt": str(attempt)}


@pytest.mark.slow
async def test_admission_closes_in_every_worker_a_dead_worker_comes_back_or_is_named(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    srv = model_server(nats_url, namespace, tmp_path / "tokens", workers=2)
    servers.append(srv)
    await log.dispatch("r1", {}, instance="collector")
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tmp_path / "tokens") as tokens:
        coord = Coordinator(log, led, tokens)
        found = await coord.discover()
        assert sorted(i.instance for i in found) == ["model-w0", "model-w1"]
        deadline = time.time() + 10
        for info in found:
            assert (await coord.call(info, "prepare", "ck-close", deadline)).ok
        async with httpx.AsyncClient(base_url=srv.url) as client:
            codes = {
                (
                    await client.post(
                        "/v1/chat/completions",
                        headers=_headers(f"r{i}", 1),
                        json={"messages": [{"role": "user", "content": f"x{i}"}]},
                    )
                ).status_code
                for i in range(16)  # rollouts held by both workers
            }
            assert {owner_of(f"r{i}", 2) for i in range(16)} == {0, 1}
            assert codes == {503}
            for info in found:
                assert (await coord.call(info, "abort", "ck-close", deadline)).ok
            ok = await client.post(
                "/v1/chat/completions",
                headers=_headers("r1", 1),
                json={"messages": [{"role": "user", "content": "open again"}]},
            )
            assert ok.status_code == 200
        old = srv.instances["model-w1"]
        assert srv.kill_worker("model-w1") != old  # SIGKILL; its parent starts it again, same name
        res = await coord.checkpoint(deadline_s=10)
        assert {"model-w0", "model-w1"} <= set(res.record.participants)
        # with its parent stopped, nobody restarts it: the next checkpoint names it and publishes nothing
        # (stopped, not killed: a worker dies with its parent, and worker 0 must live on here)
        os.kill(srv.p.pid if srv.p else 0, signal.SIGSTOP)
        os.kill(srv.instances["model-w1"], signal.SIGKILL)
        with pytest.raises(CheckpointFailedError, match="model worker 1 of 2"):
            await coord.checkpoint(deadline_s=3)
        assert [c.checkpoint_id for c in led.checkpoints()] == [res.record.checkpoint_id]


async def _cut_mid_generation(
    log: EventLog, coord: Coordinator, srv: ServerProcess, body: dict[str, Any], rollout_id: str
) -> tuple[CheckpointResult, ModelCallPrefixCut]:
    """Checkpoint while ``body`` generates on ``srv`` in attempt 1, SIGKILL it: the checkpoint and
    the call's one cut."""
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        call = asyncio.ensure_future(
            client.post("/v1/chat/completions", json=body, headers=_headers(rollout_id, 1))
        )

        async def under_way() -> bool:
            stats = (await client.get("/rollcut/stats")).json()
            return bool(stats["in_flight"]) and stats["tokens_generated"] >= 10

        await until(under_way, timeout=60, what="the generation well under way")
        res = await coord.checkpoint(deadline_s=5)
        srv.kill()  # SIGKILL while the generation is still running
        with pytest.raises(httpx.HTTPError):
            await call
    cuts = [
        s.event
        async for s in log.read(rollout_id=rollout_id, up_to=res.record.cut)
        if isinstance(s.event, ModelCallPrefixCut)
    ]
    assert len(cuts) == 1
    return res, cuts[0]


async def _attempt_two(
    log: EventLog, srv: ServerProcess, res: CheckpointResult, body: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore r1 from ``res`` as attempt 2 and make the call again on ``srv``: its answer, and the
    server's stats after it."""
    await log.supersede(
        "r1", 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=res.record.cut
    )
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        out = (await client.post("/v1/chat/completions", json=body, headers=_headers("r1", 2))).json()
        stats = (await client.get("/rollcut/stats")).json()
    return out, stats


@pytest.mark.slow
async def test_in_flight_generation_is_cut_and_continued_after_sigkill(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    seed, tokens_dir = 3, tmp_path / "tokens"
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "a long answer please"}]}
    uninterrupted = LocalBackend(seed=seed).plan(body).output_ids
    assert len(uninterrupted) > 40
    srv = model_server(nats_url, namespace, tokens_dir, token_delay=0.05, seed=seed)
    servers.append(srv)
    await log.dispatch("r1", {"task": 1}, instance="collector")
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tokens_dir) as tokens:
        coord = Coordinator(log, led, tokens)
        res, cut = await _cut_mid_generation(log, coord, srv, body, "r1")
        cuts = [cut]  # the one cut (``_cut_mid_generation`` checks there is exactly one)
        assert 10 <= cuts[0].token_boundary < len(uninterrupted)
        k = cuts[0].token_boundary

        restarted = model_server(nats_url, namespace, tokens_dir, seed=seed)
        servers.append(restarted)
        out, stats = await _attempt_two(log, restarted, res, body)
        assert out["rollcut"]["continued_from"] == k
        assert out["rollcut"]["started_over"] is None
        # as if never interrupted: prefix and remainder as one array, with a log-prob for every token
        assert out["choices"][0]["message"]["generation_token_ids"] == uninterrupted
        assert len(out["choices"][0]["message"]["generation_log_probs"]) == len(uninterrupted)
        assert stats["tokens_generated"] == len(uninterrupted) - k  # only the rest was generated
        cont = [
            s.event
            async for s in log.read(rollout_id="r1", attempt=2)
            if isinstance(s.event, ModelCallContinued)
        ]
        assert [(c.token_boundary, c.delivery, c.prefix_receipt) for c in cont] == [
            (k, "staged", cuts[0].receipt)
        ]
        # the checkpoint, including the prefix receipt, verifies against the token store
        from rollcut.ledger import verify_checkpoint

        assert await verify_checkpoint(log, led, tokens, res.record.checkpoint_id) == []


@pytest.mark.slow
async def test_a_cut_prefix_the_backend_does_not_recognise_is_not_continued_and_the_answer_says_why(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    """Fail closed: restarted with another model (here the local model's seed), the call's cut prefix
    is not this model's answer to the prompt; the call starts over from its input and says why."""
    tokens_dir = tmp_path / "tokens"
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "a long answer please"}]}
    other = LocalBackend(seed=4).plan(body).output_ids
    srv = model_server(nats_url, namespace, tokens_dir, token_delay=0.05, seed=3)
    servers.append(srv)
    await log.dispatch("r1", {"task": 1}, instance="collector")
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tokens_dir) as tokens:
        coord = Coordinator(log, led, tokens)
        res, cut = await _cut_mid_generation(log, coord, srv, body, "r1")
        assert cut.token_boundary >= 10
        assert other[: cut.token_boundary] != LocalBackend(seed=3).plan(body).output_ids[: cut.token_boundary]
        restarted = model_server(nats_url, namespace, tokens_dir, seed=4)
        servers.append(restarted)
        out, stats = await _attempt_two(log, restarted, res, body)
    assert out["rollcut"]["continued_from"] == 0
    assert out["rollcut"]["started_over"] == (
        f"the local backend refused {cut.call_id}'s cut prefix as not this call's"
    )
    assert out["choices"][0]["message"]["generation_token_ids"] == other  # the new model's whole answer
    assert stats["prefixes_refused"] == 1 and stats["tokens_generated"] == len(other)
    kinds = [type(s.event) async for s in log.read(rollout_id="r1", attempt=2)]
    assert ModelCallContinued not in kinds
