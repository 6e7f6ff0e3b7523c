"""Names a package loads on first use (PEP 562): a process imports only what it uses, so a Gym server
does not pay at start for what another role needs (a test deployment starts ten processes)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, homes: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` is imported from its submodule
    ``homes[name]`` on first use and kept in ``namespace`` (the package's globals), so it is an
    ordinary attribute afterwards."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    return __getattr__
