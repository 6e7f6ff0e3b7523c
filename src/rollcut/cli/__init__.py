"""The ``rollcut`` command line: one module per command group on one root app.

Shared options and how a command opens the bus, the ledger and the token store live in
``_target``; each command group registers itself on the root app when its module is imported.
``app`` is the whole tree (every group imported on first use). ``main`` imports only the group it
runs when it is one a deployment starts many times: ``rollcut serve`` runs for every Gym server and
again after every crash, and typer's parameters for the rest of the tree (every bench, the demo, the
store) were a tenth to a fifth of a server's start (``docs/performance.md``, stop 70).
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from ._target import Target

if _typing.TYPE_CHECKING:
    import typer

__all__ = ["Target", "app", "main"]

_GROUPS = (
    "_bench",
    "_bench_e2e",
    "_checkpoints",
    "_collect",
    "_demo",
    "_engine",
    "_nemo",
    "_report",
    "_serve",
    "_store",
    "_top",
)
"""Every module that registers commands on the root app."""

_ALONE = {"serve": "_serve", "collect": "_collect"}
"""A first argument whose command ``main`` loads by itself, and the module that registers it (a
collection job starts ``rollcut collect`` once, a test deployment dozens of times)."""


def _load(*modules: str) -> typer.Typer:
    from ._target import app

    for module in modules:
        _importlib.import_module(f"{__name__}.{module}")
    return app


def __getattr__(name: str) -> typer.Typer:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()["app"] = whole = _load(*_GROUPS)
    return whole


def main() -> None:
    """The ``rollcut`` console script: an error no command caught still exits by the table (74 for
    an unwritable path or a full disk, 2 for a rollcut error, 70 with a traceback for a bug)."""
    import sys

    from ._target import exit_for

    first = sys.argv[1] if len(sys.argv) > 1 else ""
    try:
        root = _load(_ALONE[first]) if first in _ALONE else _load(*_GROUPS)
        root()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        sys.exit(exit_for(exc))
