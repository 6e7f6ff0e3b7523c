"""Rollout collection: the reference framework integration (the collector, its config and hooks,
rows in and out, the namespace lease, trainer export)."""

from ._collector import EXIT_REQUEUE, Collector
from ._config import (
    NO_COMPACTION,
    CheckpointPolicy,
    CollectConfig,
    CollectOptions,
    CompactionPolicy,
    load_config,
)
from ._export import ExportError, Turn, padded, read_turns
from ._lease import DEFAULT_LEASE_TTL_S, NamespaceLease
from ._metrics import METRICS_FILE, CollectorMetrics, serve_metrics
from ._rows import RolloutInput, Rows, failures_path, is_nemo_row, load_rows, read_rows
from ._summary import CollectorHooks, Summary, summary_dict

__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "EXIT_REQUEUE",
    "METRICS_FILE",
    "NO_COMPACTION",
    "CheckpointPolicy",
    "CollectConfig",
    "CollectOptions",
    "Collector",
    "CollectorHooks",
    "CollectorMetrics",
    "CompactionPolicy",
    "ExportError",
    "NamespaceLease",
    "RolloutInput",
    "Rows",
    "Summary",
    "Turn",
    "failures_path",
    "is_nemo_row",
    "load_config",
    "load_rows",
    "padded",
    "read_rows",
    "read_turns",
    "serve_metrics",
    "summary_dict",
]
