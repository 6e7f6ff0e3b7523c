"""Stateful tool environments as checkpoint participants."""

from ... import _registries
from ..._registry import Registry as _Registry
from ._env import Environment, ToolResult
from ._envs import (
    Blackjack,
    Counter,
    Judge,
    Letters,
    MathVerifier,
    Scratchpad,
    Workplace,
    WorkplaceExported,
)
from ._gym_env import GymEnvironment, tool
from ._routes import aggregate_metrics, create_resources_app, final_text, task_fields
from ._service import NotContinuable, ResourcesService, Session
from ._stateful_counter import StatefulCounter

ENVIRONMENTS: _Registry[type[Environment]] = _registries.ENVIRONMENTS
"""The environments ``rollcut serve resources NAME`` offers, by name (entry point group
``rollcut.environments``)."""

__all__ = [
    "ENVIRONMENTS",
    "Blackjack",
    "Counter",
    "Environment",
    "GymEnvironment",
    "Judge",
    "Letters",
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
