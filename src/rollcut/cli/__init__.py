"""The ``rollcut`` command line: one module per command group on one root app.

Shared options and how a command opens the bus, the ledger and the token
store live in ``_app``; each command group registers itself on import.
"""

from . import _bench, _checkpoints, _collect, _demo, _engine, _report, _serve, _store  # noqa: F401  (registers the commands)
from ._target import Target, app

__all__ = ["Target", "app", "main"]


def main() -> None:
    """The ``rollcut`` console script."""
    app()
