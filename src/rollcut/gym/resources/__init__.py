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
from ._nemo_catalogue import Level as NemoGymLevel
from ._nemo_catalogue import catalogue as nemo_gym_catalogue
from ._nemo_gym import DECLARED as _DECLARED
from ._nemo_gym import NemoGym, NemoGymServer
from ._nemo_gym import example_rows as nemo_gym_example_rows
from ._nemo_install import NEMO_GYM, NemoGymInstalled, NemoGymUnavailableError
from ._nemo_install import install as install_nemo_gym
from ._nemo_install import installed as nemo_gym_installed
from ._routes import create_resources_app, final_text, task_fields
from ._sandbox import Sandbox, SandboxState
from ._sandbox_tasks import TASKS as _SANDBOX_TASKS
from ._sandbox_tasks import Task as SandboxTask
from ._service import NotContinuable, ResourcesService, Session
from ._stateful_counter import StatefulCounter
from ._upstream import UpstreamEnvironment, first_difference

ENVIRONMENTS: _Registry[type[Environment]] = _registries.ENVIRONMENTS
"""The environments ``rollcut serve resources NAME`` offers, by name (entry point group
``rollcut.environments``)."""

NEMO_GYM_DECLARED: dict[str, tuple[str, str]] = _DECLARED
"""The NeMo Gym resources servers rollcut has checked, by name: their level and why (every other
one restarts: ``rollcut nemo-gym list``)."""
SANDBOX_TASKS: dict[str, SandboxTask] = _SANDBOX_TASKS
"""The sandbox environment's bundled tasks, by name (a session's seed: ``{"task": NAME}``)."""

__all__ = [
    "ENVIRONMENTS",
    "NEMO_GYM",
    "NEMO_GYM_DECLARED",
    "SANDBOX_TASKS",
    "Blackjack",
    "Counter",
    "Environment",
    "GymEnvironment",
    "Judge",
    "Letters",
    "MathVerifier",
    "NemoGym",
    "NemoGymInstalled",
    "NemoGymLevel",
    "NemoGymServer",
    "NemoGymUnavailableError",
    "NotContinuable",
    "ResourcesService",
    "Sandbox",
    "SandboxState",
    "SandboxTask",
    "Scratchpad",
    "Session",
    "StatefulCounter",
    "ToolResult",
    "UpstreamEnvironment",
    "Workplace",
    "WorkplaceExported",
    "aggregate_metrics",
    "create_resources_app",
    "final_text",
    "first_difference",
    "install_nemo_gym",
    "nemo_gym_catalogue",
    "nemo_gym_example_rows",
    "nemo_gym_installed",
    "pass_at_k",
    "task_fields",
    "tool",
    "verify_responses",
]
