"""The demo's generated task sets: each environment supplies its own task (``demo_task(rng)``)."""

from __future__ import annotations

import json
import random
from typing import Any

from ..gym.resources import ENVIRONMENTS, nemo_gym_example_rows
from ..testing import DEMO_ENVIRONMENTS

__all__ = ["NEMO_GYM_DEMO", "demo_rows", "demo_tasks", "nemo_gym_rows"]

NEMO_GYM_DEMO = ("example_session_state_mgmt", "example_multi_step")
"""The NeMo Gym servers ``rollcut demo --nemo-gym`` runs, unmodified: one replayable, one stateless."""


def demo_tasks(n: int, seed: int, envs: tuple[str, ...] = DEMO_ENVIRONMENTS) -> list[dict[str, Any]]:
    """A generated task set, one environment of ``envs`` after the other (the demo's: counter,
    blackjack and workplace; a mixed collection: every bundled environment)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = envs[i % len(envs)]
        task = ENVIRONMENTS[kind].demo_task(rng)
        out.append({"id": f"t{i:04d}", "max_steps": 8, "env": kind, "verify": {}, **task})
    return out


def demo_rows(
    n: int, seed: int, envs: tuple[str, ...] = DEMO_ENVIRONMENTS, params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The demo's task set as NeMo Gym input rows: ``responses_create_params`` (with ``params``: more
    request settings, such as ``tool_choice``), ``agent_ref``, and the environment's own fields
    (``env``, ``seed``, ``verify``, ``max_steps``)."""
    return [
        {
            "responses_create_params": {
                "input": [{"role": "user", "content": t["prompt"]}],
                "tools": [],
                **(params or {}),
            },
            "agent_ref": {"type": "responses_api_agents", "name": "simple_agent"},
            **{k: t[k] for k in ("env", "seed", "verify", "max_steps")},
        }
        for t in demo_tasks(n, seed, envs)
    ]


def nemo_gym_rows(n: int, servers: tuple[str, ...] = NEMO_GYM_DEMO) -> list[dict[str, Any]]:
    """``n`` rows of NeMo Gym's own example data (``data/example.jsonl`` of each server in the installed
    wheel), the servers taken in turn, each row as it ships plus ``env`` naming its server (the only
    thing rollcut adds: which of several resources servers the Simple Agent sends it to)."""
    data = {s: [json.loads(line) for line in nemo_gym_example_rows(s)] for s in servers}
    return [
        {**data[s][(i // len(servers)) % len(data[s])], "env": s}
        for i in range(n)
        for s in [servers[i % len(servers)]]
    ]
