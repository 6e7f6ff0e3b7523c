"""A collection's rows as one padded training batch (numpy), every token array checked against custody.

    python examples/padded_batch.py HOME [ROWS]

HOME is a collection's home (the demo prints it; its token store is HOME/tokens);
ROWS defaults to HOME/rollouts.jsonl. No training loop: this is the hand-off a
trainer (NeMo-RL, verl, ...) starts from.
"""

from __future__ import annotations

import sys
from pathlib import Path

from rollcut.collect import padded, read_turns
from rollcut.tokens import LocalTokenStore


def main(home: Path, rows: Path) -> None:
    with LocalTokenStore(home / "tokens") as tokens:
        turns = list(read_turns(rows, tokens))  # raises ExportError on any array the store does not vouch for
    batch = padded(turns)
    print(f"{len(turns)} turns of {len({t.rollout_id for t in turns})} rollouts")
    for name, array in batch.items():
        print(f"  {name:10} {array.dtype!s:8} {tuple(array.shape)}")
    generated = int(batch["mask"].sum())
    given = int(batch["lengths"].sum()) - generated
    print(f"  {generated} policy tokens to train on, {given} given tokens masked")


if __name__ == "__main__":
    home = Path(sys.argv[1])
    main(home, Path(sys.argv[2]) if len(sys.argv) > 2 else home / "rollouts.jsonl")
