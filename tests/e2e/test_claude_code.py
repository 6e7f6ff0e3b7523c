"""Claude Code, the real ``claude`` CLI from npm, as an opaque agent behind the relay: it speaks
Anthropic's Messages API to the model server through the relay, its agent server is SIGKILLed
mid-episode, and the continued attempt's new ``claude`` process is answered from the journal.

Two runs of Claude Code never send the same first request: ``metadata.user_id`` holds a device and
a session id drawn per process (and the system prompt holds the date). Without the agent's declared
normalisation the replay diverges at request 1 and the rollout starts over (the same-history guarantee
at work); with exactly the rules docs/opaque-agents.md justifies, it replays, diverges nowhere, and
the model server generates nothing again."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rollcut.bus import ModelCallCompleted
from rollcut.gym.opaque import CLAUDE_CODE_AGENT

from ..claude_code import CLAUDE_CODE_RULES, claude_code
from .conftest import Deployment
from .episodes import Episodes, episodes
from .relayed import crash_mid_episode, kinds, relayed_stack

pytestmark = pytest.mark.slow

# Read: the local model calls it with arguments of its own (a file that is not there); Claude Code
# answers each call with the same error, so the episode is a few model calls and tool rounds
TASK = {"id": "cc", "env": "counter", "prompt": "What is in notes.txt?", "tools": "Read", "max_turns": 6}


@pytest.fixture(params=["declared", "undeclared"])
def dep(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Deployment]:
    command = f"{sys.executable} {CLAUDE_CODE_AGENT} --claude {claude_code()}"
    with relayed_stack(
        tmp_path, command, normalise=CLAUDE_CODE_RULES if request.param == "declared" else []
    ) as d:
        yield d


@pytest.fixture
async def ep(dep: Deployment) -> AsyncIterator[Episodes]:
    async with episodes(dep) as e:
        yield e


async def test_claude_code_killed_mid_episode_is_replayed_only_under_its_declared_rules(
    ep: Episodes, dep: Deployment
) -> None:
    declared = bool(dep.stack_options["agent_options"]["normalise"])
    run = await crash_mid_episode(ep, "r", TASK)  # two model calls answered, a tool round between them
    assert all(e.route.startswith("/v1/messages") for e in run.journaled), [e.route for e in run.journaled]
    if not declared:  # a new process's session id: request 1 is not the journal's request 1
        assert run.answer.status_code == 409, run.answer.text
        assert run.answer.json()["error"]["code"] == "fresh_dispatch"
        assert [d.n for d in run.diverged] == [1] and run.replayed == []
        assert await kinds(ep, "r", run.attempt, ModelCallCompleted) == []  # nothing of it went live
        return
    assert run.answer.status_code == 200, run.answer.text
    out = run.answer.json()
    assert out["continued"] is True and isinstance(out["answer"], str), out
    assert [e.n for e in run.replayed] == [e.n for e in run.journaled] and run.diverged == []
    assert await ep.regenerated("r") == []  # no model call generated again
