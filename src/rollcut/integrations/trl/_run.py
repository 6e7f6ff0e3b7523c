"""A whole GRPO run on the ``letters`` task: through rollcut, or through TRL's own generation path.

One function for the example (``examples/trl_grpo.py``) and the benchmark (``rollcut bench
train``), so the two paths the benchmark compares differ only in where completions come from:
rollcut's rollouts (a checkpointed collection through the bus, the agent, the model server and
llama.cpp, the weights served as the next version after each step, every token's log-prob
checked), or TRL generating in the trainer with ``transformers``. Same policy, same config.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from ._rollout import Deployment

__all__ = ["LETTERS_PROMPT", "train_letters"]

LETTERS_PROMPT = "Write the letter e, many times."
"""The prompt of every ``letters`` task here, numbered (``... (7)``), so the prompts a pipelined
run predicts are told apart; the reward is the share of the answer's ``e``."""


def _config(root: Path, steps: int, generations: int, lr: float, *, save: bool, tokens: int) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(root / "trainer"),
        use_cpu=True,
        per_device_train_batch_size=generations,
        num_generations=generations,
        max_completion_length=tokens,
        max_steps=steps,
        learning_rate=lr,
        logging_steps=1,
        report_to="none",
        # rollcut's way saves every step: each optimizer step is bound into a global checkpoint
        save_strategy="steps" if save else "no",
        save_steps=1,
        seed=0,
        temperature=1.0,
        disable_tqdm=True,
    )


def _letters_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL's path: the same reward as the ``letters`` environment's, computed in the trainer."""
    from ...gym.resources import Letters

    env = Letters()
    return [env.verify(None, {"chars": "e", "answer": str(c)})["reward"] for c in completions]


def train_letters(
    root: Path,
    *,
    steps: int,
    generations: int = 8,
    lr: float = 5e-4,
    through_rollcut: bool = True,
    crash_at_step: int | None = None,
    concurrency: int = 16,
    checkpoint_every_s: float = 2.0,
    restart_step: bool = False,
    max_staleness: int = 0,
    completion_tokens: int = 16,
) -> dict[str, Any]:
    """Train for ``steps`` optimizer steps under ``root``; the run's figures as a dict.

    Through rollcut, a ``root`` a killed run left is resumed from its newest global checkpoint
    whose halves verify; ``crash_at_step`` SIGKILLs the run (this process and every one it
    started) in the middle of that step's collection; ``restart_step`` resumes without the
    interrupted step's rollouts (the baseline of ``rollcut bench train --crash``); ``max_staleness``
    above 0 collects that many steps ahead while the trainer trains (:mod:`._pipeline`)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOTrainer

    from ._global import consumed_history
    from ._local import local_loop
    from ._policy import new_policy
    from ._rollout import RolloutFunction, reward_from_rollcut
    from ._sync import EngineSync, GlobalPublisher, LogprobCheck

    data = Dataset.from_dict({"prompt": [f"{LETTERS_PROMPT} ({i})" for i in range(max(64, steps))]})
    config = _config(root, steps, generations, lr, save=through_rollcut, tokens=completion_tokens)
    if not through_rollcut:
        model, tokenizer = new_policy(seed=0)
        trainer = GRPOTrainer(
            model=model,
            processing_class=tokenizer,
            reward_funcs=[_letters_reward],
            args=config,
            train_dataset=data,
        )
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):  # the trainer prints its logs: stdout is the caller's
            trainer.train()
        return _figures(trainer, time.perf_counter() - t0)
    with local_loop(root, restart=restart_step, max_staleness=max_staleness) as loop:
        rollout = RolloutFunction(
            loop.deployment,
            task_of=lambda prompt: {"env": "letters", "seed": {}, "verify": {"chars": "e"}},
            params={"max_output_tokens": completion_tokens, "temperature": 1.0},
            check=LogprobCheck(loop.policy_dir),
            concurrency=concurrency,
            checkpoint_every_s=checkpoint_every_s,
            epoch=loop.epoch,
            crash_at=crash_at_step,
            crash=loop.crash,
            max_staleness=max_staleness,
        )
        sync = EngineSync(loop.engine, loop.tokenizer, loop.policy_dir, loop.version_file)
        trainer = GRPOTrainer(
            model=loop.model,
            processing_class=loop.tokenizer,
            reward_funcs=[reward_from_rollcut],
            args=config,
            train_dataset=data,
            rollout_func=rollout,
            callbacks=[sync, GlobalPublisher(root, rollout)],  # the record names the new version: after sync
        )
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(sys.stderr):
                trainer.train(resume_from_checkpoint=loop.resume_from)
        finally:
            rollout.close()
        out = _figures(trainer, time.perf_counter() - t0)
        work = asyncio.run(_work(loop.deployment))
    history = consumed_history(root)
    ever = [rid for _, ids in history for rid in ids]
    per_step: list[dict[str, Any]] = [
        {
            "step": s.step,
            "rollouts": len(s.rollout_ids),
            "reward_mean": round(sum(s.rewards) / len(s.rewards), 4),
            "versions": sorted({v for span in s.versions for v in span}),
            # generated by two policy versions: running across a weight update, continued on the new one
            "rollouts_across_update": sum(1 for first, last in s.versions if first != last),
            "logprob_max_abs_delta": s.logprobs["max_abs_delta"] if s.logprobs else None,
            "logprob_mean_abs_delta": s.logprobs["mean_abs_delta"] if s.logprobs else None,
            "recovered": {k: v for k, v in s.recovery.items() if v},
            "checkpoints": s.checkpoints_published,
            "collect_s": round(s.collect_s, 3),
            "trainer_waited_s": round(s.waited_s, 3),  # below collect_s: collected while it trained
        }
        for s in rollout.steps
    ]
    restored = loop.restored
    return {
        **out,
        # the committed hand-off, from the global records: every step of the run, resumed or not
        "rollouts_consumed": len(ever),
        "rollouts_consumed_twice": len(ever) - len(set(ever)),
        "consumed": [[step, ids] for step, ids in history],
        "logprob_max_abs_delta": max((s["logprob_max_abs_delta"] or 0.0 for s in per_step), default=0.0),
        "max_staleness": max_staleness,
        "rollouts_across_update": sum(s["rollouts_across_update"] for s in per_step),
        "engine_restart_s": sorted(round(t, 3) for t in sync.restart_s),
        "collect_s": round(sum(s.collect_s for s in rollout.steps), 3),
        "trainer_waited_s": round(sum(s.waited_s for s in rollout.steps), 3),
        "per_step": per_step,
        # what a resumed run took back: the global record (both halves verified), what it passed over
        "resumed_from": None if restored is None else msgspec.to_builtins(restored),
        # from the stream itself: a completed model call generated again in a later attempt
        "model_calls_regenerated": work["regenerated"],
        "model_calls_kept_across_crashes": work["model_calls_kept"],
    }


async def _work(dep: Deployment) -> dict[str, int]:
    from ...replay import count_work

    log = await dep.connect("trl-work")
    try:
        return await count_work(log)
    finally:
        await log.close()


def _figures(trainer: Any, seconds: float) -> dict[str, Any]:
    tokens = int(trainer.state.num_input_tokens_seen)
    return {
        "steps": int(trainer.state.global_step),
        "train_seconds": round(seconds, 3),
        "tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
    }
