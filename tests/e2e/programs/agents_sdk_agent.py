"""The OpenAI Agents SDK as an opaque agent: an ``Agent`` with the counter's two tools, run by its
``Runner`` against ``OPENAI_BASE_URL`` (the relay), on the Responses API or chat completions
(the task's ``"api"``), plainly or streamed (``"streamed": true``). A program of its own: it
imports the SDK, ``openai`` and ``httpx``, nothing of rollcut's."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)  # its default exports traces to OpenAI: there is no way out of the sandbox
TOOLS = httpx.AsyncClient(base_url=os.environ["ROLLCUT_TOOLS_URL"], timeout=600)


@function_tool
async def add(n: int) -> str:
    """Add n to the counter."""
    return (await TOOLS.post("/add", json={"n": n})).raise_for_status().text


@function_tool
async def read() -> str:
    """Read the counter."""
    return (await TOOLS.post("/read", json={})).raise_for_status().text


async def main() -> int:
    task = json.loads(sys.stdin.read())
    client = AsyncOpenAI(timeout=600)  # OPENAI_BASE_URL, OPENAI_API_KEY from the environment
    name = task.get("model", "rollcut-local")
    chat = task.get("api") == "chat"
    model = OpenAIChatCompletionsModel(name, client) if chat else OpenAIResponsesModel(name, client)
    agent = Agent(
        name="counter",
        instructions=task.get("instructions", "Count with the tools."),
        tools=[add, read],
        model=model,
    )
    turns = int(task.get("max_steps", 8))
    if task.get("streamed"):
        run = Runner.run_streamed(agent, task["prompt"], max_turns=turns)
        async for _ in run.stream_events():
            pass
        answer = run.final_output
    else:
        answer = (await Runner.run(agent, task["prompt"], max_turns=turns)).final_output
    print(json.dumps({"answer": str(answer)}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
