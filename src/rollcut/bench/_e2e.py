"""``rollcut bench e2e``: the demo workload with one crash, recovered three ways.

- ``rollcut``: seal the stream's tail, continue every rollout from it;
- ``last_checkpoint``: continue from the last checkpoint published before the crash only;
- ``restart``: every unfinished rollout from its input (what a framework without
  partial-rollout checkpointing does).

Each way runs the same task set with the same seed and crash rule, on fresh
servers, one after the other in this process.
"""

from __future__ import annotations

from typing import Any

from ..collect import run_demo
from ..participants import RecoveryMode

__all__ = ["bench_e2e"]


async def bench_e2e(*, rollouts: int = 64, seed: int = 0) -> dict[str, Any]:
    """One crash recovered three ways: rollcut, last checkpoint only, restart from input."""
    out: dict[str, Any] = {"rollouts": rollouts}
    for name, mode in (
        ("rollcut", RecoveryMode.TAIL),
        ("last_checkpoint", RecoveryMode.CHECKPOINT),
        ("restart", RecoveryMode.RESTART),
    ):
        r = await run_demo(rollouts=rollouts, seed=seed, crash=True, recovery=mode)
        out[name] = {
            "model_calls_regenerated": r["model_calls"]["regenerated_after_crash"],
            "tokens_regenerated": r["tokens_regenerated"],
            "model_calls_generated": r["model_calls"]["generated"],
            "duplicate_results": r["duplicate_results"],
            "results_written": r["results_written"],
            "wall_s": r["wall_s"],
        }
    return out
