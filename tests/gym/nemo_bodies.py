"""Example bodies in NeMo Gym's shapes, written for rollcut's environments.

The shapes follow NeMo Gym's public repository (``nemo_gym/global_config.py``
for the ``_ng_*`` keys, ``nemo_gym/base_resources_server.py`` for the run,
verify and aggregate-metrics bodies, the ``data/example*.jsonl`` files of its
resources servers for rows): a run row is ``responses_create_params`` plus the
environment's own fields; a verify response is the row plus ``response`` and
``reward``.
"""

from __future__ import annotations

from typing import Any

COUNTER_ROW: dict[str, Any] = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "Starting at 3, add numbers, then report the total."}],
        "tools": [],
    },
    "agent_ref": {"type": "responses_api_agents", "name": "simple_agent"},
    "env": "counter",
    "seed": {"start": 3},
    "max_steps": 8,
}

VERIFY_RESPONSES: list[dict[str, Any]] = [
    {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0},
    {"_ng_task_index": 0, "_ng_rollout_index": 1, "reward": 1.0},
    {"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0},
    {"_ng_task_index": 1, "_ng_rollout_index": 1, "reward": 0.0},
]


def with_identity(row: dict[str, Any], rollout_id: str, *, attempt_index: int) -> dict[str, Any]:
    """The row as NeMo Gym's collection posts it: task and rollout indices, id and 0-based attempt."""
    task, _, repeat = rollout_id.partition("-")
    return {
        **row,
        "_ng_task_index": int(task),
        "_ng_rollout_index": int(repeat),
        "_ng_rollout_id": rollout_id,
        "_ng_attempt_index": attempt_index,
    }


STATEFUL_COUNTER_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "increment_counter",
        "description": "",
        "parameters": {
            "type": "object",
            "properties": {"count": {"type": "integer", "description": ""}},
            "required": ["count"],
            "additionalProperties": False,
        },
        "strict": True,
    },
    {
        "type": "function",
        "name": "get_counter_value",
        "description": "",
        "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
        "strict": True,
    },
]


def stateful_counter_rows(n: int, env: str = "stateful_counter") -> list[dict[str, Any]]:
    """Rows for the ported stateful counter, in the shape of its NeMo Gym example data."""
    rows = []
    for i in range(n):
        a, b, start = i % 5 + 1, i % 3 + 2, i % 7
        rows.append(
            {
                "responses_create_params": {
                    "input": [{"role": "user", "content": f"add {a} then add {b} then get the count"}],
                    "tools": STATEFUL_COUNTER_TOOLS,
                },
                "expected_count": start + a + b,
                "initial_count": start,
                "env": env,
            }
        )
    return rows
