"""Runnable Gym servers built on rollcut's public APIs, their options, and the process harness.

The wire protocol they speak (identity, error kinds, domain errors) is
:mod:`rollcut.gym.wire`.
"""

from ._harness import STACK, ServerProcess, start_stack
from ._options import (
    AgentServe,
    EnvironmentServe,
    ModelServe,
    ResourcesServe,
    ServeOptions,
    ServeSpec,
    decode_spec,
)
from ._runners import Make, serve, serve_participant, serve_worker
from ._serving import run_servers

__all__ = [
    "STACK",
    "AgentServe",
    "EnvironmentServe",
    "Make",
    "ModelServe",
    "ResourcesServe",
    "ServeOptions",
    "ServeSpec",
    "ServerProcess",
    "decode_spec",
    "run_servers",
    "serve",
    "serve_participant",
    "serve_worker",
    "start_stack",
]
