"""An opaque agent's program is an attacker: what it prints and what it asks the relay for cannot
make a server fail (a 5xx) or reach past the relay."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rollcut.bus import RelayExchange

from ..e2e.conftest import Deployment, deploy
from ..e2e.episodes import Episodes, episodes

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


async def _run(ep: Episodes, rid: str, mode: str) -> tuple[int, dict[str, object]]:
    task = {"env": "counter", "prompt": mode, "seed": {"start": 1}}
    await ep.log.dispatch(rid, task, instance="collector")
    agent = next(p for p in ep.dep.stack if p.name == "agent").url
    headers = {"x-rollout-id": rid, "x-rollout-attempt": "1"}
    resp = await ep.http.post(f"{agent}/run", json=task, headers=headers)
    return resp.status_code, resp.json()


@pytest.mark.parametrize("mode", ["nan", "deep", "surrogate", "infinity"])
async def test_an_answer_a_server_cannot_encode_fails_the_run_not_the_server(ep: Episodes, mode: str) -> None:
    status, body = await _run(ep, f"bad-{mode}", mode)
    assert status == 502, body
    assert body["error"]["type"] == "agent_failed"  # type: ignore[index]


async def test_the_relay_forwards_no_path_that_climbs_out_of_its_upstream(ep: Episodes) -> None:
    status, body = await _run(ep, "climber", "traverse")
    assert status == 200, body
    seen = json.loads(str(body["answer"]))
    assert set(seen.values()) == {400}, seen  # refused at the relay; /metrics and stats never reached
    journaled = [e for _, e in await ep.events("climber") if isinstance(e, RelayExchange)]
    assert journaled == []  # and nothing of it is on the log
