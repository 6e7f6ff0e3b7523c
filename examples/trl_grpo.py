"""TRL's GRPOTrainer learning from rollcut's rollouts, on this host, on CPU.

    python examples/trl_grpo.py --steps 8 --json
    python examples/trl_grpo.py --steps 8 --home run --crash-at-step 3   # SIGKILLed mid-step 3
    python examples/trl_grpo.py --steps 8 --home run --json              # resumes it, exactly once

A tiny Llama policy (written here: the trainer's copy in safetensors, the engine's in GGUF, same
weights) is served by llama.cpp's server behind rollcut's model server; every generation batch
is a rollcut collection of ``letters`` episodes (the reward: the share of the answer's letters
that are ``e``); after each optimizer step the new weights become the next policy version on
the engine. Every step, each generated token's log-prob is recomputed under the weights of the
version that generated it and compared with the engine's; the run fails above the bound.

Each optimizer step ends in a global checkpoint: the trainer's checkpoint, the step's rollcut
checkpoint and the policy version, bound in one record written last. Run again on the same
``--home`` after a crash, it resumes from the newest record whose halves verify; the step that
was running finds its rollouts (finished ones are not generated again) and every rollout is
trained on by exactly one step (``consumed`` in the JSON, read from the records).

Needs the ``trl`` extra (TRL, and torch 2.13.0 for CPU) and llama.cpp's server (built once by
``rollcut engine build``). ``rollcut bench train`` runs the same against TRL's own generation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps")
    ap.add_argument("--generations", type=int, default=8, help="completions per prompt (a GRPO group)")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--home", type=Path, default=None, help="keep everything here (default: a temporary dir)")
    ap.add_argument("--json", action="store_true", help="print the run as one JSON object")
    ap.add_argument(
        "--crash-at-step",
        type=int,
        default=None,
        help="SIGKILL the trainer and every process it started in the middle of this step's collection",
    )
    ap.add_argument("--concurrency", type=int, default=16, help="rollouts running at once")
    ap.add_argument("--checkpoint-every", type=float, default=2.0, help="seconds between rollcut checkpoints")
    args = ap.parse_args()

    from rollcut.integrations.trl import train_letters

    with contextlib.ExitStack() as cleanup:  # a temporary home only when none is given (a kill leaves it)
        home = args.home or Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="rollcut-trl-")))
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        out = train_letters(
            home,
            steps=args.steps,
            generations=args.generations,
            lr=args.lr,
            crash_at_step=args.crash_at_step,
            concurrency=args.concurrency,
            checkpoint_every_s=args.checkpoint_every,
        )
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
