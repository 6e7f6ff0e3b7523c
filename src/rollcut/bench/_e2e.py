"""``rollcut bench e2e``: the demo workload with one crash, recovered each way.

- ``rollcut``: seal the stream's tail, continue every rollout from it;
- ``last_checkpoint``: continue from the last checkpoint published before the crash only;
- ``restart``: every unfinished rollout from its input (what a framework without
  partial-rollout checkpointing does).

These three recover *the same crash*: the collection is copied at the crash (every
process stopped) once per alternative, rollcut recovers the original and each
alternative its copy, on fresh servers, one after the other in this process
(``run_demo``'s comparison). With ``engine`` the policy model is a real inference
engine (llama.cpp's server on the tiny model), and a fourth way is possible:
``excluded``, rollcut's recovery with generation cuts off (a call running at a
checkpoint is generated again from its start). Cuts change what is recorded before
the crash, so ``excluded`` is a run of its own with the same crash rule, not a copy;
its engine counter is its own. ``workers`` gives every server that many worker
processes (before the crash and after it); ``mixed`` runs every bundled environment
instead of the demo's three, so growth with the number of rollouts, workers and
servers shows in ``wall_s``, the checkpoint times and each server's peak memory. With
``agent="opaque"`` the rollouts are run by the reference opaque agent behind the journaling relay:
``rollcut`` is then journal replay (``exchanges_replayed``), ``restart`` starting it over from its
input.

Without a crash (``crash=False``) it measures throughput instead: ``rollcut``'s collection against
``plain``, the same stack without custody, ``repeat`` times each (:mod:`._throughput`: ``vs_plain``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..demo import ALTERNATIVES, run_demo
from ..gym.resources import ENVIRONMENTS
from ..participants import RecoveryMode
from ..testing import DEMO_ENVIRONMENTS
from ._spread import spread
from ._throughput import PLAIN, bench_throughput

__all__ = ["WAYS", "bench_e2e"]

WAYS = {
    "rollcut": RecoveryMode.TAIL,
    "last_checkpoint": RecoveryMode.CHECKPOINT,
    "restart": RecoveryMode.RESTART,
    "excluded": RecoveryMode.TAIL,  # with an engine: rollcut's recovery, generation cuts off
}
"""The recoveries compared, by name."""

THROUGHPUT_WAYS = ("rollcut", PLAIN)
"""What runs without a crash: rollcut's collection, and the same stack without custody."""


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
    agent: str = "simple",
    intervals: tuple[float, ...] = (),
    home: Path | None = None,
    crash: bool = True,
    repeat: int = 1,
    paced: bool = False,
    engine_model: str = "tiny",
) -> dict[str, Any]:
    """One crash recovered each of ``ways``: rollcut, last checkpoint only, restart from input (the
    same crash, on copies), and, on an engine, rollcut without generation cuts (a run of its own).
    ``intervals``: the same crash recovered the last-checkpoint way at each checkpoint interval too
    (``curve``: the work done again per way and interval). ``home``: where the main run is kept.
    With ``repeat``, that many crashes (seeds ``seed``, ``seed + 1``, ...; the first kept in ``home``):
    each way's seconds to finish after each, and rollcut's over restart's per crash
    (``after_crash_vs_restart``, median and range). ``paced``: the local model decodes at a real
    model's pace (``rollcut demo``'s default), so those seconds follow the tokens; ``engine_model``:
    the model llama.cpp's server runs (``gemma-3-270m``: the Gemma demo's).
    Without ``crash``: the throughput of ``ways`` among :data:`THROUGHPUT_WAYS`, ``repeat`` times."""
    if engine is None and "excluded" in ways:
        raise ValueError("the excluded way compares generation cuts on an engine: give engine")
    if crash and PLAIN in ways:
        raise ValueError("plain measures throughput without a crash: crash=False")
    if paced and engine is not None:
        raise ValueError("paced paces the local model: no engine")
    if PLAIN in ways and agent != "simple":
        raise ValueError("the plain stack runs the Simple Agent: agent='simple'")
    if not crash and (set(ways) - set(THROUGHPUT_WAYS) or intervals or home is not None):
        raise ValueError(f"without a crash only {', '.join(THROUGHPUT_WAYS)} run (no intervals, no home)")
    envs = tuple(ENVIRONMENTS) if mixed else DEMO_ENVIRONMENTS
    common: dict[str, Any] = {
        "rollouts": rollouts,
        "seed": seed,
        "crash": True,
        "envs": envs,
        "workers": (workers, workers),
        "checkpoint_every_s": checkpoint_every_s,
        "concurrency": concurrency,
        "engine": engine,
        "engine_model": engine_model,
        "agent": agent,
        "paced": paced,
    }
    said = ("rollouts", "checkpoint_every_s", "concurrency", "engine", "engine_model", "agent", "paced")
    out: dict[str, Any] = {k: common[k] for k in said} | {"workers": workers, "environments": list(envs)}
    if not crash:
        return {
            **out,
            **await bench_throughput(common, ways, repeat),
        }
    recovered = [w for w in ("rollcut", *ALTERNATIVES) if w in ways]
    if recovered:
        seconds: dict[str, list[float | None]] = {w: [] for w in recovered}
        for i in range(repeat):
            run = await run_demo(
                **{**common, "seed": seed + i},
                compare=tuple(w for w in ALTERNATIVES if w in ways),
                baseline_intervals=intervals,
                home=home if i == 0 else None,
            )
            for way in recovered:
                cost = (run["compared"] or {}).get(way)  # None: the rollouts finished before the crash
                seconds[way].append(cost["after_crash_s"] if cost else None)
                if i == 0:
                    out[way] = cost
            if i == 0:
                out["crash"] = run["crash"]
                out["curve"] = _curve(run) if intervals else None
        out["after_crash_s"] = seconds
        out["after_crash_vs_restart"] = _vs_restart(seconds)
    if "excluded" in ways:
        run = await run_demo(**common, engine_cuts=False)
        out["excluded"] = (run["compared"] or {}).get("rollcut")
    return out


def _vs_restart(seconds: dict[str, list[float | None]]) -> dict[str, float] | None:
    """rollcut's seconds to finish over restart's, per crash (the same crash: copies), spread."""
    pairs = zip(seconds.get("rollcut") or [], seconds.get("restart") or [], strict=False)
    ratios = [r / s for r, s in pairs if r is not None and s]
    return spread(ratios) if ratios else None


def _curve(run: dict[str, Any]) -> dict[str, Any] | None:
    """Work done again per way against the interval: rollcut and restart do not depend on it."""
    by_interval = run.get("by_interval") or {}
    compared = run.get("compared") or {}
    if not by_interval:
        return None  # the rollouts finished before the crash

    def lost(cost: dict[str, Any] | None) -> dict[str, Any] | None:
        keys = ("model_calls_regenerated", "tokens_regenerated", "tool_calls_reexecuted", "after_crash_s")
        return {k: cost[k] for k in keys} if cost else None

    return {
        "intervals_s": [float(k) for k in by_interval],
        "last_checkpoint": [
            {**(lost(v) or {}), "checkpoint_age_s": v["baseline"]["checkpoint_age_s"]}
            for v in by_interval.values()
        ],
        "rollcut": lost(compared.get("rollcut")),
        "restart": lost(compared.get("restart")),
    }
