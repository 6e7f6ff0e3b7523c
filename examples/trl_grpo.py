"""TRL's GRPOTrainer learning from rollcut's rollouts, on this host, on CPU.

    python examples/trl_grpo.py --steps 8 --json

A tiny Llama policy (written here: the trainer's copy in safetensors, the engine's in GGUF, same
weights) is served by llama.cpp's server behind rollcut's model server; every generation batch
is a rollcut collection of ``letters`` episodes (the reward: the share of the answer's letters
that are ``e``); after each optimizer step the new weights become the next policy version on
the engine. Every step, each generated token's log-prob is recomputed under the weights of the
version that generated it and compared with the engine's; the run fails above the bound.

Needs the ``trl`` extra (TRL, and torch 2.13.0 for CPU) and llama.cpp's server (built once by
``rollcut engine build``). ``rollcut bench train`` runs the same against TRL's own generation.
"""

from __future__ import annotations

import argparse
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
    args = ap.parse_args()

    from rollcut.integrations.trl import train_letters

    with tempfile.TemporaryDirectory(prefix="rollcut-trl-") as tmp:
        home = args.home or Path(tmp)
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        out = train_letters(home, steps=args.steps, generations=args.generations, lr=args.lr)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
