"""The model server's built-in generation backends, as ``rollcut.backends`` factories.

A factory brings its own options: a :class:`BackendFactory` pairs an options struct with how to
make the backend from it, and reads the struct from the server's ``--backend-option KEY=VALUE``
(``ModelServe.backend_options``), refusing a name it does not know. The registry
(:data:`rollcut.gym.model.BACKENDS`) names the built-in ones ``local``, ``openai`` and ``engine``;
another package adds its own through the same entry point group, a ``BackendFactory`` or any
callable taking the server's options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import httpx
import msgspec

from ..._errors import ConfigError
from .._options import ModelServe
from .._pace import Pace, TokenTally
from ._backend import Backend
from ._local import LocalBackend
from ._openai import OpenAIBackend

__all__ = ["BackendFactory", "EngineOptions", "LocalOptions", "engine", "local", "openai"]

Opts = TypeVar("Opts", bound=msgspec.Struct)


@dataclass(frozen=True)
class BackendFactory(Generic[Opts]):
    """A backend as the registry holds it: its options struct, how to make it from them and the
    server's options, and what to check before anything is bound (a name in another registry)."""

    options: type[Opts]
    make: Callable[[ModelServe, Opts], Backend]
    check_options: Callable[[ModelServe, Opts], None] | None = None

    def options_of(self, opts: ModelServe) -> Opts:
        """This backend's options from ``--backend-option``; a ConfigError naming what it takes."""
        try:
            return msgspec.convert(opts.backend_options, self.options, strict=False)
        except msgspec.ValidationError as exc:
            takes = ", ".join(f.name for f in msgspec.structs.fields(self.options)) or "none"
            raise ConfigError(f"--backend {opts.backend}: {exc} (its options: {takes})") from exc

    def check(self, opts: ModelServe) -> None:
        """Refuse options this backend cannot run with, before the server binds anything."""
        options = self.options_of(opts)
        if self.check_options is not None:
            self.check_options(opts, options)

    def __call__(self, opts: ModelServe) -> Backend:
        return self.make(opts, self.options_of(opts))


class LocalOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The local planner's options."""

    seed: int = 0
    """Seeds every plan (with the request's own seed and prompt)."""
    token_delay: float = 0.0
    """Seconds per generated token: the time a real model would take."""
    tool_turns: int = 3
    """Tool calls before a final answer."""
    step_ms: float = 0.0
    """A decode step's fixed milliseconds: every call of the process shares one decode loop, as a
    batched engine does (0: no shared loop)."""
    per_sequence_ms: float = 0.0
    """A decode step's milliseconds per call in its batch."""
    count_tokens: str = ""
    """A file whose length counts every token generated (one byte each, appended as generated: what
    a killed server generated for calls it never finished is counted too)."""


class NoOptions(msgspec.Struct, forbid_unknown_fields=True):
    """A backend that takes no option of its own."""


class EngineOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An inference engine's options."""

    dialect: str = "llama.cpp"
    """The engine's dialect (:data:`rollcut.gym.model.engine.DIALECTS`)."""
    model: str = ""
    """The model name the engine serves (empty: the dialect's default)."""
    cuts: bool = True
    """Cut running generations at a checkpoint (false: they are excluded, as the openai backend's)."""
    handover: float = 0.0
    """Seconds a call waits for an engine that went away (a restart on new weights) before it fails;
    it then goes on from the tokens it has."""
    max_tokens: int = 1024
    """A call's budget when it names none."""


def _local(opts: ModelServe, o: LocalOptions) -> Backend:
    return LocalBackend(
        seed=o.seed,
        token_delay_s=o.token_delay,
        tool_turns=o.tool_turns,
        pace=Pace(o.step_ms / 1000, o.per_sequence_ms / 1000) if o.step_ms or o.per_sequence_ms else None,
        tally=TokenTally(Path(o.count_tokens)) if o.count_tokens else None,
    )


def _upstream(opts: ModelServe, _: msgspec.Struct) -> None:
    if not opts.upstream:
        raise ConfigError(f"backend {opts.backend!r} needs --upstream URL")


def _openai(opts: ModelServe, _: NoOptions) -> Backend:
    _upstream(opts, _)
    return OpenAIBackend(httpx.AsyncClient(base_url=opts.upstream, timeout=600))


def _check_engine(opts: ModelServe, o: EngineOptions) -> None:
    from .engine import DIALECTS

    _upstream(opts, o)
    DIALECTS.check(o.dialect)


def _engine(opts: ModelServe, o: EngineOptions) -> Backend:
    from .engine import engine_backend  # the engine package is loaded only by servers that use it

    backend = engine_backend(
        opts.upstream, o.dialect, model=o.model, max_tokens=o.max_tokens, cuts=o.cuts, handover_s=o.handover
    )
    backend.pin_slots = opts.workers <= 1  # one worker alone pins its calls to the engine's slots
    return backend


local = BackendFactory(LocalOptions, _local)
"""The deterministic local planner (tests, the demo)."""
openai = BackendFactory(NoOptions, _openai, _upstream)
"""Any OpenAI-compatible server at ``--upstream`` (no generation cuts)."""
engine = BackendFactory(EngineOptions, _engine, _check_engine)
"""A real inference engine at ``--upstream``, spoken to in its dialect, cutting generations at
checkpoints unless ``cuts=false``."""
