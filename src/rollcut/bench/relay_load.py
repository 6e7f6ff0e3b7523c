"""The load ``rollcut bench relay`` runs as an opaque agent: model calls through the relay and straight
to the model server, alternating, each timed.

A program of its own (``httpx`` and the standard library; nothing of rollcut's), started by the opaque
agent server like any opaque agent. Its task (stdin) says how many pairs to make and the model server's
own URL; each relay call and each direct call asks something new (a call is never joined or reused
within an attempt), and the same sequence again in a continued attempt, so the relay answers all of
it from the journal then. Prints ``{"answer": "", "relay_ms": [...], "direct_ms": [...]}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import httpx


def main() -> int:
    task = json.load(sys.stdin)
    calls, direct = int(task["calls"]), str(task["direct"]).rstrip("/")
    identity = {"x-rollout-id": task["rollout"], "x-rollout-attempt": str(task["attempt"])}
    relay_ms: list[float] = []
    direct_ms: list[float] = []
    with (
        httpx.Client(base_url=os.environ["OPENAI_BASE_URL"], timeout=120) as relay,
        httpx.Client(timeout=120) as plain,
    ):
        for i in range(calls):
            for via, url, headers, out in (
                (relay, "/chat/completions", {}, relay_ms),
                (plain, f"{direct}/v1/chat/completions", identity, direct_ms),
            ):
                kind = "relay" if via is relay else "direct"
                body = {
                    "model": "rollcut-local",
                    "messages": [{"role": "user", "content": f"{kind} {i}"}],
                    "max_tokens": 16,
                }
                t0 = time.perf_counter()
                via.post(url, json=body, headers=headers).raise_for_status()
                out.append((time.perf_counter() - t0) * 1000)
    print(json.dumps({"answer": "", "relay_ms": relay_ms, "direct_ms": direct_ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
