"""Runnable Gym servers built on rollcut's public APIs, their options, workers and extension points.

The wire protocol they speak (identity, error kinds, domain errors) is
:mod:`rollcut.gym.wire`.

Names load on first use (PEP 562): a process imports only what it serves, so a resources server
or a collector does not pay for the model server's OpenAI types (about a second of CPU per
process, and a test deployment starts ten processes).
"""

from __future__ import annotations

import typing as _typing

from .._lazy import lazy_names as _lazy_names

if _typing.TYPE_CHECKING:
    from ._agents import AGENTS
    from ._environment import create_environment_app
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
    from ._serving import bind, run_servers, run_worker, say, serve_on
    from .opaque._kind import SANDBOXES

_HOME = {
    "AGENTS": "_agents",
    "SANDBOXES": "opaque._kind",
    "Make": "_runners",
    "create_environment_app": "_environment",
    "SERVE_ARGUMENT": "_options",
    "AgentServe": "_options",
    "EnvironmentServe": "_options",
    "ModelServe": "_options",
    "ResourcesServe": "_options",
    "ServeOptions": "_options",
    "ServeSpec": "_options",
    "cli_argv": "_options",
    "decode_spec": "_options",
    "encode_spec": "_options",
    "FORWARDED_HEADER": "_peers",
    "Peers": "_peers",
    "owner_of": "_peers",
    "environment_of": "_runners",
    "model_app": "_runners",
    "served_names": "_runners",
    "serve": "_runners",
    "serve_participant": "_runners",
    "serve_worker": "_runners",
    "bind": "_serving",
    "run_servers": "_serving",
    "run_worker": "_serving",
    "say": "_serving",
    "serve_on": "_serving",
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
]
