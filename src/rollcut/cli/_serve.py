"""``rollcut serve``: the Gym servers as checkpoint participants.

Each command's flags are made from its options struct (:mod:`rollcut.gym`: a field is a flag, its
type, default and help declared there once, ``_flags``); a server's worker processes get that
struct as JSON from their supervisor (``python -m rollcut.gym``, not through this app).
"""

from __future__ import annotations

import typer

from .._errors import RollcutError
from ..gym import SERVE_ARGUMENT, AgentServe, EnvironmentServe, ModelServe, ResourcesServe, ServeSpec
from ._flags import command_of
from ._target import app, fail

__all__ = ["serve_app"]

serve_app = typer.Typer(no_args_is_help=True, help="Run the Gym servers (policy model, …) as participants.")
app.add_typer(serve_app, name="serve")


def _serve(opts: ServeSpec) -> None:
    """Serve ``opts`` (the Gym servers load only here)."""
    from .. import gym

    try:
        gym.serve(opts)
    except RollcutError as exc:
        raise fail(str(exc)) from exc


def _register(name: str, cls: type[ServeSpec], help: str) -> None:
    command = command_of(cls, _serve, arguments=SERVE_ARGUMENT.get(cls, ()))
    serve_app.command(name, help=help)(command)


_register("model", ModelServe, "The OpenAI-compatible policy model server with durable call custody.")
_register("resources", ResourcesServe, "A stateful resources (tool) server whose sessions restore exactly.")
_register(
    "agent",
    AgentServe,
    "An agent: the Simple Agent (boundaries, parking, continuation), or an opaque agent's program "
    "behind the journaling relay (docs/opaque-agents.md).",
)
_register(
    "environment",
    EnvironmentServe,
    "The episode orchestrator: one /run per task, recording each episode's completion.",
)
