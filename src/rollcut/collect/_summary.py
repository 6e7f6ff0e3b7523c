"""What a collection run did, as the collector reports it (and ``--json`` prints)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from ..participants import CheckpointResult, RecoveryResult

__all__ = ["CollectorHooks", "Summary", "summary_dict"]


@dataclass
class Summary:
    """What one :meth:`Collector.run` did (``rollcut collect``'s JSON, the demo's tables)."""

    rollouts: int = 0
    """The tasks the collection was given: one rollout, and one row, each."""
    results_written: int = 0
    """Rows this run wrote (with ``accepted_before``: every rollout, when the run ends well)."""
    duplicate_results: int = 0
    """Rows a rollout already had, refused at hand-off (a second run of a finished rollout): must be 0
    in the output, which holds each rollout once."""
    accepted_before: int = 0
    """Rollouts whose row an earlier run of this collection wrote: kept, never run again."""
    checkpoints_published: int = 0
    """Checkpoints this run published (a restore can use each)."""
    checkpoints_failed: int = 0  # periodic checkpoints that did not publish (a later one may have)
    last_checkpoint: str | None = None
    recovery: dict[str, int] = field(
        default_factory=lambda: {"completed": 0, "continue": 0, "fresh_dispatch": 0}
    )
    fallbacks_to_fresh: int = 0
    retired: int = 0
    healed: int = 0  # runs that broke off under a live collector and were recovered in place
    # what the runs that broke off met, by kind (an error's kind, or environment_unreachable): each
    # cost its rollout an attempt, recovered; none is a failure of the collection, none goes uncounted
    faults: dict[str, int] = field(default_factory=dict)
    never_started: int = 0  # of the fresh dispatches: queued, never run, kept on attempt 1
    failed: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)  # rollouts left without a row at the end
    gave_up: list[str] = field(default_factory=list)  # rollouts out of attempts, retired by this run
    interrupted: bool = False
    bus_outage: str | None = None  # why the collection stopped for a requeue: its bus did not answer
    requeue_checkpoint: str | None = None  # after SIGTERM: the checkpoint to resume from, if it published
    torn_bytes_cut: int = 0  # a torn last row cut off the output at start (it was never acknowledged)
    wall_s: float = 0.0
    checkpoint_ms_p50: float | None = None  # how long a published checkpoint took, end to end
    checkpoint_ms_p99: float | None = None
    checkpoint_pause_ms_p50: float | None = None  # how long each stood the collection still
    checkpoint_pause_ms_p99: float | None = None
    # where the pauses went: the coordinator's phases, and each component's prepare (round trip,
    # drain, export, wire and queue), p50 and p99 (rollcut.participants.PauseBreakdown)
    checkpoint_pause_breakdown: dict[str, Any] = field(default_factory=dict)
    compacted_rollouts: int = 0  # rollouts whose event history compaction let go (their rows stay)
    compaction_s: float = 0.0  # time spent compacting, in all
    compactions_failed: int = 0  # compactions that failed (each is taken again after the next checkpoint)
    compaction_freed_bytes: int = 0  # stream bytes compaction let go (a lower bound: writes go on meanwhile)
    compaction_freed_blobs: int = 0  # sandbox blobs compaction deleted (no tree on the stream names them)
    compaction_released_token_records: int = 0  # token records compaction released (rows handed off)
    compaction_released_token_bytes: int = 0  # ... and their stored bytes


def summary_dict(s: Summary) -> dict[str, Any]:
    """The summary as JSON-ready builtins."""
    out: dict[str, Any] = msgspec.to_builtins(msgspec.convert(s.__dict__, dict[str, Any]))
    return out


@dataclass(frozen=True)
class CollectorHooks:
    """What a collection tells whoever watches it (a progress bar, the demo's live story), as it
    happens: called in the collector's own task, so each must return at once."""

    progress: Callable[[Summary, int, int], None] | None = None
    """After each rollout's turn with the collector: the summary, the total, how many are running."""
    checkpoint: Callable[[CheckpointResult], None] | None = None
    """A periodic (or signalled) checkpoint was published."""
    recovery: Callable[[RecoveryResult], None] | None = None
    """A recovery was planned and applied: which rollouts continue, start over, or were finished."""
