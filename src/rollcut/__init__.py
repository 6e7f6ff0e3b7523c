"""rollcut: crash-safe partial-rollout checkpointing on NATS JetStream and LMDB.

The root exports the one exception tree (``_errors``, whole) and the version;
everything else lives in the subpackages.
"""

from . import _errors
from ._errors import *  # noqa: F403  (the exception tree, whole)
from ._version import __version__

__all__ = [*_errors.__all__, "__version__"]
