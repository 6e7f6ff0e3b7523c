"""The policy model participant: an OpenAI-compatible server with durable call custody."""

from ._app import create_app
from ._local import LocalBackend, Plan, decode, encode
from ._service import CallError, CallResult, Identity, ModelService

__all__ = [
    "CallError",
    "CallResult",
    "Identity",
    "LocalBackend",
    "ModelService",
    "Plan",
    "create_app",
    "decode",
    "encode",
]
