"""The records of the marker lanes: the coordinator's checkpoint markers (``mark.checkpoint``), a
participant's own lane (``mark.<instance>``: its prepare replies, a lease it let run out) and the
collector's lease (``mark.collector``). They belong to no rollout; the rollout events are in
:mod:`._events`, which makes both one tagged union."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from ._envelope import CheckpointEvent, Event, Seq, Token

__all__ = [
    "CheckpointAborted",
    "CheckpointCommitted",
    "CheckpointPrepared",
    "CheckpointResumed",
    "CheckpointSealed",
    "CollectorLease",
    "ParticipantLeaseExpired",
    "ParticipantReplied",
]


# --- checkpoint markers -----------------------------------------------------


class CheckpointPrepared(CheckpointEvent, frozen=True, kw_only=True, tag="checkpoint.prepare"):
    """A checkpoint started: it holds the coordinator lane until its deadline."""

    deadline: float


class ParticipantReplied(CheckpointEvent, frozen=True, kw_only=True, tag="checkpoint.reply"):
    """A participant's answer to a prepare, on its own marker lane."""

    participant: Token
    last_seq: Seq
    unreproducible: list[str] = []
    phases_ms: dict[str, float] = {}
    """Where the prepare's time went inside the participant: ``drain``, ``export``, ``total``
    (from the request's arrival to the reply), in milliseconds."""


class CheckpointSealed(CheckpointEvent, frozen=True, kw_only=True, tag="checkpoint.seal"):
    """The seal: its stream sequence is the checkpoint's cut."""

    participants: list[str] = []
    last_seqs: dict[str, Seq] = {}
    deadline: float = 0.0


class CheckpointCommitted(CheckpointEvent, frozen=True, kw_only=True, tag="checkpoint.commit"):
    """A checkpoint was published at ``cut``; a rebuilt ledger finds it here, with the rollouts it
    quarantined (rollout or lane -> why; absent from markers written before quarantines existed)."""

    cut: Seq
    token_snapshot_id: str = ""
    token_snapshot_digest: str = ""
    participants: list[str] = []
    quarantined: dict[str, str] = {}
    pause_ms: Annotated[float, Meta(ge=0)] = 0.0
    """How long the collection stood still for it (from the first prepare to the last release)."""
    waited_ms: dict[str, float] = {}
    """Each participant's prepare as the coordinator waited for it (request to reply); where the
    time went inside each is on its own lane (``checkpoint.reply``)."""


class CheckpointResumed(CheckpointEvent, frozen=True, kw_only=True, tag="checkpoint.resume"):
    """Participants were released after a checkpoint."""

    pass


class CheckpointAborted(CheckpointEvent, frozen=True, kw_only=True, tag="checkpoint.abort"):
    """The checkpoint will never be published; releases the coordinator lane. ``suspects``: what the
    last failed validation found, which the next to find again quarantines, in any process."""

    reason: str
    suspects: Annotated[list[Token], Meta(max_length=10_000)] = []


class CollectorLease(Event, frozen=True, kw_only=True, tag="collector.lease"):
    """One collector holds the namespace (``rc.<ns>.mark.collector``): taken and renewed by a
    compare-and-set on that lane, so two collectors never drive one namespace's rollouts at once.

    ``expires_at`` is the holder's clock plus its ``ttl_s``; a lease past it (or ``released``, or
    held by a process on this host that no longer exists) may be taken over.
    """

    collection: Token
    host: Annotated[str, Meta(max_length=255)]
    pid: Annotated[int, Meta(ge=0)]
    ttl_s: Annotated[float, Meta(gt=0)]
    expires_at: float
    released: bool = False


class ParticipantLeaseExpired(CheckpointEvent, frozen=True, kw_only=True, tag="checkpoint.lease_expired"):
    """A participant reopened admission by itself: its coordinator went silent."""

    participant: Token
