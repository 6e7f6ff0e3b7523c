"""The whole Gym stack as processes: 16 episodes, a checkpoint, SIGKILL everywhere, continuation."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx
import pytest

from rollcut.bus import (
    AgentBoundary,
    EventLog,
    ModelCallCompleted,
    ResourcesMutated,
    RolloutCompleted,
)
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator
from rollcut.testing import ServerProcess
from rollcut.tokens import LocalTokenStore

from ..helpers import until

TASK = {"env": "counter", "prompt": "count up", "seed": {"start": 0}, "max_steps": 8}


def start_stack(url: str, ns: str, tokens: Path) -> list[ServerProcess]:
    common = ["--url", url, "--namespace", ns]
    model = ServerProcess(
        [
            "model",
            *common,
            "--tokens",
            str(tokens),
            "--port",
            "0",
            "--backend-option",
            "seed=5",
            "--backend-option",
            "token_delay=0.004",
        ]
    ).start()
    res = ServerProcess(["resources", "counter", *common]).start()
    agent = ServerProcess(
        [
            "agent",
            "simple",
            "--model",
            model.url,
            "--resources",
            f"counter={res.url}",
            *common,
            "--workers",
            "2",
        ],
        workers=2,
    ).start()
    env = ServerProcess(["environment", "--agent", agent.url, *common]).start()
    return [model, res, agent, env]


@pytest.mark.slow
async def test_sixteen_episodes_across_two_agent_workers_all_continue_after_sigkill(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path
) -> None:
    tokens_dir = tmp_path / "tokens"
    stack = start_stack(nats_url, namespace, tokens_dir)
    ids = [f"e{i:02d}" for i in range(16)]
    try:
        for r in [*ids, "reference"]:
            await log.dispatch(r, TASK, instance="collector")
        async with httpx.AsyncClient(base_url=stack[3].url, timeout=120) as client:
            reference = (
                await client.post(
                    "/run", json=TASK, headers={"x-rollout-id": "reference", "x-rollout-attempt": "1"}
                )
            ).json()
            runs = [
                asyncio.ensure_future(
                    client.post("/run", json=TASK, headers={"x-rollout-id": r, "x-rollout-attempt": "1"})
                )
                for r in ids
            ]

            async def every_one_past_a_boundary() -> bool:
                seen = {s.event.rollout_id async for s in log.read() if isinstance(s.event, AgentBoundary)}
                return seen >= set(ids)

            await until(every_one_past_a_boundary, timeout=90, what="every episode past a boundary")
            with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tokens_dir) as tokens:
                res = await Coordinator(log, led, tokens).checkpoint(deadline_s=20)
            for g in stack:
                g.kill()  # every Gym process, SIGKILL, mid-run
            for r in runs:
                with contextlib.suppress(httpx.HTTPError):
                    await r
        cut = res.record.cut
        below = [s async for s in log.read(up_to=cut)]
        done_below = {s.event.rollout_id for s in below if isinstance(s.event, RolloutCompleted)}
        stack = start_stack(nats_url, namespace, tokens_dir)
        to_continue = [r for r in ids if r not in done_below]
        assert len(to_continue) >= len(ids) // 2  # the crash really hit episodes mid-run
        for r in to_continue:
            await log.supersede(
                r, 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=cut
            )
        async with httpx.AsyncClient(base_url=stack[3].url, timeout=120) as client:
            outs = await asyncio.gather(
                *(
                    client.post("/run", json=TASK, headers={"x-rollout-id": r, "x-rollout-attempt": "2"})
                    for r in to_continue
                )
            )
        for r, o in zip(to_continue, outs, strict=True):
            assert o.status_code == 200, (r, o.text)
            body = o.json()
            assert body["answer"] == reference["answer"] and body["verified"] == reference["verified"], r
            assert body["continued"] is True, r
        # nothing completed below the cut ran again
        before = {
            (s.event.rollout_id, s.event.request_digest)
            for s in below
            if isinstance(s.event, ModelCallCompleted)
        }
        muts_before = {
            (s.event.rollout_id, s.event.revision) for s in below if isinstance(s.event, ResourcesMutated)
        }
        for r in to_continue:
            a2 = [s.event async for s in log.read(rollout_id=r, attempt=2)]
            again = {(r, e.request_digest) for e in a2 if isinstance(e, ModelCallCompleted)}
            assert not (again & before), r
            redone = {(r, e.revision) for e in a2 if isinstance(e, ResourcesMutated)}
            assert not (redone & muts_before), r
    finally:
        for g in stack:
            g.kill()
