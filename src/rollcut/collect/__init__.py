"""Rollout collection: the reference framework integration, and the demo."""

from ._collector import Collector, RecoveryPlan, Summary, plan_recovery
from ._config import CheckpointPolicy, CollectConfig, load_config
from ._demo import demo_tasks, run_demo

__all__ = [
    "CheckpointPolicy",
    "CollectConfig",
    "Collector",
    "RecoveryPlan",
    "Summary",
    "demo_tasks",
    "load_config",
    "plan_recovery",
    "run_demo",
]
