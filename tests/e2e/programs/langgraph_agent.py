"""A LangGraph ReAct agent as an opaque agent: ``create_react_agent`` over LangChain's ``ChatOpenAI``
at ``OPENAI_BASE_URL`` (the relay) with the counter's two tools. A program of its own: LangGraph,
LangChain and ``httpx``, nothing of rollcut's."""

from __future__ import annotations

import json
import os
import sys

import httpx
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

TOOLS = httpx.Client(base_url=os.environ["ROLLCUT_TOOLS_URL"], timeout=600)


@tool
def add(n: int) -> str:
    """Add n to the counter."""
    return TOOLS.post("/add", json={"n": n}).raise_for_status().text


@tool
def read() -> str:
    """Read the counter."""
    return TOOLS.post("/read", json={}).raise_for_status().text


def main() -> int:
    task = json.loads(sys.stdin.read())
    model = ChatOpenAI(model=task.get("model", "rollcut-local"), timeout=600, max_retries=2)
    agent = create_react_agent(model, [add, read])
    limit = 2 * int(task.get("max_steps", 8)) + 1
    state = agent.invoke({"messages": [("user", task["prompt"])]}, {"recursion_limit": limit})
    print(json.dumps({"answer": str(state["messages"][-1].content)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
