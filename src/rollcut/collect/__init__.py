"""Rollout collection: the reference framework integration, and the demo."""

from ._collector import EXIT_REQUEUE, Collector, Summary, summary_dict
from ._config import CheckpointPolicy, CollectConfig, load_config
from ._demo import DEMO_NAMESPACE, demo_tasks, run_demo

__all__ = [
    "DEMO_NAMESPACE",
    "EXIT_REQUEUE",
    "CheckpointPolicy",
    "CollectConfig",
    "Collector",
    "Summary",
    "demo_tasks",
    "load_config",
    "run_demo",
    "summary_dict",
]
