"""TRL's GRPOTrainer learning from rollcut's rollouts, on this host, on CPU.

    python examples/trl_grpo.py --steps 8 --json

A tiny Llama policy (written here: the trainer's copy in safetensors, the engine's in GGUF, same
weights) is served by llama.cpp's server behind rollcut's model server; every generation batch
is a rollcut collection of ``letters`` episodes (the reward: the share of the answer's letters
that are ``e``); after each optimizer step the new weights become the next policy version on
the engine. Every step, each generated token's log-prob is recomputed under the weights of the
version that generated it and compared with the engine's; the run fails above the bound.

Needs the ``trl`` extra (TRL, and torch 2.13.0 for CPU) and the ``engine`` extra (llama.cpp's
server, built once by ``rollcut engine build``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps")
    ap.add_argument("--generations", type=int, default=8, help="completions per prompt (a GRPO group)")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--home", type=Path, default=None, help="keep everything here (default: a temporary dir)")
    ap.add_argument("--json", action="store_true", help="print the run as one JSON object")
    args = ap.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rollcut.integrations.trl import (
        EngineSync,
        LogprobCheck,
        RolloutFunction,
        local_loop,
        reward_from_rollcut,
    )

    with _Home(args.home) as root, local_loop(root) as loop:
        rollout = RolloutFunction(
            loop.deployment,
            task_of=lambda prompt: {"env": "letters", "seed": {}, "verify": {"chars": "e"}},
            params={"max_output_tokens": 16, "temperature": 1.0},
            check=LogprobCheck(loop.policy_dir),
        )
        config = GRPOConfig(
            output_dir=str(root / "trainer"),
            use_cpu=True,
            per_device_train_batch_size=args.generations,
            num_generations=args.generations,
            max_completion_length=16,
            max_steps=args.steps,
            learning_rate=args.lr,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=0,
            disable_tqdm=args.json,
        )
        trainer = GRPOTrainer(
            model=loop.model,
            processing_class=loop.tokenizer,
            reward_funcs=[reward_from_rollcut],
            args=config,
            train_dataset=Dataset.from_dict({"prompt": ["Write the letter e, many times."] * 4096}),
            rollout_func=rollout,
            callbacks=[EngineSync(loop.engine, loop.tokenizer, loop.policy_dir, loop.version_file)],
        )
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
        steps = [
            {
                "step": s.step,
                "rollouts": len(s.rollout_ids),
                "reward_mean": round(sum(s.rewards) / len(s.rewards), 4),
                "versions": sorted({v for span in s.versions for v in span}),
                "logprob_max_abs_delta": s.logprobs["max_abs_delta"] if s.logprobs else None,
                "logprob_mean_abs_delta": s.logprobs["mean_abs_delta"] if s.logprobs else None,
                "recovered": {k: v for k, v in s.recovery.items() if v},
                "checkpoints": s.checkpoints_published,
            }
            for s in rollout.steps
        ]
        consumed = [rid for s in rollout.steps for rid in s.rollout_ids]
        out = {
            "steps": len(steps),
            "rollouts_consumed": len(consumed),
            "rollouts_consumed_twice": len(consumed) - len(set(consumed)),
            "logprob_max_abs_delta": max((s["logprob_max_abs_delta"] or 0.0) for s in steps),
            "train_seconds": round(seconds, 2),
            "per_step": steps,
        }
        print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


class _Home:
    """``--home``, or a temporary directory removed at the end."""

    def __init__(self, home: Path | None) -> None:
        self.home, self.tmp = home, None

    def __enter__(self) -> Path:
        if self.home is not None:
            self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
            return self.home
        self.tmp = tempfile.TemporaryDirectory(prefix="rollcut-trl-")
        return Path(self.tmp.name)

    def __exit__(self, *exc: object) -> None:
        if self.tmp is not None:
            self.tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
