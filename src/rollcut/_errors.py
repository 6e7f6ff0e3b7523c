"""The one exception tree of rollcut.

Every error rollcut raises derives from :class:`RollcutError`. Foreign
exceptions (nats-py, lmdb, zstandard, msgspec) are translated where they
cross into rollcut and chained with ``raise ... from exc``, so a caller can
catch one root and still see the original cause.

    RollcutError
    ├── ConfigError
    │   └── CollectorBusyError      another collector holds the namespace's lease
    ├── SchemaError                 bad input: names the field and the rule
    │   ├── UnknownEventKindError
    │   └── SchemaVersionError      written by a newer rollcut
    ├── EventTooLargeError
    ├── CorruptEventError           stored bytes fail their digest or decode
    ├── BusError                    the NATS server or connection failed us
    │   ├── ServerVersionError
    │   ├── ServerStartError
    │   ├── PermissionDeniedError   the role may not publish there
    │   └── BusFullError            the stream is out of room (also a StorageError)
    ├── FenceError
    │   ├── StaleAttemptError       the server refused a tombstoned attempt
    │   ├── AttemptConflictError    someone else moved the fence first
    │   └── RolloutExistsError
    ├── LedgerError
    │   ├── LedgerSchemaError
    │   └── LedgerCorruptError
    ├── StorageError                a disk or the bus ran out of room or failed
    ├── TokenStoreError
    ├── AdmissionClosedError        retryable: a checkpoint holds admission
    ├── CheckpointError
    │   ├── CheckpointFailedError   aborted, nothing published, admission reopened
    │   ├── CheckpointConflictError another checkpoint holds the coordinator lane
    │   └── StaleCheckpointError    a control op named a non-active checkpoint
    ├── SnapshotError               a tree cannot be kept or restored exactly (sandbox)
    ├── JournalGap                  a lineage's journal has a hole (replay)
    ├── NotContinuable              a session cannot be rebuilt at the cut (gym.resources)
    ├── GymError                    a Gym server refuses a call, by kind: its HTTP status (gym.wire)
    │   └── FreshDispatchNeeded     a re-issued operation met a different logged one
    ├── UpstreamError               the upstream model server failed a call (gym.model)
    │   └── EngineError             an inference engine failed one, or answered off its dialect
    ├── EngineUnavailableError      no engine binary or model here, and none can be made
    ├── NemoGymUnavailableError     NeMo Gym is not installed here and cannot be (gym.resources)
    ├── ExportError                 a row's token arrays do not match the token store (collect)
    ├── PlainCollectionError        a rollout of the bench's plain collection failed (bench)
    ├── SequenceError               a rollout's calls are not one token sequence (integrations.trl)
    ├── StalenessError              a row is more policy versions behind than allowed (integrations.trl)
    ├── LogprobMismatchError        the engine's log-probs are not the policy's (integrations.trl)
    └── PipelineError               a step started ahead was asked with other prompts (integrations.trl)

The errors below the root's own are declared beside what raises them (the package in brackets).

Errors carry the identifiers an operator needs (stream, seq, subject,
rollout_id, attempt, checkpoint_id, path, receipt_id) as attributes, not only
inside the message; a field that does not apply is None.
"""

from __future__ import annotations

import inspect

__all__ = [
    "AdmissionClosedError",
    "AttemptConflictError",
    "BusError",
    "BusFullError",
    "CheckpointConflictError",
    "CheckpointError",
    "CheckpointFailedError",
    "CollectorBusyError",
    "ConfigError",
    "CorruptEventError",
    "EventTooLargeError",
    "FenceError",
    "LedgerCorruptError",
    "LedgerError",
    "LedgerSchemaError",
    "PermissionDeniedError",
    "RollcutError",
    "RolloutExistsError",
    "SchemaError",
    "SchemaVersionError",
    "ServerStartError",
    "ServerVersionError",
    "StaleAttemptError",
    "StaleCheckpointError",
    "StorageError",
    "TokenStoreError",
    "UnknownEventKindError",
]


class RollcutError(Exception):
    """Root of every error rollcut raises.

    An error class declares the coordinates that apply to it as annotated
    class attributes (default None); they are set from keyword arguments, and
    a keyword the class does not declare is a bug, refused with TypeError.
    """

    def __init__(self, message: str = "", **coordinates: object) -> None:
        unknown = set(coordinates) - _coordinates(type(self))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no coordinates {sorted(unknown)}")
        for name, value in coordinates.items():
            setattr(self, name, value)
        super().__init__(message)


def _coordinates(cls: type[RollcutError]) -> set[str]:
    return {name for k in cls.__mro__ for name in inspect.get_annotations(k)}


class ConfigError(RollcutError):
    """A setting is missing, malformed or contradicts another one."""


class CollectorBusyError(ConfigError):
    """Another collector holds this namespace (its lease on the bus is live): two collectors on one
    namespace would drive the same rollouts against each other. Exits 2."""

    namespace: str | None = None
    holder: str | None = None
    host: str | None = None
    pid: int | None = None
    expires_in_s: float | None = None


class SchemaError(RollcutError):
    """A record does not match its schema; the message names field and rule."""


class UnknownEventKindError(SchemaError):
    """A record's kind is not one this rollcut knows (a newer writer, or garbage)."""

    kind: str

    def __init__(self, kind: str, known: list[str]) -> None:
        super().__init__(
            f"unknown event kind {kind!r}: this rollcut knows {', '.join(sorted(known))}", kind=kind
        )


