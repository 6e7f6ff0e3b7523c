"""Sandbox sessions through a crash, at process level: a collection over the sandbox's tasks with
every Gym process SIGKILLed mid-run, then resumed. A continued attempt starts from exactly the
files of its cut (its seeded tree is the cut's manifest), no command runs twice, every row is
written once with the same verdict as a run without the crash."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from rollcut.bus import (
    BusConfig,
    CheckpointCommitted,
    EventLog,
    ResourcesMutated,
    ResourcesSeeded,
    ResourcesSnapshot,
    load_credentials,
)
from rollcut.demo import demo_tasks

from .conftest import NS, SIGTERM, Deployment, deploy, finish

pytestmark = pytest.mark.slow

_OPTIONS: dict[str, Any] = {"envs": ("sandbox",), "token_delay": 0.004, "tool_turns": 4}


def _collect(dep: Deployment) -> dict[str, Any]:
    code, summary = finish(dep.collect(), timeout=240)
    assert code == 0, summary
    return summary


async def _admin(dep: Deployment) -> EventLog:
    config = BusConfig(url=dep.url, namespace=NS).as_role(load_credentials(dep.creds), "admin")
    return await EventLog.connect(config)


async def _cut_mid_episode(dep: Deployment, proc: Any, timeout: float = 90) -> None:
    """Until a committed checkpoint has cut a session mid-episode (a snapshot at revision 1 or
    more before the commit) whose rollout has no row yet: the crash then has something to
    continue. Bounded: the collection makes progress or the test fails."""
    give_up = time.monotonic() + timeout
    log = await _admin(dep)
    try:
        while True:
            assert proc.poll() is None, "the collection ended before a checkpoint cut an episode"
            snapshots: dict[str, int] = {}
            committed = 0
            async for s in log.read():
                if isinstance(s.event, ResourcesSnapshot) and s.event.revision >= 1:
                    snapshots[s.event.rollout_id] = s.seq
                elif isinstance(s.event, CheckpointCommitted):
                    committed = s.seq
            done = {r["rollout_id"] for r in dep.rows()}
            if any(seq < committed and rid not in done for rid, seq in snapshots.items()):
                return
            assert time.monotonic() < give_up, f"no episode cut mid-way after {timeout}s"
            await asyncio.sleep(0.05)
    finally:
        await log.close()


async def _sandbox_events(dep: Deployment) -> list[Any]:
    log = await _admin(dep)
    try:
        kinds = (ResourcesMutated, ResourcesSeeded, ResourcesSnapshot)
        return [s.event async for s in log.read() if isinstance(s.event, kinds)]
    finally:
        await log.close()


def _manifest(state: bytes | None) -> str:
    assert state is not None
    out: str = msgspec.json.decode(state)["manifest"]
    return out


@pytest.mark.timeout(600)
def test_sandbox_sessions_continue_from_the_files_of_their_cut_after_every_gym_process_dies(
    tmp_path: Path,
) -> None:
    tasks = demo_tasks(8, seed=0, envs=("sandbox",))
    with deploy(tmp_path / "reference", tasks, **_OPTIONS) as ref:
        _collect(ref)
        verdicts = {r["rollout_id"]: r["reward"] for r in ref.rows()}
    with deploy(tmp_path / "crashed", tasks, **_OPTIONS) as dep:
        dep.every_s = 0.5
        dep._write_config()
        proc = dep.collect()
        asyncio.run(_cut_mid_episode(dep, proc))
        dep.crash()  # SIGKILL every Gym process, sandboxes mid-episode
        proc.send_signal(SIGTERM)
        finish(proc)
        dep.restart()
        code, summary = finish(dep.collect("--resume"), timeout=240)
        assert code == 0, summary
        rows = dep.rows()
        events = asyncio.run(_sandbox_events(dep))

    assert sorted(r["rollout_id"] for r in rows) == sorted(verdicts)  # each row once
    assert {r["rollout_id"]: r["reward"] for r in rows} == verdicts  # the same verdicts
    assert summary["recovery"].get("continue", 0) >= 1, summary["recovery"]

    # no tool call before a cut ran again: an attempt executes each revision once, and a continued
    # attempt only revisions after the one it was seeded at (its cut's); an attempt started over
    # from the input (a rollout with no cut to continue from) is seeded at 0 and redoes its calls
    seeded_at = {(e.rollout_id, e.attempt): e.revision for e in events if isinstance(e, ResourcesSeeded)}
    revisions = Counter(
        (e.rollout_id, e.attempt, e.revision) for e in events if isinstance(e, ResourcesMutated)
    )
    assert revisions and max(revisions.values()) == 1
    assert all(rev > seeded_at[(rid, attempt)] for rid, attempt, rev in revisions)
    # a continued attempt's session starts from the tree its cut recorded, at that revision
    snapshots = {
        (e.rollout_id, e.attempt, e.revision): _manifest(e.state)
        for e in events
        if isinstance(e, ResourcesSnapshot)
    }
    continued = [e for e in events if isinstance(e, ResourcesSeeded) and e.attempt > 1]
    assert any(e.revision > 0 for e in continued), [(e.rollout_id, e.revision) for e in continued]
    for seeded in continued:
        before = {
            digest
            for (rid, attempt, rev), digest in snapshots.items()
            if rid == seeded.rollout_id and attempt < seeded.attempt and rev == seeded.revision
        }
        if seeded.revision > 0:  # mid-episode at the cut: the tree is the cut's, to the byte
            assert _manifest(seeded.state) in before, (seeded.rollout_id, seeded.revision)
