"""Event schema v1: every fact rollcut records, as one tagged union.

Why one union: the log is the single source of truth, and a reader (replay,
the ledger projector, an operator's tool) must be able to decode any stored
message without knowing in advance which writer produced it. The ``kind``
tag selects the struct; ``schema_version`` lets a later rollcut upcast old
records step by step (see :mod:`rollcut.bus._upcast`) and lets this rollcut
refuse records written by a newer one instead of misreading them.

Identifiers that become NATS subject tokens (rollout ids, checkpoint ids,
component and instance names) are restricted to a safe alphabet so that a
hostile or careless id can never address another rollout's subject.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from ._envelope import (
    SCHEMA_VERSION,
    AgentBoundaryRecord,
    Attempt,
    CheckpointEvent,
    Component,
    Event,
    HexDigest,
    Revision,
    RolloutEvent,
    Seq,
    Token,
    TokenReceipt,
    new_event_id,
)
from ._markers import (
    CheckpointAborted,
    CheckpointCommitted,
    CheckpointPrepared,
    CheckpointResumed,
    CheckpointSealed,
    CollectorLease,
    ParticipantLeaseExpired,
    ParticipantReplied,
)

__all__ = [
    "SCHEMA_VERSION",
    "AgentBoundary",
    "AgentBoundaryRecord",
    "AgentSandbox",
    "AnyEvent",
    "AttemptClaimed",
    "AttemptOpened",
    "AttemptTombstoned",
    "CheckpointAborted",
    "CheckpointCommitted",
    "CheckpointEvent",
    "CheckpointPrepared",
    "CheckpointResumed",
    "CheckpointSealed",
    "CollectorLease",
    "Component",
    "Event",
    "ModelCallAdmitted",
    "ModelCallCompleted",
    "ModelCallContinued",
    "ModelCallExcluded",
    "ModelCallFailed",
    "ModelCallPrefixCut",
    "ModelCallReused",
    "ParticipantLeaseExpired",
    "ParticipantReplied",
    "RelayDiverged",
    "RelayExchange",
    "RelayReplayed",
    "ResourcesMutated",
    "ResourcesRetired",
    "ResourcesSeeded",
    "ResourcesSnapshot",
    "ResourcesVerified",
    "ResultAccepted",
    "RolloutCompleted",
    "RolloutDispatched",
    "RolloutEvent",
    "RolloutRetired",
    "TokenReceipt",
    "new_event_id",
]

# --- rollout lifecycle (written to the fence subject) -------------------------


class RolloutDispatched(RolloutEvent, frozen=True, kw_only=True, tag="rollout.dispatched"):
    """Opens attempt 1 and holds the original input, so fresh dispatch needs nothing else."""

    input: Any
    input_digest: HexDigest


class AttemptOpened(RolloutEvent, frozen=True, kw_only=True, tag="attempt.opened"):
    """``from_cut``: the checkpoint cut this attempt continues from (0: from the input).

    Participants read it to serve the previous attempt's completed work from the
    log, never anything the old attempt did after the cut but the model calls it completed
    before the fence moved (each a finished sample for its exact request).
    ``reuse_completed``: an attempt from its input (``from_cut`` 0) because no checkpoint covered
    the rollout's progress, not to measure a restart: the model calls earlier attempts completed
    are still served for the same exact request (False in logs written before it).
    """

    previous_attempt: Annotated[int, Meta(ge=0)]
    reason: str = ""
    checkpoint_id: str = ""
    from_cut: Seq = 0
    reuse_completed: bool = False


class AttemptTombstoned(RolloutEvent, frozen=True, kw_only=True, tag="attempt.tombstoned"):
    """Closes an attempt: the server refuses its late writes from now on."""

    reason: str = ""
    next_attempt: int | None = None


class RolloutRetired(RolloutEvent, frozen=True, kw_only=True, tag="rollout.retired"):
    """Terminal: the framework gave the rollout up (budget, stale policy, an operator's call).

    It closes ``attempt`` the way a tombstone does, so the server refuses that
    attempt's late writes, and no attempt may open after it. Every participant
    that sees it drops what it holds for the rollout.
    """

    reason: str = ""


# --- policy model ------------------------------------------------------------


class ModelCallAdmitted(RolloutEvent, frozen=True, kw_only=True, tag="model.admitted"):
    """A model call was admitted: written before generation starts."""

    call_id: Token
    request_digest: HexDigest
    parent_call_id: str | None = None


class ModelCallCompleted(RolloutEvent, frozen=True, kw_only=True, tag="model.completed"):
    """A model call finished; its tokens are in the token store under ``receipt``."""

    call_id: Token
    request_digest: HexDigest
    receipt: TokenReceipt
    parent_call_id: str | None = None
    finish_reason: str = "stop"
    policy_version: str = ""
    response: Any = None
    # the stop string that ended the generation, when the backend says which (llama.cpp does):
    # Anthropic's ``stop_sequence``, answered the same when the call is served from the log
    stop_sequence: str | None = None


class ModelCallPrefixCut(RolloutEvent, frozen=True, kw_only=True, tag="model.prefix_cut"):
    """A running call's tokens so far were made durable at a checkpoint (a generation cut)."""

    call_id: Token
    receipt: TokenReceipt
    token_boundary: Annotated[int, Meta(ge=0)]
    buffer_id: Token


class ModelCallReused(RolloutEvent, frozen=True, kw_only=True, tag="model.reused"):
    """A call of this attempt answered from an earlier attempt's completed call: nothing generated."""

    call_id: Token
    request_digest: HexDigest
    source_call_id: Token
    source_attempt: Attempt
    receipt: TokenReceipt
    parent_call_id: str | None = None
    response: Any = None
    # how the source call's generation ended, carried so a reuse of this reuse answers the same
    finish_reason: str = "stop"
    stop_sequence: str | None = None


class ModelCallContinued(RolloutEvent, frozen=True, kw_only=True, tag="model.continued"):
    """A call of this attempt resumes an earlier attempt's durable prefix.

    ``delivery`` says how the prefix reached the backend: ``staged`` (the
    backend read it from the token store by receipt) or ``inline`` (token ids
    materialized and validated by the server). Never both.
    """

    call_id: Token
    request_digest: HexDigest
    source_call_id: Token
    source_attempt: Attempt
    prefix_receipt: TokenReceipt
    token_boundary: Annotated[int, Meta(ge=0)]
    delivery: Literal["staged", "inline"]
    parent_call_id: str | None = None


class ModelCallFailed(RolloutEvent, frozen=True, kw_only=True, tag="model.failed"):
    """A model call failed; ``retryable`` says whether repeating it is safe."""

    call_id: Token
    error: str
    retryable: bool = False


class ModelCallExcluded(RolloutEvent, frozen=True, kw_only=True, tag="model.excluded"):
    """A running call that could not be cut at a checkpoint: it runs again after a crash."""

    call_id: Token
    reason: str


# --- resources ---------------------------------------------------------------


class ResourcesSeeded(RolloutEvent, frozen=True, kw_only=True, tag="resources.seeded"):
    """A resources session started from its seed."""

    session: Token
    env: str
    seed: Any = None
    revision: Revision = 0
    state: bytes | None = None


class ResourcesMutated(RolloutEvent, frozen=True, kw_only=True, tag="resources.mutated"):
    """A tool call changed a session: its result, new revision, and a delta or the full state."""

    session: Token
    revision: Annotated[int, Meta(ge=1)]
    tool: str
    arguments: Any = None
    result: Any = None
    delta: Any = None
    state: bytes | None = None


class ResourcesSnapshot(RolloutEvent, frozen=True, kw_only=True, tag="resources.snapshot"):
    """An exported session state, at prepare, for environments that are not event-sourced."""

    session: Token
    revision: Revision
    codec: str
    codec_version: Annotated[int, Meta(ge=1)]
    state: bytes
    digest: HexDigest


class ResourcesVerified(RolloutEvent, frozen=True, kw_only=True, tag="resources.verified"):
    """A session's verification: the verdict, at which revision, for which request (its digest).

    Journaled before the verdict goes back, so a continued attempt (from a cut above it) that asks
    again at the same revision with the same request is given this verdict, not a second one (a
    judge's verdict can differ when recomputed, and costs a model call). The request itself is the
    rollout's own output, already on the log; its digest is what shows a later request is the same."""

    session: Token
    revision: Revision
    request: HexDigest
    verdict: Any = None
    from_log: bool = False


class ResourcesRetired(RolloutEvent, frozen=True, kw_only=True, tag="resources.retired"):
    """A session is over (completed, or kept after a failed verification until accepted)."""

    session: Token
    revision: Revision
    reason: str = "completed"


# --- agent and result hand-off -------------------------------------------------


class AttemptClaimed(RolloutEvent, frozen=True, kw_only=True, tag="agent.claimed"):
    """An agent took this attempt to run it: the first record on the attempt's agent subject, written
    with a compare-and-set on that subject, so of two runs of one attempt exactly one goes on."""


class AgentBoundary(RolloutEvent, frozen=True, kw_only=True, tag="agent.boundary"):
    """A whitebox agent completed a nonterminal turn: its boundary record."""

    record: AgentBoundaryRecord


class AgentSandbox(RolloutEvent, frozen=True, kw_only=True, tag="agent.sandbox"):
    """An opaque agent's sandbox made durable at a checkpoint's prepare, by its provider
    (``--sandbox``): ``ref`` names the snapshot in the provider's store (the built-in ``tree``
    provider: the manifest's SHA-256 in the namespace's blob bucket). A continued attempt's sandbox
    is restored from the lineage's last one at or below its cut."""

    provider: Annotated[str, Meta(max_length=64)]
    checkpoint_id: Annotated[str, Meta(max_length=256)]
    ref: Annotated[str, Meta(max_length=1024)]
    exchanges: Annotated[int, Meta(ge=0)] = 0
    """The relay exchanges journaled when it was taken: a restore uses it only for a journal of
    exactly that length (files and journal of one moment, never of two)."""
    files: Annotated[int, Meta(ge=0)] = 0
    bytes: Annotated[int, Meta(ge=0)] = 0


class RolloutCompleted(RolloutEvent, frozen=True, kw_only=True, tag="rollout.completed"):
    """The attempt produced its final result (verified); not yet handed off."""

    result_digest: HexDigest
    reward: float | None = None


class ResultAccepted(RolloutEvent, frozen=True, kw_only=True, tag="result.accepted"):
    """The framework durably took the result: the rollout is completed for good."""

    result_digest: HexDigest
    reward: float | None = None
    output_ref: str = ""


# --- the egress relay of an opaque agent ---------------------------------------


class RelayExchange(RolloutEvent, frozen=True, kw_only=True, tag="relay.exchange"):
    """The ``n``-th request an opaque agent sent through its relay in this lineage, and the answer it
    got, byte for byte: durable before the answer leaves, so a restarted agent is answered from it.

    ``request_digest`` is over the method, route and normalised body
    (:func:`rollcut.gym.opaque.request_digest`); ``body`` is the answer of a plain response,
    ``chunks`` those of a streamed one, in the pieces the agent received them. ``env`` and
    ``revision`` name the tool session and its revision after a tool call (a resources server's
    replay queue starts after the last one journaled); ``oversize`` says the answer was over the
    journal's limit and is not kept, so this exchange cannot be replayed.
    """

    n: Annotated[int, Meta(ge=1)]
    method: Annotated[str, Meta(max_length=16)]
    route: Annotated[str, Meta(max_length=4096)]
    request_digest: HexDigest
    status: Annotated[int, Meta(ge=100, le=599)]
    content_type: Annotated[str, Meta(max_length=256)] = ""
    body: bytes = b""
    chunks: list[bytes] = []
    streamed: bool = False
    env: str = ""
    revision: Revision | None = None
    oversize: bool = False


class RelayReplayed(RolloutEvent, frozen=True, kw_only=True, tag="relay.replayed"):
    """A request of this attempt answered from the lineage's journal: nothing was sent upstream."""

    n: Annotated[int, Meta(ge=1)]
    request_digest: HexDigest
    source_attempt: Attempt


class RelayDiverged(RolloutEvent, frozen=True, kw_only=True, tag="relay.diverged"):
    """The ``n``-th request of a replaying agent differed from the journal's (``expected``): what
    ``policy`` then did (``fresh_dispatch``: the rollout starts over from its input; ``go_live``: the
    journal is abandoned from ``n`` on, allowed only for stateless tools)."""

    n: Annotated[int, Meta(ge=1)]
    method: Annotated[str, Meta(max_length=16)]
    route: Annotated[str, Meta(max_length=4096)]
    request_digest: HexDigest
    expected_route: Annotated[str, Meta(max_length=4096)] = ""
    expected_digest: str = ""
    policy: Literal["fresh_dispatch", "go_live"] = "fresh_dispatch"
    why: Annotated[str, Meta(max_length=1000)] = ""


AnyEvent = (
    CollectorLease
    | RolloutDispatched
    | AttemptOpened
    | AttemptTombstoned
    | RolloutRetired
    | ModelCallAdmitted
    | ModelCallCompleted
    | ModelCallPrefixCut
    | ModelCallReused
    | ModelCallContinued
    | ModelCallFailed
    | ModelCallExcluded
    | ResourcesSeeded
    | ResourcesMutated
    | ResourcesSnapshot
    | ResourcesRetired
    | ResourcesVerified
    | AttemptClaimed
    | AgentBoundary
    | AgentSandbox
    | RelayExchange
    | RelayReplayed
    | RelayDiverged
    | RolloutCompleted
    | ResultAccepted
    | CheckpointPrepared
    | ParticipantReplied
    | CheckpointSealed
    | CheckpointCommitted
    | CheckpointResumed
    | CheckpointAborted
    | ParticipantLeaseExpired
)
"""Every event kind, as the tagged union the codec decodes."""
