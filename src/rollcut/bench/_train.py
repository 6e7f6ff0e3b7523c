"""``rollcut bench train``: a GRPO loop whose completions are rollcut's rollouts, against TRL's own
generation path on the same tiny policy with the same config, in the same run.

Each repeat trains both ways from the same seeded policy: TRL generating in the trainer with
``transformers`` (the baseline: no custody, no checkpoints, no engine), and rollcut's rollouts
(:func:`rollcut.integrations.trl.train_letters`). The figure is training tokens per second, the
trainer's own count (``num_input_tokens_seen``: prompt and completion tokens) over the time
``train()`` took; ``vs_trl`` is the ratio, with its spread over the repeats.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from ._model import _spread

__all__ = ["bench_train"]


def _run(steps: int, repeat: int, generations: int) -> dict[str, Any]:
    from ..integrations.trl import train_letters

    runs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="rollcut-bench-train-") as tmp:
            trl = train_letters(
                Path(tmp) / "trl", steps=steps, generations=generations, through_rollcut=False
            )
            ours = train_letters(Path(tmp) / "rollcut", steps=steps, generations=generations)
        runs.append((trl, ours))
    return {
        "steps": steps,
        "generations": generations,
        "repeat": repeat,
        "trl_tokens_per_s": _spread([t["tokens_per_s"] for t, _ in runs], 1),
        "rollcut_tokens_per_s": _spread([o["tokens_per_s"] for _, o in runs], 1),
        "vs_trl": _spread([o["tokens_per_s"] / t["tokens_per_s"] for t, o in runs]),
        "rollouts_consumed": sum(o["rollouts_consumed"] for _, o in runs),
        "rollouts_consumed_twice": sum(o["rollouts_consumed_twice"] for _, o in runs),
        "logprob_max_abs_delta": max(o["logprob_max_abs_delta"] for _, o in runs),
    }


async def bench_train(*, steps: int = 8, repeat: int = 3, generations: int = 8) -> dict[str, Any]:
    """See the module's docstring. The trainer runs in a thread: it drives its own event loops."""
    return await asyncio.to_thread(_run, steps, repeat, generations)
