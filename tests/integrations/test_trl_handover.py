"""A weight update under a running call: the engine restarted on the next policy version while a
generation streams through the model server, as a pipelined trainer does it.

Real processes: llama.cpp's server on the trainer's policy, ``rollcut serve model`` in front of it
with ``--policy-version-file`` and ``--backend-option handover=S``, JetStream. The call waits for the new
engine and goes on from the tokens it had; its tokens say which weights made them, and the
trainer's own log-probs under those weights agree with the engine's, token by token.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollcut.bus import EventLog
from rollcut.gym.model.engine import LlamaServer
from rollcut.integrations.trl import (
    EngineSync,
    LogprobCheck,
    LogprobMismatchError,
    Sequence,
    new_policy,
    policy_engine,
    write_policy,
)
from rollcut.testing import ServerProcess

from ..helpers import until

pytestmark = pytest.mark.slow


async def _stream(client: httpx.AsyncClient, body: dict[str, Any], seen: list[str]) -> dict[str, Any]:
    """A streamed chat call; content deltas land in ``seen`` as they arrive; the last chunk's
    message fields (token ids, log-probs, segments) are returned."""
    last: dict[str, Any] = {}
    headers = {"x-rollout-id": "h1", "x-rollout-attempt": "1"}
    async with client.stream(
        "POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers
    ) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk  # the call failed rather than wait for the engine
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        seen.append(delta["content"])
                    if "generation_token_ids" in delta:
                        last = delta
    return last


async def _hold_mid_call(engine: LlamaServer, call: asyncio.Future[Any], seen: list[str]) -> None:
    """Hold the engine still (SIGSTOP) while it generates the call, once a token it made has reached
    the client through the model server: the old weights made part of the call and the rest is still
    to come, however fast the engine runs or slowly the machine relays. A stop before the engine's
    first tokens were sent lets it go on and stops it again."""
    assert engine.proc is not None
    for _ in range(5):
        await until(
            lambda: call.done() or engine.decoding(at_least=1) > 0, timeout=60, what="the engine generating"
        )
        assert not call.done(), "the call ended before the weight update"
        os.kill(engine.proc.pid, signal.SIGSTOP)
        try:
            await until(lambda: bool(seen), timeout=5, what="a token of the held engine at the client")
            return
        except AssertionError:
            os.kill(engine.proc.pid, signal.SIGCONT)
    pytest.fail("no token reached the client in five holds of the engine")


@pytest.mark.timeout(300)
async def test_a_call_running_across_a_weight_update_goes_on_and_each_token_is_its_versions(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path
) -> None:
    import torch

    policy_dir = tmp_path / "policy"
    policy_dir.mkdir(mode=0o700)
    model, tokenizer = new_policy(seed=0)
    files = write_policy(model, tokenizer, policy_dir, 0)
    version_file = policy_dir / "version"
    version_file.write_text("0\n")
    engine = policy_engine(files, slots=1)
    engine.start()
    argv = ["model", "--url", nats_url, "--namespace", namespace, "--tokens", str(tmp_path / "tokens")]
    argv += ["--port", "0", "--workers", "1", "--return-token-ids", "--backend", "engine"]
    argv += [
        "--upstream",
        engine.url,
        "--policy-version-file",
        str(version_file),
        "--backend-option",
        "handover=60",
    ]
    server = ServerProcess(argv, workers=1)
    try:
        server.start()
        await log.dispatch("h1", {"task": 1}, instance="collector")
        n = 1900  # the policy's context is 2048: as long as it can be, to be generating at the update
        body = {
            "messages": [{"role": "user", "content": "Write the letter e, many times."}],
            "max_tokens": n,
            "logit_bias": {str(tokenizer.eos_token_id): -100},  # it runs to its length
        }
        with torch.no_grad():  # the optimizer step: version 1's weights differ from version 0's
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        v1 = write_policy(model, tokenizer, policy_dir, 1)  # written before: the restart alone is timed
        sync = EngineSync(engine, tokenizer, policy_dir, version_file)
        seen: list[str] = []
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            call = asyncio.ensure_future(_stream(client, body, seen))
            await _hold_mid_call(engine, call, seen)
            sync.serve(v1)
            msg = await call
    finally:
        server.close()
        engine.kill()

    segments = msg["policy_segments"]
    k = segments[0]["end"]
    assert segments == [
        {"version": 0, "start": 0, "end": k, "reprefilled": False},
        {"version": 1, "start": k, "end": n, "reprefilled": True},  # the new engine prefilled the prefix
    ]
    assert 0 < k < n and len(msg["generation_token_ids"]) == len(msg["generation_log_probs"]) == n

    # the trainer's log-probs under each token's weights are the engine's
    versions = [0] * k + [1] * (n - k)
    seq = Sequence(
        msg["prompt_token_ids"], msg["generation_token_ids"], msg["generation_log_probs"], [1] * n, versions
    )
    out = LogprobCheck(policy_dir).check(1, ["h1"], [seq])
    assert out["tokens"] == n and out["max_abs_delta"] < 1e-3
    # and the labels matter: every token called version 0 does not agree
    wrong = Sequence(seq.prompt_ids, seq.completion_ids, seq.logprobs, seq.env_mask, [0] * n)
    with pytest.raises(LogprobMismatchError, match="rollout h1"):
        LogprobCheck(policy_dir).check(1, ["h1"], [wrong])
