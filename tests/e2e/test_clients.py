"""Agent frameworks nobody here wrote, as opaque agents behind the relay through a SIGKILL: the
OpenAI Agents SDK (Responses model, and chat completions streamed) and a LangGraph ReAct agent over
LangChain's ``ChatOpenAI``. Each runs the counter task against the model server through the relay;
its agent server is killed after two journaled requests; the continued attempt's new process is
answered from the journal: every journaled exchange replayed, none diverged, no model call
generated again, the episode finished."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import Deployment
from .episodes import Episodes, episodes
from .relayed import crash_mid_episode, relayed_stack

pytestmark = pytest.mark.slow

PROGRAMS = Path(__file__).with_name("programs")
CLIENTS = {
    "agents_sdk_responses": ("agents_sdk_agent.py", {}),
    "agents_sdk_chat_streamed": ("agents_sdk_agent.py", {"api": "chat", "streamed": True}),
    "langgraph_react": ("langgraph_agent.py", {}),
}
TASK = {
    "id": "count",
    "env": "counter",
    "prompt": "Count up from 3, then say the total.",
    "seed": {"start": 3},
}


@pytest.fixture(params=sorted(CLIENTS))
def client(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    program, options = CLIENTS[request.param]
    return program, {**TASK, **options}


@pytest.fixture
def dep(client: tuple[str, dict[str, Any]], tmp_path: Path) -> Iterator[Deployment]:
    with relayed_stack(tmp_path, f"{sys.executable} {PROGRAMS / client[0]}") as d:
        yield d


@pytest.fixture
async def ep(dep: Deployment) -> AsyncIterator[Episodes]:
    async with episodes(dep) as e:
        yield e


async def test_a_framework_agent_killed_mid_episode_is_answered_from_the_journal(
    ep: Episodes, client: tuple[str, dict[str, Any]]
) -> None:
    run = await crash_mid_episode(ep, "r", client[1])
    assert run.answer.status_code == 200, run.answer.text
    out = run.answer.json()
    assert out["continued"] is True and out["answer"], out
    assert [e.n for e in run.replayed] == [e.n for e in run.journaled] and run.diverged == []
    assert await ep.regenerated("r") == []  # no model call generated again
    assert await ep.reapplied("r") == []  # no tool call executed again
