"""The ``rollcut`` command line: one module per command group on one root app.

Shared options and how a command opens the bus, the ledger and the token
store live in ``_app``; each command group registers itself on import.
"""

from . import _bench, _bench_e2e, _checkpoints, _collect, _demo, _engine, _nemo, _report, _serve, _store, _top  # noqa: F401
from ._target import Target, app

__all__ = ["Target", "app", "main"]


def main() -> None:
    """The ``rollcut`` console script: an error no command caught still exits by the table (74 for
    an unwritable path or a full disk, 2 for a rollcut error, 70 with a traceback for a bug)."""
    import sys

    from ._target import exit_for

    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        sys.exit(exit_for(exc))
