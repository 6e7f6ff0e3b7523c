"""The ledger: an LMDB checkpoint catalog and per-rollout index, rebuildable from the stream."""

from ._compact import CompactionReport, compact
from ._ledger import Ledger
from ._projector import Projector, rebuild_ledger
from ._records import LEDGER_SCHEMA_VERSION, CheckpointRecord, RolloutIndex
from ._tail import TailValidator
from ._validate import Finding, ReferenceCheck, validate_references
from ._verify import VerifyReport, verify_checkpoint, verify_report

__all__ = [
    "LEDGER_SCHEMA_VERSION",
    "CheckpointRecord",
    "CompactionReport",
    "Finding",
    "Ledger",
    "Projector",
    "ReferenceCheck",
    "RolloutIndex",
    "TailValidator",
    "VerifyReport",
    "compact",
    "rebuild_ledger",
    "validate_references",
    "verify_checkpoint",
    "verify_report",
]
