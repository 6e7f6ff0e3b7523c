"""An opaque agent's program is an attacker: what it prints and what it asks the relay for cannot
make a server fail (a 5xx) or reach past the relay."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rollcut.bus import RelayExchange
from rollcut.gym import AgentServe, cli_argv
from rollcut.gym.opaque import Capability

from ..e2e.conftest import Deployment, deploy
from ..e2e.episodes import Episodes, episodes
from ..helpers import until

HOSTILE = Path(__file__).with_name("programs") / "hostile_agent.py"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Deployment]:
    agent = {"agent": "opaque", "command": f"{sys.executable} {HOSTILE}", "capability": "replayable_egress"}
    with deploy(tmp_path, envs=("counter",), agent_options=agent) as dep:
        yield dep


@pytest.fixture
async def ep(stack: Deployment) -> AsyncIterator[Episodes]:
    async with episodes(stack) as e:
        yield e


async def _run(ep: Episodes, rid: str, mode: str, **more: object) -> tuple[int, dict[str, object]]:
    task = {"env": "counter", "prompt": mode, "seed": {"start": 1}, **more}
    await ep.log.dispatch(rid, task, instance="collector")
    agent = next(p for p in ep.dep.stack if p.name == "agent").url
    headers = {"x-rollout-id": rid, "x-rollout-attempt": "1"}
    resp = await ep.http.post(f"{agent}/run", json=task, headers=headers)
    return resp.status_code, resp.json()


@pytest.mark.parametrize("mode", ["nan", "deep", "surrogate", "infinity"])
async def test_an_answer_a_server_cannot_encode_fails_the_run_not_the_server(ep: Episodes, mode: str) -> None:
    status, body = await _run(ep, f"bad-{mode}", mode)
    assert status == 502, body
    assert body["error"]["code"] == "agent_failed"  # type: ignore[index]


async def test_the_relay_forwards_no_path_that_climbs_out_of_its_upstream(ep: Episodes) -> None:
    status, body = await _run(ep, "climber", "traverse")
    assert status == 200, body
    seen = json.loads(str(body["answer"]))
    assert set(seen.values()) == {400}, seen  # refused at the relay; /metrics and stats never reached
    journaled = [e for _, e in await ep.events("climber") if isinstance(e, RelayExchange)]
    assert journaled == []  # and nothing of it is on the log


async def test_the_program_reads_no_credential_reaches_no_bus_and_cannot_act_as_another_rollout(
    ep: Episodes,
) -> None:
    """The attack of finding 1 and 2: the program looks for the server's credentials (its parent's
    command line, the file by its path), connects to the bus, scans other processes for a victim's
    base URL, and calls the relay as a running victim, with and without its own token."""
    victim = asyncio.ensure_future(_run(ep, "victim", "sleep", seconds=15))
    agent = next(p for p in ep.dep.stack if p.name == "agent").url
    await until(lambda: _running(ep, agent), timeout=60, what="the victim's program running")
    status, body = await _run(
        ep, "attacker", "escape", credentials=str(ep.dep.creds), bus=ep.dep.url, victim="victim"
    )
    assert status == 200, body
    found = json.loads(str(body["answer"]))
    assert found["credentials_readable"] is False and found["parent_cmdline_names_credentials"] is False
    assert found["bus_reachable"] is False
    assert found["other_agent_environments"] == 0 and found["processes_seen"] <= 3  # its own pid namespace
    assert found["as_victim_with_own_token"] == 403 and found["as_victim_without_token"] == 403, found
    assert (await victim)[0] == 200
    journaled = [e for _, e in await ep.events("victim") if isinstance(e, RelayExchange)]
    assert journaled == []  # nothing was recorded as the victim's


async def _running(ep: Episodes, agent: str) -> bool:
    stats = (await ep.http.get(f"{agent}/rollcut/stats")).json()
    return bool(stats["running"])


def test_without_bubblewrap_the_server_refuses_to_start_unless_told_unisolated(tmp_path: Path) -> None:
    opts = AgentServe(
        url="nats://127.0.0.1:1",
        agent="opaque",
        model="http://m",
        resources={"counter": "http://r"},
        command=f"{sys.executable} {HOSTILE}",
        capability=Capability.REPLAYABLE_EGRESS,
    )
    no_bwrap = {**os.environ, "PATH": str(tmp_path), "COLUMNS": "300"}  # bwrap is not on this PATH
    argv = [sys.executable, "-m", "rollcut", "serve", *cli_argv(opts)]
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=no_bwrap)
    assert refused.returncode == 2, refused.stderr
    assert "bubblewrap" in refused.stderr and "--unisolated" in refused.stderr
    told = subprocess.run([*argv, "--unisolated"], capture_output=True, text=True, timeout=60, env=no_bwrap)
    assert "bubblewrap" not in told.stderr and "cannot connect to nats://127.0.0.1:1" in told.stderr


def test_a_killed_workers_relay_directory_is_swept_by_the_next_and_a_live_ones_kept() -> None:
    """A SIGKILLed worker runs no atexit: its relay directory (0700, in /tmp) is removed by the next
    worker that makes one, and only if the process its name holds is gone."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from rollcut.gym.opaque._kind import _relay_socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = Path(tempfile.mkdtemp(prefix=f"rollcut-relay-{dead.pid}-agent-w0-"))
    live = Path(tempfile.mkdtemp(prefix=f"rollcut-relay-{os.getppid()}-agent-w1-"))
    try:
        path, listener = _relay_socket("agent-w2")
        listener.close()
        assert not left.exists() and live.exists() and path.parent.exists()
    finally:
        for d in (left, live):
            if d.exists():
                d.rmdir()
