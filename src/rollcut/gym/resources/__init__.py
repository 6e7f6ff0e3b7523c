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
from ._metrics import aggregate_metrics, pass_at_k, verify_responses
from ._routes import create_resources_app, final_text, task_fields
from ._sandbox import Sandbox, SandboxState
from ._sandbox_tasks import TASKS as _SANDBOX_TASKS
from ._sandbox_tasks import Task as SandboxTask
from ._service import NotContinuable, ResourcesService, Session
from ._stateful_counter import StatefulCounter

ENVIRONMENTS: _Registry[type[Environment]] = _registries.ENVIRONMENTS
"""The environments ``rollcut serve resources NAME`` offers, by name (entry point group
``rollcut.environments``)."""

SANDBOX_TASKS: dict[str, SandboxTask] = _SANDBOX_TASKS
"""The sandbox environment's bundled tasks, by name (a session's seed: ``{"task": NAME}``)."""

__all__ = [
    "ENVIRONMENTS",
    "SANDBOX_TASKS",
    "Blackjack",
    "Counter",
    "Environment",
    "GymEnvironment",
    "Judge",
    "Letters",
    "MathVerifier",
    "NotContinuable",
    "ResourcesService",
    "Sandbox",
    "SandboxState",
    "SandboxTask",
    "Scratchpad",
    "Session",
    "StatefulCounter",
    "ToolResult",
    "Workplace",
    "WorkplaceExported",
    "aggregate_metrics",
    "create_resources_app",
    "final_text",
    "pass_at_k",
    "task_fields",
    "tool",
    "verify_responses",
]
