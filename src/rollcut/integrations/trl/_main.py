"""``python -m rollcut.integrations.trl``: the GRPO run on ``letters``, from the command line.

The README's example (``examples/trl_grpo.py``) is this command; ``rollcut bench train --crash``
starts it as a process of its own, since the fault it measures kills the process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str] | None = None, *, description: str = "") -> int:
    """Parse ``argv``, train, print the run's JSON; the exit code."""
    ap = argparse.ArgumentParser(description=description or (__doc__ or "").split("\n\n")[0])
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
    ap.add_argument(
        "--restart-step",
        action="store_true",
        help="resuming: collect the interrupted step again from nothing (what a crash costs without rollcut)",
    )
    ap.add_argument(
        "--max-staleness",
        type=int,
        default=0,
        help="collect up to this many steps ahead while the trainer trains (0: each step when asked)",
    )
    ap.add_argument("--completion-tokens", type=int, default=16, help="tokens each completion may have")
    args = ap.parse_args(argv)

    from ._run import train_letters

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
            restart_step=args.restart_step,
            max_staleness=args.max_staleness,
            completion_tokens=args.completion_tokens,
        )
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))
    return 0
