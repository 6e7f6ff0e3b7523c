"""Every extension point's registry, declared in one place with lazy references.

Each package re-exports its own, typed with its factories' type
(``rollcut.gym.resources.ENVIRONMENTS``, …); they live here, below every
package, so the command line can list what is installed without importing the
servers, and nothing here imports upward (the references are strings). The
entry point group of each is its name:
``rollcut.environments``, ``rollcut.engines``, ``rollcut.backends``,
``rollcut.agents``, ``rollcut.sandboxes``.
"""

from __future__ import annotations

from typing import Any

from ._errors import ConfigError
from ._registry import Registry

__all__ = ["AGENTS", "BACKENDS", "DIALECTS", "ENVIRONMENTS", "SANDBOXES"]

_ENVS = "rollcut.gym.resources._envs"


def _named_as_registered(name: str, env: Any) -> None:
    """An environment's ``name`` is what its events and snapshots carry, and a restore finds its
    environment by it: one registered under another key would be restored as nothing (a fresh
    dispatch, without a word). Refused when registered."""
    own = getattr(env, "name", None)
    if own != name:
        raise ConfigError(f"environment {name!r} is registered under a name its class does not have: {own!r}")


ENVIRONMENTS: Registry[Any] = Registry(
    "environment",
    "rollcut.environments",
    {
        "counter": f"{_ENVS}:Counter",
        "blackjack": f"{_ENVS}:Blackjack",
        "workplace": f"{_ENVS}:Workplace",
        "workplace_exported": f"{_ENVS}:WorkplaceExported",
        "math": f"{_ENVS}:MathVerifier",
        "judge": f"{_ENVS}:Judge",
        "letters": f"{_ENVS}:Letters",
        "scratchpad": f"{_ENVS}:Scratchpad",
        "stateful_counter": "rollcut.gym.resources._stateful_counter:StatefulCounter",
        "sandbox": "rollcut.gym.resources._sandbox:Sandbox",
        "nemo-gym": "rollcut.gym.resources._nemo_gym:NemoGym",
    },
    admit=_named_as_registered,
)
"""Resources environments (``rollcut serve resources NAME``): an :class:`Environment` subclass."""

DIALECTS: Registry[Any] = Registry(
    "engine dialect",
    "rollcut.engines",
    {
        "llama.cpp": "rollcut.gym.model.engine._dialects:LlamaCpp",
        "vllm": "rollcut.gym.model.engine._dialects:VLLM",
        "sglang": "rollcut.gym.model.engine._sglang:SGLang",
    },
)
"""Inference engines an engine backend speaks to (``--backend-option dialect=NAME``): called with
the model name (``--backend-option model=NAME``, or None), returns a :class:`Dialect`."""

_BACKENDS = "rollcut.gym.model._backends"

BACKENDS: Registry[Any] = Registry(
    "model backend",
    "rollcut.backends",
    {"local": f"{_BACKENDS}:local", "openai": f"{_BACKENDS}:openai", "engine": f"{_BACKENDS}:engine"},
)
"""Generation backends of the model server (``--backend NAME``): called with the server's
options, returns a :class:`Backend`; a :class:`~rollcut.gym.model.BackendFactory` brings its own
options (``--backend-option KEY=VALUE``)."""

AGENTS: Registry[Any] = Registry(
    "agent kind",
    "rollcut.agents",
    {
        "simple": "rollcut.gym.agent._kind:simple",
        "opaque": "rollcut.gym.opaque._kind:opaque",
        "nemo-gym": "rollcut.gym.agent._nemo_kind:nemo_gym",
    },
)
"""Agent servers (``rollcut serve agent NAME``): called with the server's options and its own base
URL, returns what builds each worker's app and participant hooks."""

SANDBOXES: Registry[Any] = Registry(
    "sandbox provider", "rollcut.sandboxes", {"tree": "rollcut.gym.opaque._tree:TreeSnapshot"}
)
"""Snapshotters of an opaque agent's sandbox (``--sandbox NAME[:ARG]``): called with the argument
after the colon, returns a :class:`SandboxSnapshot`. Built in: ``tree`` (its working directory,
``--sandbox DIR-TEMPLATE`` for short)."""
