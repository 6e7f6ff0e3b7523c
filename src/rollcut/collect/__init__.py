"""Rollout collection: the reference framework integration, and the demo."""

from ._collector import EXIT_REQUEUE, Collector
from ._config import CheckpointPolicy, CollectConfig, CompactionPolicy, load_config
from ._demo import ALTERNATIVES, run_demo
from ._export import ExportError, Turn, padded, read_turns
from ._lease import DEFAULT_LEASE_TTL_S, NamespaceLease
from ._phase import DEMO_NAMESPACE
from ._rows import RolloutInput, Rows, failures_path, is_nemo_row, load_rows
from ._story import (
    Checkpointed,
    Compared,
    Comparing,
    Continuation,
    Crashed,
    Progressed,
    Resumed,
    Standing,
    Started,
    StoryEvent,
)
from ._summary import CollectorHooks, Summary, summary_dict
from ._tasks import demo_rows, demo_tasks
from ._work import WorkTally, count_work

__all__ = [
    "ALTERNATIVES",
    "DEFAULT_LEASE_TTL_S",
    "DEMO_NAMESPACE",
    "EXIT_REQUEUE",
    "CheckpointPolicy",
    "Checkpointed",
    "CollectConfig",
    "Collector",
    "CollectorHooks",
    "CompactionPolicy",
    "Compared",
    "Comparing",
    "Continuation",
    "Crashed",
    "ExportError",
    "NamespaceLease",
    "Progressed",
    "Resumed",
    "RolloutInput",
    "Rows",
    "Standing",
    "Started",
    "StoryEvent",
    "Summary",
    "Turn",
    "WorkTally",
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
