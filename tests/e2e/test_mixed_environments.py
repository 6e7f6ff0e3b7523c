"""Environments that declare different things, side by side, as processes with two workers each.

A restart-only environment keeps serving through a checkpoint and never holds
one up; a verification that declares ``wait`` is waited for by prepare; a
replayable (stateless) verifier is run again after a crash with the same
verdict.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from rollcut.bus import EventLog
from rollcut.gym.wire import SESSION_COOKIE, Identity, identity_headers
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator
from rollcut.testing import ServerProcess
from rollcut.tokens import LocalTokenStore

pytestmark = pytest.mark.slow


def _resources(servers: list[ServerProcess], env: str, url: str, ns: str) -> ServerProcess:
    srv = ServerProcess(["resources", env, "--url", url, "--namespace", ns, "--workers", "2"], workers=2)
    servers.append(srv.start())
    return srv


async def _post(url: str, rid: str, attempt: int = 1, body: dict[str, Any] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as fresh:  # a new connection, hence any worker, per call
        return await fresh.post(url, json=body or {}, headers=identity_headers(Identity(rid, attempt)))


async def test_a_restart_only_environment_keeps_serving_through_a_checkpoint_and_never_holds_it(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    pad = _resources(servers, "scratchpad", nats_url, namespace)
    exported = _resources(servers, "workplace_exported", nats_url, namespace)
    ids = [f"r{i}" for i in range(6)]
    for r in ids:
        await log.dispatch(r, {}, instance="collector")
        assert (await _post(f"{pad.url}/seed_session", r)).status_code == 200
        assert (await _post(f"{exported.url}/seed_session", r, body={"contacts": []})).status_code == 200
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tmp_path / "tokens") as tokens:
        coord = Coordinator(log, led, tokens)
        found = await coord.discover()
        deadline = time.time() + 20
        replies = await asyncio.gather(*(coord.call(i, "prepare", "ck-held", deadline) for i in found))
        assert all(r.ok for r in replies)  # the scratchpad's sessions did not keep it from preparing
        # prepared, not yet published: the exported environment holds admission, the scratchpad serves
        for r in ids:
            wrote = await _post(f"{pad.url}/write", r, body={"text": "still going"})
            assert wrote.status_code == 200, wrote.text
            held = await _post(f"{exported.url}/send_email", r, body={"to": "x", "body": "y"})
            assert held.status_code == 503 and held.json()["error"]["code"] == "admission_closed"
        for info in found:
            assert (await coord.call(info, "abort", "ck-held", deadline)).ok
        # a whole checkpoint with scratchpad sessions live: published, naming what cannot continue
        res = await coord.checkpoint(deadline_s=10)
        assert {n for n, why in res.unreproducible.items() if n.startswith("scratchpad")} == {
            "scratchpad-w0",
            "scratchpad-w1",
        }
        assert (await _post(f"{pad.url}/write", ids[0], body={"text": "after"})).json()["result"][
            "lines"
        ] == 2


async def test_a_verification_that_declares_wait_is_waited_for_by_prepare(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    judge = _resources(servers, "judge", nats_url, namespace)
    ids = [f"j{i}" for i in range(4)]
    for r in ids:
        await log.dispatch(r, {}, instance="collector")
        assert (await _post(f"{judge.url}/seed_session", r)).status_code == 200
    finished: list[str] = []

    async def verify(rid: str) -> httpx.Response:
        body = {"answer": "light scatters", "expect_words": ["light", "scatter"], "judge_delay_s": 1.5}
        out = await _post(f"{judge.url}/verify", rid, body=body)
        finished.append(f"verify {rid}")
        return out

    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tmp_path / "tokens") as tokens:
        coord = Coordinator(log, led, tokens)
        verifying = [asyncio.ensure_future(verify(r)) for r in ids]
        for _ in range(200):  # bounded: until both workers report their verifications running
            async with httpx.AsyncClient() as c:
                stats = (await c.get(f"{judge.url}/rollcut/stats")).json()
            if stats["verifying"] == len(ids):
                break
            await asyncio.sleep(0.02)
        assert stats["verifying"] == len(ids)
        res = await coord.checkpoint(deadline_s=10)
        finished.append("checkpoint")
        verdicts = await asyncio.gather(*verifying)
    assert [v.json()["reward"] for v in verdicts] == [1.0] * len(ids)
    assert finished[-1] == "checkpoint" and res.record.cut > 0  # every verification ended first


async def test_a_stateless_verifier_is_run_again_after_a_crash_with_the_same_verdict(
    log: EventLog, nats_url: str, namespace: str, tmp_path: Path, servers: list[ServerProcess]
) -> None:
    math = _resources(servers, "math", nats_url, namespace)
    body = {"answer": "so the total is 42", "expected": "42"}
    await log.dispatch("m1", {}, instance="collector")
    assert (await _post(f"{math.url}/seed_session", "m1")).status_code == 200
    first = (await _post(f"{math.url}/verify", "m1", body=body)).json()
    with Ledger(tmp_path / "ledger") as led, LocalTokenStore(tmp_path / "tokens") as tokens:
        res = await Coordinator(log, led, tokens).checkpoint(deadline_s=10)
    math.kill()  # SIGKILL every process of it
    again = _resources(servers, "math", nats_url, namespace)
    await log.supersede(
        "m1", 1, instance="coordinator", checkpoint_id=res.record.checkpoint_id, from_cut=res.record.cut
    )
    seeded = await _post(f"{again.url}/seed_session", "m1", 2)
    assert seeded.status_code == 200 and seeded.cookies.get(SESSION_COOKIE)
    replayed = (await _post(f"{again.url}/verify", "m1", 2, body=body)).json()
    assert replayed == first == {"reward": 1.0, "passed": True, "parsed": "42"}
