"""The policy model participant: an OpenAI-compatible server with durable call custody."""

from ._app import create_app
from ._backend import Backend, Plan
from ._local import LocalBackend, decode, encode
from ._openai import OpenAIBackend, UpstreamError
from ._service import CallResult, ModelService

__all__ = [
    "Backend",
    "CallResult",
    "LocalBackend",
    "ModelService",
    "OpenAIBackend",
    "Plan",
    "UpstreamError",
    "create_app",
    "decode",
    "encode",
]
