"""Runnable Gym servers built on rollcut's public APIs, their options, and the process harness.

The wire protocol they speak (identity, error kinds, domain errors) is
:mod:`rollcut.gym.wire`.
"""

from ._environment import create_environment_app
from ._harness import DEMO_ENVIRONMENTS, ServerProcess, start_stack
from ._options import (
    AgentServe,
    EnvironmentServe,
    ModelServe,
    ResourcesServe,
    ServeOptions,
    ServeSpec,
    cli_argv,
    decode_spec,
    encode_spec,
)
from ._peers import Peers, owner_of
from ._runners import Make, serve, serve_participant, serve_worker
from ._serving import run_servers, run_worker

__all__ = [
    "DEMO_ENVIRONMENTS",
    "AgentServe",
    "EnvironmentServe",
    "Make",
    "ModelServe",
    "Peers",
    "ResourcesServe",
    "ServeOptions",
    "ServeSpec",
    "ServerProcess",
    "cli_argv",
    "create_environment_app",
    "decode_spec",
    "encode_spec",
    "owner_of",
    "run_servers",
    "run_worker",
    "serve",
    "serve_participant",
    "serve_worker",
    "start_stack",
]
