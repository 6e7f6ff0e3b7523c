"""The model server's built-in generation backends, as ``rollcut.backends`` factories.

Each takes the server's options and returns a :class:`~rollcut.gym.model.Backend`;
the registry (:data:`rollcut.gym.model.BACKENDS`) names them ``local``, ``openai``
and ``engine``, and another package adds its own through the same entry point
group.
"""

from __future__ import annotations

import httpx

from ..._errors import ConfigError
from .._options import ModelServe
from ._backend import Backend
from ._local import LocalBackend
from ._openai import OpenAIBackend

__all__ = ["engine", "local", "openai"]


def local(opts: ModelServe) -> Backend:
    """The deterministic local planner (tests, the demo)."""
    return LocalBackend(seed=opts.seed, token_delay_s=opts.token_delay, tool_turns=opts.tool_turns)


def openai(opts: ModelServe) -> Backend:
    """Any OpenAI-compatible server at ``--upstream`` (no generation cuts)."""
    if not opts.upstream:
        raise ConfigError("backend 'openai' needs --upstream URL")
    return OpenAIBackend(httpx.AsyncClient(base_url=opts.upstream, timeout=600))


def engine(opts: ModelServe) -> Backend:
    """A real inference engine at ``--upstream``, spoken to in ``--engine-dialect``, cutting
    generations at checkpoints unless ``--engine-no-cuts``."""
    from .engine import engine_backend  # the engine package is loaded only by servers that use it

    if not opts.upstream:
        raise ConfigError("backend 'engine' needs --upstream URL")
    return engine_backend(
        opts.upstream,
        opts.engine_dialect,
        model=opts.engine_model,
        max_tokens=opts.max_tokens,
        cuts=not opts.engine_no_cuts,
        handover_s=opts.engine_handover,
    )
