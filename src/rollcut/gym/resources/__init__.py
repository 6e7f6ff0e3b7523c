"""Stateful tool environments as checkpoint participants."""

from ._app import aggregate_metrics, create_resources_app, final_text, task_fields
from ._env import Environment, ToolResult
from ._envs import (
    ENVIRONMENTS,
    Blackjack,
    Counter,
    Judge,
    MathVerifier,
    Scratchpad,
    Workplace,
    WorkplaceExported,
)
from ._gym_env import GymEnvironment, tool
from ._service import NotContinuable, ResourcesService, Session
from ._stateful_counter import StatefulCounter

__all__ = [
    "ENVIRONMENTS",
    "Blackjack",
    "Counter",
    "Environment",
    "GymEnvironment",
    "Judge",
    "MathVerifier",
    "NotContinuable",
    "ResourcesService",
    "Scratchpad",
    "Session",
    "StatefulCounter",
    "ToolResult",
    "Workplace",
    "WorkplaceExported",
    "aggregate_metrics",
    "create_resources_app",
    "final_text",
    "task_fields",
    "tool",
]
