"""What a published checkpoint reports to whoever took it: its record, and how long each phase,
the pause and each participant's prepare took."""

from __future__ import annotations

import msgspec

from ..ledger import CheckpointRecord

__all__ = ["CheckpointResult"]


class CheckpointResult(msgspec.Struct, kw_only=True):
    """A published checkpoint: its record, participants and how long each phase took."""

    record: CheckpointRecord
    participants: list[str]
    unreproducible: dict[str, list[str]]
    validated_events: int
    phases_ms: dict[str, float]
    resumed: list[str]
    pause_ms: float = 0.0
    """From the first prepare sent to the last participant released: how long the collection stood
    still (an upper bound of the time any participant held admission closed)."""
    publish_ms: float = 0.0
    """From the seal to publication (validation and the ledger write), with everyone already running."""
    waited_ms: dict[str, dict[str, float]] = {}
    """Per participant, its prepare as the coordinator waited for it: ``round_trip`` (request sent to
    reply read) and, from its reply, ``drain``, ``export`` and ``total`` inside it; what the round
    trip holds beyond ``total`` is the wire and the time the request and reply waited in busy
    event loops."""
    components: dict[str, str] = {}
    """Each participant instance's component."""
