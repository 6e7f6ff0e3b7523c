"""One crash of an opaque agent mid-episode, the same for every program: the stack it runs on, then
run it, wait until ``after`` of its requests are journaled, SIGKILL its agent server, checkpoint the
tail and continue the rollout, and say what the continued attempt's run answered and what the relay
did for it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from rollcut.bus import RelayDiverged, RelayExchange, RelayReplayed

from ..helpers import until
from .conftest import Deployment, deploy
from .episodes import Episodes


@contextlib.contextmanager
def relayed_stack(root: Path, command: str, **agent: Any) -> Iterator[Deployment]:
    """The counter environment with ``command`` as an opaque agent (replayable egress, and ``agent``'s
    other options); a token every 20 ms, so each model call takes a second or two: time to kill it
    mid-episode."""
    options = {"agent": "opaque", "command": command, "capability": "replayable_egress", **agent}
    with deploy(root, token_delay=0.02, tool_turns=3, envs=("counter",), agent_options=options) as dep:
        yield dep


@dataclass
class Continued:
    attempt: int
    answer: httpx.Response
    journaled: list[RelayExchange]  # what attempt 1 had journaled when it was killed
    replayed: list[RelayReplayed]
    diverged: list[RelayDiverged]


async def kinds(ep: Episodes, rid: str, attempt: int, kind: type) -> list[Any]:
    return [e for _, e in await ep.events(rid, attempt) if isinstance(e, kind)]


async def crash_mid_episode(ep: Episodes, rid: str, task: dict[str, Any], after: int = 2) -> Continued:
    await ep.log.dispatch(rid, task, instance="collector")
    ep.start_run(rid, 1, task)

    async def journaled() -> bool:
        return len(await kinds(ep, rid, 1, RelayExchange)) >= after

    await until(journaled, timeout=120, what=f"{after} requests of {rid} journaled")
    done = await kinds(ep, rid, 1, RelayExchange)
    ep.dep.crash_one("agent")  # its workers, the relay in them, and the agent's program
    await ep.runs_broken_off()
    attempt = await ep.continue_from(rid, await ep.checkpoint())
    answer = await ep.post_run(rid, attempt, task)
    return Continued(
        attempt,
        answer,
        done,
        await kinds(ep, rid, attempt, RelayReplayed),
        await kinds(ep, rid, attempt, RelayDiverged),
    )
