"""Runnable Gym servers built on rollcut's public APIs, their options, workers and extension points.

The wire protocol they speak (identity, error kinds, domain errors) is
:mod:`rollcut.gym.wire`.
"""

from ._agents import AGENTS, SANDBOXES
from ._environment import create_environment_app
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
from ._peers import FORWARDED_HEADER, Peers, owner_of
from ._runners import Make, serve, serve_participant, serve_worker
from ._serving import bind, run_servers, run_worker, say, serve_on

__all__ = [
    "AGENTS",
    "FORWARDED_HEADER",
    "SANDBOXES",
    "AgentServe",
    "EnvironmentServe",
    "Make",
    "ModelServe",
    "Peers",
    "ResourcesServe",
    "ServeOptions",
    "ServeSpec",
    "bind",
    "cli_argv",
    "create_environment_app",
    "decode_spec",
    "encode_spec",
    "owner_of",
    "run_servers",
    "run_worker",
    "say",
    "serve",
    "serve_on",
    "serve_participant",
    "serve_worker",
]
