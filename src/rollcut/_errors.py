"""The one exception tree of rollcut.

Every error rollcut raises derives from :class:`RollcutError`. Foreign
exceptions (nats-py, lmdb, zstandard, msgspec) are translated where they
cross into rollcut and chained with ``raise ... from exc``, so a caller can
catch one root and still see the original cause.

    RollcutError
    ├── ConfigError
    ├── SchemaError                 bad input: names the field and the rule
    │   ├── UnknownEventKindError
    │   └── SchemaVersionError      written by a newer rollcut
    ├── EventTooLargeError
    ├── CorruptEventError           stored bytes fail their digest or decode
    ├── BusError                    the NATS server or connection failed us
    │   ├── ServerVersionError
    │   ├── ServerStartError
    │   └── PermissionDeniedError   the role may not publish there
    ├── FenceError
    │   ├── StaleAttemptError       the server refused a tombstoned attempt
    │   ├── AttemptConflictError    someone else moved the fence first
    │   └── RolloutExistsError
    ├── LedgerError
    │   ├── LedgerSchemaError
    │   └── LedgerCorruptError
    ├── TokenStoreError
    ├── AdmissionClosedError        retryable: a checkpoint holds admission
    └── CheckpointError
        ├── CheckpointFailedError   aborted, nothing published, admission reopened
        ├── CheckpointConflictError another checkpoint holds the coordinator lane
        └── StaleCheckpointError    a control op named a non-active checkpoint

Errors carry the identifiers an operator needs (stream, seq, subject,
rollout_id, attempt, checkpoint_id, path, receipt_id) as attributes, not only
inside the message; a field that does not apply is None.
"""

from __future__ import annotations

__all__ = [
    "AdmissionClosedError",
    "AttemptConflictError",
    "BusError",
    "CheckpointConflictError",
    "CheckpointError",
    "CheckpointFailedError",
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
    "TokenStoreError",
    "UnknownEventKindError",
]


class RollcutError(Exception):
    """Root of every error rollcut raises."""


class ConfigError(RollcutError):
    """A setting is missing, malformed or contradicts another one."""


class SchemaError(RollcutError):
    """A record does not match its schema; the message names field and rule."""


class UnknownEventKindError(SchemaError):
    """A record's kind is not one this rollcut knows (a newer writer, or garbage)."""

    def __init__(self, kind: str, known: list[str]) -> None:
        self.kind = kind
        super().__init__(f"unknown event kind {kind!r}: this rollcut knows {', '.join(sorted(known))}")


class SchemaVersionError(SchemaError):
    """A record was written by a newer rollcut than this one."""

    def __init__(self, what: str, found: int, supported: int) -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            f"{what} has schema_version {found}, newer than the {supported} this rollcut "
            "supports; upgrade rollcut to read it"
        )


class EventTooLargeError(RollcutError):
    """An event encodes past the size limit; large blobs belong in the token store."""

    def __init__(self, kind: str, size: int, limit: int) -> None:
        self.kind = kind
        self.size = size
        self.limit = limit
        super().__init__(
            f"{kind} event encodes to {size} bytes, over the {limit}-byte limit; "
            "large blobs (tokens, files) belong in the token store and are referenced by receipt"
        )


class CorruptEventError(RollcutError):
    """Stored bytes fail their checksum or do not decode; names the stream, seq and subject."""

    def __init__(self, reason: str, *, stream: str = "", seq: int = 0, subject: str = "") -> None:
        self.reason = reason
        self.stream = stream
        self.seq = seq
        self.subject = subject
        where = f"stream {stream} seq {seq} ({subject})" if seq else "payload"
        super().__init__(f"corrupt event at {where}: {reason}")


class BusError(RollcutError):
    """The NATS server or the connection to it failed an operation."""

    def __init__(
        self,
        message: str,
        *,
        stream: str | None = None,
        seq: int | None = None,
        subject: str | None = None,
        rollout_id: str | None = None,
        attempt: int | None = None,
    ) -> None:
        self.stream = stream
        self.seq = seq
        self.subject = subject
        self.rollout_id = rollout_id
        self.attempt = attempt
        super().__init__(message)


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


class StaleAttemptError(FenceError):
    """The server rejected a write from an attempt that is no longer current."""

    def __init__(self, rollout_id: str, attempt: int, current_attempt: int | None) -> None:
        self.rollout_id = rollout_id
        self.attempt = attempt
        self.current_attempt = current_attempt
        now = f"attempt {current_attempt} is current" if current_attempt is not None else "no attempt is open"
        super().__init__(
            f"rollout {rollout_id!r}: attempt {attempt} is stale ({now}); "
            "the write was refused by the server and changed nothing"
        )


class AttemptConflictError(FenceError):
    """Another writer moved the rollout's fence first; look at the fence again."""

    def __init__(self, rollout_id: str, message: str) -> None:
        self.rollout_id = rollout_id
        super().__init__(f"rollout {rollout_id!r}: {message}")


class RolloutExistsError(FenceError):
    """The rollout was already dispatched; dispatch happens once."""

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id
        super().__init__(f"rollout {rollout_id!r} was already dispatched")


class LedgerError(RollcutError):
    """The LMDB ledger cannot be opened or read."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        stream: str | None = None,
        checkpoint_id: str | None = None,
        rollout_id: str | None = None,
    ) -> None:
        self.path = path
        self.stream = stream
        self.checkpoint_id = checkpoint_id
        self.rollout_id = rollout_id
        super().__init__(message)


class LedgerSchemaError(LedgerError):
    """The ledger was written by a newer rollcut; it is left untouched."""

    pass


class LedgerCorruptError(LedgerError):
    """The ledger's files cannot be read; rebuild it from the stream."""

    pass


class TokenStoreError(RollcutError):
    """The token store is missing a record, or a record fails its digest."""

    def __init__(
        self,
        message: str,
        *,
        store: str | None = None,
        receipt_id: str | None = None,
        call_id: str | None = None,
        checkpoint_id: str | None = None,
    ) -> None:
        self.store = store
        self.receipt_id = receipt_id
        self.call_id = call_id
        self.checkpoint_id = checkpoint_id
        super().__init__(message)


class AdmissionClosedError(RollcutError):
    """A request arrived while a checkpoint holds admission closed: retry later."""

    retryable = True

    def __init__(self, instance: str, checkpoint_id: str, retry_after_s: float) -> None:
        self.instance = instance
        self.checkpoint_id = checkpoint_id
        self.retry_after_s = retry_after_s
        super().__init__(
            f"{instance}: admission is closed for checkpoint {checkpoint_id}; retry in {retry_after_s:.1f}s"
        )


class CheckpointError(RollcutError):
    """A checkpoint could not be taken, committed or restored."""

    def __init__(self, message: str, *, checkpoint_id: str = "", participant: str | None = None) -> None:
        self.checkpoint_id = checkpoint_id
        self.participant = participant
        super().__init__(message)


class CheckpointFailedError(CheckpointError):
    """The checkpoint was aborted: nothing was published and admission was reopened."""


class CheckpointConflictError(CheckpointError):
    """Another checkpoint holds the coordinator lane."""


class StaleCheckpointError(CheckpointError):
    """A control operation named a checkpoint that is not the participant's active one."""
