"""Stateful tool environments as checkpoint participants."""

from ._app import aggregate_metrics, create_resources_app, final_text, task_fields
from ._env import Environment, ToolResult
from ._envs import ENVIRONMENTS, Blackjack, Counter, MathVerifier, Scratchpad, Workplace, WorkplaceExported
from ._service import NotContinuable, ResourcesService, Session

__all__ = [
    "ENVIRONMENTS",
    "Blackjack",
    "Counter",
    "Environment",
    "MathVerifier",
    "NotContinuable",
    "ResourcesService",
    "Scratchpad",
    "Session",
    "ToolResult",
    "Workplace",
    "WorkplaceExported",
    "aggregate_metrics",
    "create_resources_app",
    "final_text",
    "task_fields",
]
