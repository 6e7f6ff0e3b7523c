"""NeMo Gym's ``/aggregate_metrics``: reward statistics per task and overall, and pass@k.

The statistics are NeMo Gym's ``RewardProfiler`` baseline (``mean/max/min/median/std`` of
``reward``). pass@k is its ``compute_pass_majority_metrics`` with the default score
(``accuracy`` = ``reward``), which its benchmarks' servers add through ``compute_metrics``
(``nemo_gym/reward_profile.py``, read 2026-12-03 at NVIDIA-NeMo/Gym 07d6b0d): for every k up to
the most rollouts any task has,

- ``pass@{k}/accuracy``: for binary rewards the combinatorial estimate ``1 - C(n-c, k) / C(n, k)``
  per task (``n`` rollouts, ``c`` correct), for continuous ones the best of the first ``k``;
- ``pass@1[avg-of-{k}]/accuracy``: the mean over the first ``k`` rollouts;

each averaged over the tasks that have enough rollouts, as a percentage. A task's rollouts are
ordered by ``_ng_rollout_index``. ``key_metrics`` are the means and the highest k of both.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..wire import NG_ROLLOUT_INDEX, NG_TASK_INDEX, ErrorKind, GymError

__all__ = ["aggregate_metrics", "pass_at_k", "verify_responses"]


def _stats(rewards: list[float]) -> dict[str, float]:
    return {
        "mean/reward": statistics.fmean(rewards),
        "max/reward": max(rewards),
        "min/reward": min(rewards),
        "median/reward": statistics.median(rewards),
        "std/reward": statistics.pstdev(rewards),
    }


def pass_at_k(tasks: list[list[float]]) -> dict[str, float]:
    """pass@k and pass@1[avg-of-k] of the ``accuracy`` score, k from 1 to the most rollouts of a task."""
    out: dict[str, float] = {}
    for k in range(1, max((len(t) for t in tasks), default=0) + 1):
        passes, averages = [], []
        for scores in tasks:
            if len(scores) >= k:
                if all(s in (0.0, 1.0) for s in scores):
                    wrong = sum(1 for s in scores if not s)
                    passes.append(1.0 if wrong < k else 1.0 - math.comb(wrong, k) / math.comb(len(scores), k))
                else:
                    passes.append(max(scores[:k]))
            if scores:
                averages.append(statistics.fmean(scores[:k]))
        if passes:
            out[f"pass@{k}/accuracy"] = 100.0 * statistics.fmean(passes)
        if averages:
            out[f"pass@1[avg-of-{k}]/accuracy"] = 100.0 * statistics.fmean(averages)
    return out


def verify_responses(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``verify_responses`` of an ``/aggregate_metrics`` body, or a 400."""
    responses = body.get("verify_responses")
    if not isinstance(responses, list) or not all(isinstance(v, dict) for v in responses):
        raise GymError(ErrorKind.BAD_REQUEST, "aggregate_metrics takes {verify_responses: [objects]}")
    return responses


def aggregate_metrics(verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
    """NeMo Gym's ``AggregateMetrics``: ``group_level_metrics`` per task, ``agent_metrics`` over every
    rollout (with pass@k), ``key_metrics`` the headline ones."""
    rewards = [float(v.get("reward") or 0.0) for v in verify_responses]
    if not rewards:
        return {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}
    by_task: dict[int, list[tuple[int, float]]] = {}
    for i, (v, r) in enumerate(zip(verify_responses, rewards, strict=True)):
        by_task.setdefault(int(v.get(NG_TASK_INDEX, 0)), []).append((int(v.get(NG_ROLLOUT_INDEX, i)), r))
    ordered = {t: [r for _, r in sorted(rs)] for t, rs in sorted(by_task.items())}
    agent = {**_stats(rewards), **pass_at_k(list(ordered.values()))}
    top = max(len(rs) for rs in ordered.values())
    headline = ("mean/reward", f"pass@{top}/accuracy", f"pass@1[avg-of-{top}]/accuracy")
    return {
        "group_level_metrics": [{NG_TASK_INDEX: t, **_stats(rs)} for t, rs in ordered.items()],
        "agent_metrics": agent,
        "key_metrics": {k: agent[k] for k in headline if k in agent},
    }
