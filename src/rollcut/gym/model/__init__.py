"""The policy model participant: an OpenAI-compatible server with durable call custody."""

from collections.abc import Callable as _Callable

from ... import _registries
from ..._registry import Registry as _Registry
from .._options import ModelServe as _ModelServe
from .._pace import GEMMA_ON_TWO_CORES, Pace, PaceProfile, TokenTally
from ._backend import Backend, OnToken, Plan
from ._backends import BackendFactory, EngineOptions, LocalOptions
from ._bytes import decode, encode
from ._local import LocalBackend
from ._openai import OpenAIBackend, UpstreamError
from ._policy import PolicyClock
from ._routes import create_app
from ._service import DEFAULT_MODEL, CallResult, ModelService

BACKENDS: _Registry[_Callable[[_ModelServe], Backend]] = _registries.BACKENDS
"""The model server's generation backends, by the name ``--backend`` takes (entry point group
``rollcut.backends``)."""

__all__ = [
    "BACKENDS",
    "DEFAULT_MODEL",
    "GEMMA_ON_TWO_CORES",
    "Backend",
    "BackendFactory",
    "CallResult",
    "EngineOptions",
    "LocalBackend",
    "LocalOptions",
    "ModelService",
    "OnToken",
    "OpenAIBackend",
    "Pace",
    "PaceProfile",
    "Plan",
    "PolicyClock",
    "TokenTally",
    "UpstreamError",
    "create_app",
    "decode",
    "encode",
]
