"""Ledger records: versioned msgspec structs stored as msgpack in LMDB."""

from __future__ import annotations

import msgspec

__all__ = ["LEDGER_SCHEMA_VERSION", "CheckpointRecord", "RolloutIndex"]

LEDGER_SCHEMA_VERSION = 1
"""The ledger layout version this rollcut writes and reads."""


class CheckpointRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A published checkpoint: a sealed cut and what it is bound to."""

    record_version: int = 1
    checkpoint_id: str
    cut: int
    token_snapshot_id: str = ""
    token_snapshot_digest: str = ""
    participants: list[str] = []
    ts: float = 0.0
    quarantined: dict[str, str] = {}
    """Rollouts whose references below the cut did not resolve, with why: the checkpoint holds for
    every other rollout, and recovery starts these over from their input (fail closed for the
    rollout, never for the namespace). Carried into every later checkpoint until they finish."""


class RolloutIndex(msgspec.Struct, kw_only=True):
    """Where one rollout stands, as projected from the log."""

    record_version: int = 1
    rollout_id: str
    current_attempt: int = 0
    open: bool = False
    status: str = "dispatched"  # dispatched | running | tombstoned | completed | accepted | retired
    dispatch_seq: int = 0
    attempt_opened_seq: int = 0
    tombstoned_attempts: list[int] = []
    last_boundary_seq: int | None = None
    last_boundary_attempt: int | None = None
    last_boundary_turn: int | None = None
    completed_seq: int | None = None
    completed_attempt: int | None = None
    accepted_seq: int | None = None
    retired_seq: int | None = None
    retired_reason: str = ""
    last_seq: int = 0
    corrupt_seqs: list[int] = []
