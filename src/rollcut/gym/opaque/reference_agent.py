"""The reference opaque agent: a multi-turn, tool-using loop that knows nothing of rollcut.

A separate program (run as ``python reference_agent.py``; it imports the
``openai`` SDK and ``httpx`` and nothing of rollcut's), standing in for the
agents rollcut cannot instrument. It reads its task as JSON on stdin, talks to
the model at ``OPENAI_BASE_URL`` through the official client (streaming every
other turn) and to its tools over plain HTTP at ``ROLLCUT_TOOLS_URL``, keeps its
own state (a notes list it feeds back to the model, a running total), and
prints its answer as one JSON line on stdout.

It is deterministic given identical answers, so a relay that replays its
journal byte for byte gets the same episode. ``--nonce`` (or the task's
``"nonce": true``) makes it not: it writes a random scratch id into its notes,
so its second model request differs on every run, and a replay must detect it
there. A task's ``pause_after_turn`` and ``pause_s`` make it stop and think
after that turn (work of its own, between two requests). A task's ``"disk": true``
makes it keep files in its working directory, as agents that keep notes or a
repository on disk do: ``identity.txt``, a random id written once (on its first
start, so only a restored directory holds the first run's), and ``notes.txt``, its
notes rewritten after every turn; its answer then reports both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import sys
import time
from typing import Any

import httpx
from openai import OpenAI


def _streamed(client: OpenAI, **params: Any) -> dict[str, Any]:
    """One streamed completion, put back together as a message."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(stream=True, **params):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            content.append(delta.content)
        for tc in delta.tool_calls or []:
            call = calls.setdefault(
                tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            )
            call["id"] = tc.id or call["id"]
            if tc.function is not None:
                call["function"]["name"] += tc.function.name or ""
                call["function"]["arguments"] += tc.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def _plain(client: OpenAI, **params: Any) -> dict[str, Any]:
    message = client.chat.completions.create(**params).choices[0].message
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [tc.model_dump() for tc in message.tool_calls]
    return out


def _prompt(task: dict[str, Any]) -> str:
    """The task's prompt: rollcut's ``prompt``, or the user text of a NeMo Gym row's Responses input."""
    if "prompt" in task or "responses_create_params" not in task:
        return str(task["prompt"])
    given = task["responses_create_params"].get("input")
    if isinstance(given, str):
        return given
    texts = []
    for item in given or []:
        content = item.get("content") if isinstance(item, dict) and item.get("role") == "user" else None
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if content:
            texts.append(str(content))
    return "\n".join(texts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nonce", action="store_true", help="not deterministic: a random id in its notes")
    args = parser.parse_args()
    task = json.load(sys.stdin)
    client = OpenAI(timeout=600)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    tools_http = httpx.Client(base_url=os.environ["ROLLCUT_TOOLS_URL"], timeout=600)
    tools = tools_http.get("/tools").json()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent. Use the tools, then answer."},
        {"role": "user", "content": _prompt(task)},
    ]
    notes: list[str] = []
    total = 0
    answer, turns = "", 0
    disk = bool(task.get("disk"))
    if disk and not os.path.exists("identity.txt"):
        with open("identity.txt", "w") as f:
            f.write(secrets.token_hex(8))
    for turn in range(int(task.get("max_steps", 8))):
        params = {
            "model": task.get("model", "rollcut-local"),  # the model server's default served name
            "messages": messages,
            "tools": tools,
            "max_tokens": int(task.get("max_tokens", 256)),
        }
        message = _streamed(client, **params) if turn % 2 else _plain(client, **params)
        messages.append(message)
        if not message.get("tool_calls"):
            answer = message.get("content") or ""
            break
        for call in message["tool_calls"]:
            fn = call["function"]
            resp = tools_http.post(f"/{fn['name']}", json=json.loads(fn["arguments"] or "{}"))
            resp.raise_for_status()
            result = resp.json().get("result")
            value = result.get("value") if isinstance(result, dict) else None
            total += value if isinstance(value, int) else 0
            notes.append(f"{fn['name']} -> {json.dumps(result, sort_keys=True)}")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
        turns = turn + 1
        if disk:
            with open("notes.txt", "w") as f:
                f.write("\n".join(notes))
        if turns == task.get("pause_after_turn"):
            time.sleep(float(task.get("pause_s", 0)))  # thinking, or work of its own the relay cannot see
        scratch = f" (scratch id {secrets.token_hex(4)})" if args.nonce or task.get("nonce") else ""
        messages.append({"role": "user", "content": f"Notes so far{scratch}: {'; '.join(notes)}"})
    state = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
    out = {"answer": answer, "turns": turns, "notes": notes, "total": total, "state": state}
    if disk:
        with open("identity.txt") as f, open("notes.txt") as g:
            out["disk"] = {"identity": f.read(), "notes": g.read()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
