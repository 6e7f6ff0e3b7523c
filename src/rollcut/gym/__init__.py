"""Runnable Gym servers built on rollcut's public APIs, their options, workers and extension points.

The wire protocol they speak (identity, error kinds, domain errors) is
:mod:`rollcut.gym.wire`.

Names load on first use (PEP 562), but for the options every server reads: a process imports
only what it serves, so a resources server or a collector does not pay for the model server's
OpenAI types (about a second of CPU per process, and a test deployment starts ten processes).
"""

from __future__ import annotations

import typing as _typing

from .._lazy import lazy_names as _lazy_names
from ._options import (
    SERVE_ARGUMENT,
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

if _typing.TYPE_CHECKING:
    from ._agents import AGENTS
    from ._environment import create_environment_app
    from ._peers import FORWARDED_HEADER, Peers, owner_of
    from ._runners import (
        Make,
        environment_of,
        model_app,
        serve,
        serve_participant,
        serve_worker,
        served_names,
    )
    from ._serving import bind, run_servers, run_worker, say, serve_on, worker_parser
    from .opaque._kind import SANDBOXES

_HOME = {
    "_agents": ("AGENTS",),
    "opaque._kind": ("SANDBOXES",),
    "_runners": (
        "Make",
        "environment_of",
        "model_app",
        "served_names",
        "serve",
        "serve_participant",
        "serve_worker",
    ),
    "_environment": ("create_environment_app",),
    "_peers": ("FORWARDED_HEADER", "Peers", "owner_of"),
    "_serving": ("bind", "run_servers", "run_worker", "say", "serve_on", "worker_parser"),
}


__getattr__ = _lazy_names(__name__, _HOME, globals())


__all__ = [
    "AGENTS",
    "FORWARDED_HEADER",
    "SANDBOXES",
    "SERVE_ARGUMENT",
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
    "environment_of",
    "model_app",
    "owner_of",
    "run_servers",
    "run_worker",
    "say",
    "serve",
    "serve_on",
    "serve_participant",
    "serve_worker",
    "served_names",
    "worker_parser",
]
