"""The "last checkpoint only" baseline at an honest interval: what a checkpoint-interval design keeps.

rollcut checkpoints every half second in the demo because its checkpoint costs milliseconds and
stops nothing (an unaligned cut; ``bench checkpoint``: a 5-7 ms pause at 10,000 rollouts). A design
that stops the world to write its state (NeMo Gym's store: every participant's records written,
fsynced and renamed, then a manifest) cannot afford that, so the baseline recovers from the newest
checkpoint such a design would have taken: one every ``every_s`` seconds from the collection's
start. Of the checkpoints the demo published, the newest at or before the last multiple of
``every_s`` before the crash stands for it; with none there, the baseline has nothing to continue
from and every unfinished rollout starts over.

The default interval: the longer of
- ``NEMO_FLOOR_S``, the interval at which NeMo Gym's store costs at most 5% of the collection's
  time: ``rollcut bench checkpoint --rollouts 10000 --baseline nemo --moved 100`` measured its
  stop-the-world write at 83 ms (cold) to 189 ms (every rollout moved), median over 3, here
  (docs/demo-and-report.md); 20 x 0.19 s = about 4 s. That counts the files only: draining the calls in
  flight, which an aligned checkpoint also waits for, makes the real floor higher;
- one episode (the median time from dispatch to result of the rollouts finished before the crash):
  a design that checkpoints more often than an episode lasts is checkpointing partial rollouts,
  which is what it does not do.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bus import EventLog, RolloutCompleted, RolloutDispatched
from ..ledger import Ledger

__all__ = ["NEMO_FLOOR_S", "BaselineCut", "baseline_cut", "episode_seconds"]

NEMO_FLOOR_S = 4.0
"""The shortest interval at which NeMo Gym's checkpoint store costs at most 5% of a collection's
time at 10,000 rollouts (20 times its 0.19 s stop-the-world write; see the module's docstring)."""


@dataclass(frozen=True)
class BaselineCut:
    """Where the baseline recovers from: its interval, why that one, and the checkpoint it had."""

    every_s: float
    why: str
    checkpoint_id: str | None  # None: no checkpoint yet by the crash (everything starts over)
    checkpoint_age_s: float | None  # how long before the crash it was taken

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


async def episode_seconds(log: EventLog) -> list[float]:
    """How long each finished rollout took, from its dispatch to its result."""
    dispatched: dict[str, float] = {}
    took: list[float] = []
    async for s in log.read():
        ev = s.event
        if isinstance(ev, RolloutDispatched):
            dispatched.setdefault(ev.rollout_id, ev.ts)
        elif isinstance(ev, RolloutCompleted) and ev.rollout_id in dispatched:
            took.append(ev.ts - dispatched.pop(ev.rollout_id))
    return took


def default_interval(episodes: list[float]) -> tuple[float, str]:
    """The baseline's interval when none is given, and why."""
    episode = statistics.median(episodes) if episodes else 0.0
    if episode > NEMO_FLOOR_S:
        return round(episode, 2), f"one episode (median {episode:.1f} s) > NeMo Gym's 5% floor"
    return NEMO_FLOOR_S, f"NeMo Gym's store at 5% of the collection's time (episodes: {episode:.1f} s)"


def baseline_cut(
    ledger_dir: Path, started_at: float, crashed_at: float, every_s: float, why: str
) -> BaselineCut:
    """The newest checkpoint in ``ledger_dir`` a design checkpointing every ``every_s`` seconds from
    ``started_at`` would have had when the crash came at ``crashed_at`` (wall-clock seconds)."""
    last_tick = started_at + math.floor((crashed_at - started_at) / every_s) * every_s
    with Ledger(ledger_dir) as ledger:
        taken = [ck for ck in ledger.checkpoints() if ck.ts <= last_tick]
    if not taken or last_tick <= started_at:
        return BaselineCut(every_s, why, None, None)
    newest = max(taken, key=lambda ck: ck.ts)
    return BaselineCut(every_s, why, newest.checkpoint_id, round(crashed_at - newest.ts, 2))
