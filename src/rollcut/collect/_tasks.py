"""The demo's generated task sets: a prompt, a seed and verify arguments per bundled environment."""

from __future__ import annotations

import random
from typing import Any

from ..gym import DEMO_ENVIRONMENTS

__all__ = ["demo_rows", "demo_tasks"]


def _task(kind: str, rng: random.Random) -> dict[str, Any]:
    """One generated task for environment ``kind`` (its prompt, seed and verify arguments)."""
    if kind == "counter":
        start = rng.randint(0, 9)
        return {
            "prompt": f"Starting at {start}, add numbers, then report the total.",
            "seed": {"start": start},
            "verify": {},
        }
    if kind == "blackjack":
        return {
            "prompt": "Play one hand of blackjack and try to win.",
            "seed": {"seed": rng.randint(0, 10_000)},
        }
    if kind in ("workplace", "workplace_exported"):
        who = rng.choice(_NAMES)
        return {
            "prompt": f"Email {who}, book a meeting, and mark {who} as won.",
            "seed": {"contacts": [{"name": who, "company": "Acme"}]},
            "verify": {"expect": {"crm": [{"name": who}]}},
        }
    if kind == "stateful_counter":
        start = rng.randint(0, 9)
        return {
            "prompt": f"The counter starts at {start}; increment it, then read it.",
            "seed": {"initial_count": start},
            "verify": {"expected_count": start + 3},
        }
    if kind == "math":
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return {"prompt": f"What is {a} + {b}?", "seed": {}, "verify": {"expected": str(a + b)}}
    if kind == "judge":
        return {
            "prompt": "Explain in one sentence why the sky is blue.",
            "seed": {},
            "verify": {"expect_words": ["light", "scatter"], "judge_delay_s": 0.05},
        }
    if kind == "scratchpad":
        return {"prompt": "Write down three ideas for a name.", "seed": {}}
    raise ValueError(f"no generated tasks for environment {kind!r}")


_NAMES = ["Ada", "Grace", "Linus", "Barbara", "Ken", "Margaret"]


def demo_tasks(n: int, seed: int, envs: tuple[str, ...] = DEMO_ENVIRONMENTS) -> list[dict[str, Any]]:
    """A generated task set, one environment of ``envs`` after the other (the demo's: counter,
    blackjack and workplace; a mixed collection: every bundled environment)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = envs[i % len(envs)]
        out.append({"id": f"t{i:04d}", "max_steps": 8, "env": kind, "verify": {}, **_task(kind, rng)})
    return out


def demo_rows(n: int, seed: int, envs: tuple[str, ...] = DEMO_ENVIRONMENTS) -> list[dict[str, Any]]:
    """The demo's task set as NeMo Gym input rows: ``responses_create_params``, ``agent_ref``, and the
    environment's own fields (``env``, ``seed``, ``verify``, ``max_steps``)."""
    return [
        {
            "responses_create_params": {"input": [{"role": "user", "content": t["prompt"]}], "tools": []},
            "agent_ref": {"type": "responses_api_agents", "name": "simple_agent"},
            **{k: t[k] for k in ("env", "seed", "verify", "max_steps")},
        }
        for t in demo_tasks(n, seed, envs)
    ]
