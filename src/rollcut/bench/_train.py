"""``rollcut bench train``: a GRPO loop whose completions are rollcut's rollouts, against TRL's own
generation path on the same tiny policy with the same config, in the same run.

Each repeat trains both ways from the same seeded policy: TRL generating in the trainer with
``transformers`` (the baseline: no custody, no checkpoints, no engine), and rollcut's rollouts
(:func:`rollcut.integrations.trl.train_letters`). The figure is training tokens per second, the
trainer's own count (``num_input_tokens_seen``: prompt and completion tokens) over the time
``train()`` took; ``vs_trl`` is the ratio, with its spread over the repeats.

With ``max_staleness`` above 0, a third way: rollcut's loop collecting that many steps ahead
while the trainer trains (``pipelined_tokens_per_s``, and ``pipelined_vs_sync`` against rollcut's
synchronous loop in the same repeat).

With ``crash``, also what a crash costs the trainer, in wall seconds, two ways on copies of the
same fault (``python -m rollcut.integrations.trl``, the loop SIGKILLed in the middle of the
middle step, then the same command again): **rollcut** resumes from the global checkpoint and
the interrupted step keeps its finished rollouts; **restart** resumes from the same checkpoint
but collects the interrupted step again from nothing, as a loop that keeps no rollout across a
crash does. The cost is (the killed run + the resumed run) minus a crash-free run of the same
steps, each a whole process (imports, the deployment's start, the engine).
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._spread import spread

__all__ = ["bench_train"]


def _timed(home: Path, steps: int, generations: int, *extra: str) -> tuple[float, dict[str, Any] | None]:
    """One run of the GRPO command as its own process: its wall time and its JSON (None if killed)."""
    argv = [sys.executable, "-m", "rollcut.integrations.trl", "--steps", str(steps), "--json"]
    argv += ["--generations", str(generations), "--concurrency", "2", "--home", str(home), *extra]
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - t0
    if done.returncode == -signal.SIGKILL and "--crash-at-step" in extra:
        return wall, None
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:4])} exited {done.returncode}: {done.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return wall, out


def _crash_cost(steps: int, generations: int, repeat: int) -> dict[str, Any]:
    at = steps // 2
    cost: dict[str, list[float]] = {"rollcut": [], "restart": []}
    kept: list[int] = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="rollcut-bench-crash-") as tmp:
            base, _ = _timed(Path(tmp) / "base", steps, generations)
            for way, extra in (("rollcut", ()), ("restart", ("--restart-step",))):
                home = Path(tmp) / way
                killed, _ = _timed(home, steps, generations, "--crash-at-step", str(at))
                resumed, out = _timed(home, steps, generations, *extra)
                if out is None:
                    raise RuntimeError(f"{way}: the resumed run was killed")
                cost[way].append(killed + resumed - base)
                if way == "rollcut":
                    kept.append(out["per_step"][0]["recovered"].get("completed", 0))
    return {
        "crash_at_step": at,
        "crash_cost_s": {way: spread(v, 2) for way, v in cost.items()},
        "rollouts_kept_across_the_crash": kept,  # rollcut's: rows of the interrupted step not collected again
    }


def _run(
    steps: int, repeat: int, generations: int, crash: bool, max_staleness: int, completion_tokens: int
) -> dict[str, Any]:
    from ..integrations.trl import train_letters

    same = {"steps": steps, "generations": generations, "completion_tokens": completion_tokens}
    train = functools.partial(
        train_letters, steps=steps, generations=generations, completion_tokens=completion_tokens
    )
    runs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    ahead: list[dict[str, Any]] = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="rollcut-bench-train-") as tmp:
            trl = train(Path(tmp) / "trl", through_rollcut=False)
            ours = train(Path(tmp) / "rollcut")
            if max_staleness > 0:
                ahead.append(train(Path(tmp) / "ahead", max_staleness=max_staleness))
        runs.append((trl, ours))
    rollcut = [o for _, o in runs] + ahead
    pipelined = (
        {
            "max_staleness": max_staleness,
            "pipelined_tokens_per_s": spread([a["tokens_per_s"] for a in ahead], 1),
            "pipelined_vs_sync": spread(
                [a["tokens_per_s"] / o["tokens_per_s"] for (_, o), a in zip(runs, ahead, strict=True)]
            ),
            "rollouts_across_update": sum(a["rollouts_across_update"] for a in ahead),
            # of the collections' own time, the share the trainer did not wait for (ran while it trained)
            "collection_hidden": spread([1 - a["trainer_waited_s"] / a["collect_s"] for a in ahead]),
        }
        if ahead
        else {}
    )
    return {
        **same,
        "repeat": repeat,
        "trl_tokens_per_s": spread([t["tokens_per_s"] for t, _ in runs], 1),
        "rollcut_tokens_per_s": spread([o["tokens_per_s"] for _, o in runs], 1),
        "vs_trl": spread([o["tokens_per_s"] / t["tokens_per_s"] for t, o in runs]),
        **pipelined,
        "rollouts_consumed": sum(o["rollouts_consumed"] for o in rollcut),
        "rollouts_consumed_twice": sum(o["rollouts_consumed_twice"] for o in rollcut),
        "logprob_max_abs_delta": max(o["logprob_max_abs_delta"] for o in rollcut),
        **(_crash_cost(steps, generations, repeat) if crash else {}),
    }


async def bench_train(
    *,
    steps: int = 8,
    repeat: int = 3,
    generations: int = 8,
    crash: bool = False,
    max_staleness: int = 0,
    completion_tokens: int = 16,
) -> dict[str, Any]:
    """See the module's docstring. The trainer runs in a thread: it drives its own event loops."""
    return await asyncio.to_thread(_run, steps, repeat, generations, crash, max_staleness, completion_tokens)
