"""Names a package loads on first use (PEP 562): a process imports only what it uses, so a Gym server
does not pay at start for what another role needs (a test deployment starts ten processes)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: dict[str, tuple[str, ...]], namespace: dict[str, Any]
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name of ``homes[module]`` is imported from that
    submodule on first use and kept in ``namespace`` (the package's globals), so it is an ordinary
    attribute afterwards. Written as the ``TYPE_CHECKING`` imports beside it are: by module."""
    home_of = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        home = home_of.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value
        return value

    return __getattr__
