"""The ``rollcut`` command line: one module per command group on one root app.

Shared options and how a command opens the bus, the ledger and the token store live in
``_target``; each command group registers itself on the root app when its module is imported.
``app`` is the whole tree (every group imported on first use). ``main`` imports only the module of
the command it runs (the whole tree for ``--help`` or a name it does not know): ``rollcut serve``
runs for every Gym server and again after every crash, and typer's parameters for the rest of the
tree (every bench, the demo, the store) were a tenth to a fifth of a server's start
(``docs/performance.md``, stop 70).
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from ._target import Target

if _typing.TYPE_CHECKING:
    import typer

__all__ = ["Target", "app", "main"]

_COMMANDS = {
    "_bench": ("bench",),
    "_bench_e2e": ("bench",),
    "_checkpoints": ("checkpoint", "checkpoints", "compact", "restore", "resume"),
    "_collect": ("collect", "export"),
    "_demo": ("demo",),
    "_engine": ("engine",),
    "_nemo": ("nemo-gym",),
    "_report": ("report",),
    "_serve": ("serve",),
    "_store": ("cluster-config", "ledger", "nats", "replay", "retire"),
    "_top": ("top",),
}
"""Every module that registers on the root app, and the top-level commands and groups it registers
(a test checks this against the registrations)."""


def _load(*modules: str) -> typer.Typer:
    from ._target import app

    for module in modules:
        _importlib.import_module(f"{__name__}.{module}")
    return app


def __getattr__(name: str) -> typer.Typer:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()["app"] = whole = _load(*_COMMANDS)
    return whole


def main() -> None:
    """The ``rollcut`` console script: an error no command caught still exits by the table (74 for
    an unwritable path or a full disk, 2 for a rollcut error, 70 with a traceback for a bug)."""
    import sys

    from ._target import exit_for

    first = sys.argv[1] if len(sys.argv) > 1 else ""
    named = [module for module, commands in _COMMANDS.items() if first in commands]
    try:
        _load(*(named or _COMMANDS))()
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        sys.exit(exit_for(exc))
