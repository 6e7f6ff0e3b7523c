"""rollcut: crash-safe partial-rollout checkpointing on NATS JetStream and LMDB."""

from ._errors import (
    AttemptConflictError,
    BusError,
    ConfigError,
    CorruptEventError,
    EventTooLargeError,
    FenceError,
    LedgerCorruptError,
    LedgerError,
    LedgerSchemaError,
    RollcutError,
    RolloutExistsError,
    SchemaError,
    SchemaVersionError,
    ServerStartError,
    ServerVersionError,
    StaleAttemptError,
    UnknownEventKindError,
)

__version__ = "0.1.0"

__all__ = [
    "AttemptConflictError",
    "BusError",
    "ConfigError",
    "CorruptEventError",
    "EventTooLargeError",
    "FenceError",
    "LedgerCorruptError",
    "LedgerError",
    "LedgerSchemaError",
    "RollcutError",
    "RolloutExistsError",
    "SchemaError",
    "SchemaVersionError",
    "ServerStartError",
    "ServerVersionError",
    "StaleAttemptError",
    "UnknownEventKindError",
    "__version__",
]
