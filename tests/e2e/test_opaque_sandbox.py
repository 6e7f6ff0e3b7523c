"""An opaque agent whose runtime snapshots its working directory (``--sandbox DIR-TEMPLATE``): after
every Gym process is SIGKILLed, the continued attempt starts with the files of its cut, answered
from the journal, and finishes as an uninterrupted run; files and journal of one moment only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollcut.bus import AgentSandbox, RelayExchange, RelayReplayed

from .conftest import Deployment, deploy
from .episodes import episodes
from .test_opaque import (
    TASK,
    assert_nothing_done_twice,
    continued,
    kinds,
    opaque_agent,
    run_until_paused,
    same_episode,
)

pytestmark = pytest.mark.slow

DISK_TASK = {**TASK, "disk": True}  # the reference agent keeps identity.txt and notes.txt on disk


@pytest.fixture
def snapshotting(tmp_path: Path) -> Iterator[Deployment]:
    template = str(tmp_path / "agents" / "{rollout_id}" / "{attempt}")
    agent = opaque_agent(capability="sandbox_snapshot", sandbox=template)
    with deploy(tmp_path, token_delay=0.002, tool_turns=4, envs=("counter",), agent_options=agent) as dep:
        yield dep


async def test_an_opaque_agent_continues_with_the_files_of_its_cut_after_every_process_dies(
    snapshotting: Deployment, tmp_path: Path
) -> None:
    async with episodes(snapshotting) as ep:
        ref = await ep.reference(DISK_TASK)
        await run_until_paused(ep, "r", DISK_TASK)
        first = tmp_path / "agents" / "r" / "1"
        identity, notes = (first / "identity.txt").read_text(), (first / "notes.txt").read_text()
        made = (tmp_path / "agents", tmp_path / "agents" / "r", first)  # user data: only its user enters
        assert [d.stat().st_mode & 0o777 for d in made] == [0o700] * 3
        journaled = len(await kinds(ep, "r", 1, RelayExchange))
        ck = await ep.checkpoint()  # the agent is thinking: its directory and journal of one moment
        [snap] = await kinds(ep, "r", 1, AgentSandbox)
        assert (snap.provider, snap.exchanges, snap.files) == ("tree", journaled, 2)
        await ep.crash()
        ep.dep.restart(same_ports=True)
        attempt = await ep.continue_from("r", ck)
        out = await continued(ep, "r", attempt, DISK_TASK)

        same_episode(out, ref)
        # its files are the first attempt's: the id written once, on the first start, came back
        assert out["agent"]["disk"]["identity"] == identity != ref["agent"]["disk"]["identity"]
        assert notes and out["agent"]["disk"]["notes"] == ref["agent"]["disk"]["notes"]
        assert len(await kinds(ep, "r", attempt, RelayReplayed)) == journaled
        await assert_nothing_done_twice(ep, "r")
        assert not (tmp_path / "agents" / "r" / str(attempt)).exists()  # an attempt's directory goes with it


async def test_a_sandbox_that_does_not_go_with_the_journal_starts_the_rollout_over(
    snapshotting: Deployment, tmp_path: Path
) -> None:
    async with episodes(snapshotting) as ep:
        await run_until_paused(ep, "r", DISK_TASK)
        identity = (tmp_path / "agents" / "r" / "1" / "identity.txt").read_text()
        await ep.crash()  # no checkpoint while it ran: the tail's journal has exchanges, no snapshot
        ep.dep.restart(same_ports=True)
        attempt = await ep.continue_from("r", await ep.checkpoint())
        resp = await ep.post_run("r", attempt, DISK_TASK)
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "fresh_dispatch"
        assert "no tree sandbox snapshot at the cut" in resp.json()["error"]["message"]
        for kind in (RelayReplayed, RelayExchange):  # fail closed: nothing replayed, nothing went live
            assert await kinds(ep, "r", attempt, kind) == []
        fresh = await ep.fresh_dispatch("r")
        resp = await ep.post_run("r", fresh, DISK_TASK)
        assert resp.status_code == 200 and resp.json()["continued"] is False
        assert resp.json()["agent"]["disk"]["identity"] != identity  # from an empty directory, its own
