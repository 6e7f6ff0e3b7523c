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

import sys

from rollcut.integrations.trl import main

if __name__ == "__main__":
    sys.exit(main(description=(__doc__ or "").split("\n\n")[0]))
