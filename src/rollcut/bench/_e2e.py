"""``rollcut bench e2e``: the demo workload with one crash, recovered three ways.

- ``rollcut``: seal the stream's tail, continue every rollout from it;
- ``last_checkpoint``: continue from the last checkpoint published before the crash only;
- ``restart``: every unfinished rollout from its input (what a framework without
  partial-rollout checkpointing does).

Each way runs the same task set with the same seed and crash rule, on fresh
servers, one after the other in this process. With ``engine`` the policy model is a
real inference engine (llama.cpp's server on the tiny model, started per way), and a
fourth way is possible: ``excluded``, rollcut's recovery with generation cuts off (a
call running at a checkpoint is generated again from its start), with what the engine
generated for nothing in each way from its own token counter. ``workers`` gives every server
that many worker processes (before the crash and after it); ``mixed`` runs
every bundled environment instead of the demo's three, so growth with the
number of rollouts, workers and servers shows in ``wall_s``, the checkpoint
times and each server's peak memory.
"""

from __future__ import annotations

from typing import Any

from ..collect import run_demo
from ..gym import DEMO_ENVIRONMENTS
from ..gym.resources import ENVIRONMENTS
from ..participants import RecoveryMode

__all__ = ["WAYS", "bench_e2e"]

WAYS = {
    "rollcut": RecoveryMode.TAIL,
    "last_checkpoint": RecoveryMode.CHECKPOINT,
    "restart": RecoveryMode.RESTART,
    "excluded": RecoveryMode.TAIL,  # with an engine: rollcut's recovery, generation cuts off
}
"""The recoveries compared, by name."""


async def bench_e2e(
    *,
    rollouts: int = 64,
    seed: int = 0,
    workers: int | None = None,
    mixed: bool = False,
    ways: tuple[str, ...] = tuple(WAYS),
    checkpoint_every_s: float = 0.5,
    concurrency: int = 16,
    engine: str | None = None,
) -> dict[str, Any]:
    """One crash recovered each of ``ways``: rollcut, last checkpoint only, restart from input (and,
    on an engine, rollcut without generation cuts)."""
    if engine is None and "excluded" in ways:
        raise ValueError("the excluded way compares generation cuts on an engine: give engine")
    envs = tuple(ENVIRONMENTS) if mixed else DEMO_ENVIRONMENTS
    out: dict[str, Any] = {
        "rollouts": rollouts,
        "workers": workers,
        "environments": list(envs),
        "checkpoint_every_s": checkpoint_every_s,
        "concurrency": concurrency,
        "engine": engine,
    }
    for name in ways:
        r = await run_demo(
            rollouts=rollouts,
            seed=seed,
            crash=True,
            recovery=WAYS[name],
            envs=envs,
            workers=(workers, workers),
            checkpoint_every_s=checkpoint_every_s,
            concurrency=concurrency,
            engine=engine,
            engine_cuts=name != "excluded",
        )
        out[name] = {
            "model_calls_regenerated": r["model_calls"]["regenerated_after_crash"],
            "model_calls_regenerated_while_continuing": r["model_calls"]["regenerated_while_continuing"],
            "tokens_regenerated": r["tokens_regenerated"],
            "model_calls_generated": r["model_calls"]["generated"],
            "duplicate_results": r["duplicate_results"],
            "results_written": r["results_written"],
            "checkpoints_published": r["checkpoints_published"],
            "checkpoint_ms_p50": r["checkpoint_ms_p50"],
            "checkpoint_ms_p99": r["checkpoint_ms_p99"],
            "checkpoint_pause_ms_p50": r["checkpoint_pause_ms_p50"],
            "checkpoint_pause_ms_p99": r["checkpoint_pause_ms_p99"],
            "peak_rss_mb": r["peak_rss_mb"],
            "wall_s": r["wall_s"],
            "engine": r["engine"],
        }
    return out