class SchemaVersionError(SchemaError):
    """A record was written by a newer rollcut than this one."""

    found: int
    supported: int

    def __init__(self, what: str, found: int, supported: int) -> None:
        super().__init__(
            f"{what} has schema_version {found}, newer than the {supported} this rollcut "
            "supports; upgrade rollcut to read it",
            found=found,
            supported=supported,
        )


class EventTooLargeError(RollcutError):
    """An event encodes past the size limit; large blobs belong in the token store."""

    kind: str
    size: int
    limit: int

    def __init__(self, kind: str, size: int, limit: int) -> None:
        super().__init__(
            f"{kind} event encodes to {size} bytes, over the {limit}-byte limit; "
            "large blobs (tokens, files) belong in the token store and are referenced by receipt",
            kind=kind,
            size=size,
            limit=limit,
        )


class CorruptEventError(RollcutError):
    """Stored bytes fail their checksum or do not decode; names the stream, seq and subject."""

    reason: str
    stream: str
    seq: int
    subject: str

    def __init__(self, reason: str, *, stream: str = "", seq: int = 0, subject: str = "") -> None:
        where = f"stream {stream} seq {seq} ({subject})" if seq else "payload"
        super().__init__(
            f"corrupt event at {where}: {reason}", reason=reason, stream=stream, seq=seq, subject=subject
        )


class BusError(RollcutError):
    """The NATS server or the connection to it failed an operation."""

    stream: str | None = None
    seq: int | None = None
    subject: str | None = None
    rollout_id: str | None = None
    attempt: int | None = None


class ServerVersionError(BusError):
    """The NATS server is older than rollcut's floor (2.12)."""

    pass


class PermissionDeniedError(BusError):
    """The server refused a publish: this connection's role may not write there."""

    def __init__(self, subject: str) -> None:
        super().__init__(
            f"the server refused publishing to {subject}: this role may not write there", subject=subject
        )


class ServerStartError(BusError):
    """A server process (nats-server or a Gym server) did not start."""

    pass


class FenceError(RollcutError):
    """An attempt-lifecycle rule was violated."""

    rollout_id: str | None = None
    attempt: int | None = None


class StaleAttemptError(FenceError):
    """The server rejected a write from an attempt that is no longer current."""

    rollout_id: str
    attempt: int
    current_attempt: int | None

    def __init__(self, rollout_id: str, attempt: int, current_attempt: int | None) -> None:
        now = f"attempt {current_attempt} is current" if current_attempt is not None else "no attempt is open"
        super().__init__(
            f"rollout {rollout_id!r}: attempt {attempt} is stale ({now}); "
            "the write was refused by the server and changed nothing",
            rollout_id=rollout_id,
            attempt=attempt,
            current_attempt=current_attempt,
        )


class AttemptConflictError(FenceError):
    """Another writer moved the rollout's fence first; look at the fence again."""

    def __init__(self, rollout_id: str, message: str) -> None:
        super().__init__(f"rollout {rollout_id!r}: {message}", rollout_id=rollout_id)


class RolloutExistsError(FenceError):
    """The rollout was already dispatched; dispatch happens once."""

    def __init__(self, rollout_id: str) -> None:
        super().__init__(f"rollout {rollout_id!r} was already dispatched", rollout_id=rollout_id)


class LedgerError(RollcutError):
    """The LMDB ledger cannot be opened or read."""

    path: str | None = None
    stream: str | None = None
    checkpoint_id: str | None = None
    rollout_id: str | None = None


class LedgerSchemaError(LedgerError):
    """The ledger was written by a newer rollcut; it is left untouched."""


class LedgerCorruptError(LedgerError):
    """The ledger's files cannot be read; rebuild it from the stream."""


class StorageError(RollcutError):
    """Storage failed under rollcut (a disk full, unwritable or failing; the bus out of space); the
    operation did not happen and nothing acknowledged was lost."""

    path: str | None = None
    subject: str | None = None
    errno: int | None = None


class BusFullError(StorageError, BusError):
    """The stream refused an append for lack of room (its byte or message limit, the server's disk).
    Nothing was appended, so the same call can be retried once room is made; it is both a bus
    failure and a storage one, and exits as storage (74)."""


class TokenStoreError(RollcutError):
    """The token store is missing a record, or a record fails its digest."""

    store: str | None = None
    receipt_id: str | None = None
    call_id: str | None = None
    checkpoint_id: str | None = None


class AdmissionClosedError(RollcutError):
    """A request arrived while a checkpoint holds admission closed: retry later."""

    retryable = True
    instance: str
    checkpoint_id: str
    retry_after_s: float

    def __init__(self, instance: str, checkpoint_id: str, retry_after_s: float) -> None:
        super().__init__(
            f"{instance}: admission is closed for checkpoint {checkpoint_id}; retry in {retry_after_s:.1f}s",
            instance=instance,
            checkpoint_id=checkpoint_id,
            retry_after_s=retry_after_s,
        )


class CheckpointError(RollcutError):
    """A checkpoint could not be taken, committed or restored."""

    checkpoint_id: str
    participant: str | None

    def __init__(self, message: str, *, checkpoint_id: str = "", participant: str | None = None) -> None:
        super().__init__(message, checkpoint_id=checkpoint_id, participant=participant)


class CheckpointFailedError(CheckpointError):
    """The checkpoint was aborted: nothing was published and admission was reopened."""


class CheckpointConflictError(CheckpointError):
    """Another checkpoint holds the coordinator lane."""


class StaleCheckpointError(CheckpointError):
    """A control operation named a checkpoint that is not the participant's active one."""
