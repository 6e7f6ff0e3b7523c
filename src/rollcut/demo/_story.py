"""What the demo tells as it happens: one event per thing a newcomer should see.

The demo (:func:`run_demo`) emits these; the CLI turns each into a line above its
progress bar, and ``--json`` ignores them. They are plain values so a test can
check the story without a terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ledger import Ledger

__all__ = [
    "Checkpointed",
    "Compared",
    "Comparing",
    "Continuation",
    "Crashed",
    "Progressed",
    "Resumed",
    "Standing",
    "Started",
    "StoryEvent",
]


@dataclass(frozen=True)
class Standing:
    """Where the rollouts stood: finished, mid-episode, or not started. At a checkpoint (from the
    ledger at its cut) mid-episode means a turn or more done; at the crash (the collector's count)
    it means running."""

    finished: int
    mid_episode: int
    not_yet: int


def standing(ledger: Ledger, cut: int) -> Standing:
    """The rollouts at ``cut``, as the ledger has projected them (at least up to the cut once a
    checkpoint at it is published)."""
    finished = mid = rest = 0
    for r in ledger.rollouts():
        if r.accepted_seq is not None and r.accepted_seq <= cut:
            finished += 1
        elif r.last_boundary_seq is not None and r.last_boundary_seq <= cut:
            mid += 1
        else:
            rest += 1
    return Standing(finished, mid, rest)


@dataclass(frozen=True)
class Started:
    """The Gym processes are up (``restarted``: again, on the same ports, after the crash)."""

    processes: dict[str, int]  # server name -> pid
    nats_url: str
    restarted: bool = False


@dataclass(frozen=True)
class Checkpointed:
    """A checkpoint was published; ``number`` counts every one of the run, the recovery's included."""

    number: int
    checkpoint_id: str
    cut: int
    standing: Standing
    ms: float
    pause_ms: float


@dataclass(frozen=True)
class Crashed:
    """Every Gym process was SIGKILLed."""

    killed: dict[str, int]  # server name -> pid
    standing: Standing
    last_checkpoint: str | None


@dataclass(frozen=True)
class Continuation:
    """One rollout continuing where it was: its new attempt, and the turns already done (for an
    opaque agent, whose turns rollcut cannot see: the requests its relay journaled, ``unit``)."""

    rollout_id: str
    attempt: int
    turns_done: int
    unit: str = "turn"


@dataclass(frozen=True)
class Resumed:
    """Recovery planned and applied: the stream's tail sealed at ``cut`` and every rollout disposed of."""

    checkpoint_id: str | None
    cut: int
    finished: int  # accepted before the crash: never run again
    continued: list[Continuation] = field(default_factory=list)
    started_over: int = 0  # began, but nothing of theirs could be kept: from their input again
    never_started: int = 0  # still queued at the crash: dispatched now, on their first attempt


@dataclass(frozen=True)
class Progressed:
    """Rows written so far (of ``total``), rollouts running, checkpoints published in all."""

    finished: int
    running: int
    total: int
    checkpoints: int


@dataclass(frozen=True)
class Comparing:
    """The same crash, recovered another way, on a copy of the collection made at the crash."""

    way: str
    home: str


@dataclass(frozen=True)
class Compared:
    """What one way of recovering cost (see ``run_demo``'s ``compared``)."""

    way: str
    cost: dict[str, Any]


StoryEvent = Started | Checkpointed | Crashed | Resumed | Progressed | Comparing | Compared
"""Anything the demo tells."""
