"""Rollout collection: the reference framework integration, and the demo."""

from ._collector import EXIT_REQUEUE, Collector
from ._config import CheckpointPolicy, CollectConfig, CompactionPolicy, load_config
from ._demo import DEMO_NAMESPACE, count_work, demo_rows, demo_tasks, run_demo
from ._export import ExportError, Turn, padded, read_turns
from ._lease import DEFAULT_LEASE_TTL_S, NamespaceLease
from ._rows import RolloutInput, Rows, failures_path, is_nemo_row, load_rows
from ._summary import Summary, summary_dict

__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "DEMO_NAMESPACE",
    "EXIT_REQUEUE",
    "CheckpointPolicy",
    "CollectConfig",
    "Collector",
    "CompactionPolicy",
    "ExportError",
    "NamespaceLease",
    "RolloutInput",
    "Rows",
    "Summary",
    "Turn",
    "count_work",
    "demo_rows",
    "demo_tasks",
    "failures_path",
    "is_nemo_row",
    "load_config",
    "load_rows",
    "padded",
    "read_turns",
    "run_demo",
    "summary_dict",
]
