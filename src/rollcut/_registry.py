"""Registries: one per extension point, names resolved to factories, open to other packages.

An extension point (environments, engine dialects, model backends, agent kinds,
sandbox providers) is a :class:`Registry`: a name maps to a factory, and nothing
else in rollcut decides by ``if name == ...``. A registry's own entries are
written as ``"module:attribute"`` references and imported only when asked for,
so listing what is installed (``rollcut serve … --help``) loads nothing. Another
package adds an entry without editing rollcut, through the registry's entry
point group in its own metadata::

    [project.entry-points."rollcut.environments"]
    my_env = "my_package.envs:MyEnvironment"

(the pattern pytest's plugins and eventsourcing's topics follow). An entry that
fails to import costs only its own name: asking for it is a :class:`ConfigError`
that says why; every other name still resolves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from ._errors import ConfigError

__all__ = ["Registry"]

T = TypeVar("T")


def _resolve(ref: str) -> object:
    module, _, attr = ref.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Names of one extension point -> factories (classes or callables) of type ``T``."""

    def __init__(
        self,
        what: str,
        group: str,
        builtins: dict[str, str] | None = None,
        *,
        admit: Callable[[str, T], None] | None = None,
    ) -> None:
        self.what = what
        """What one entry is, as messages say it (``environment``, ``engine dialect``, …)."""
        self.group = group
        """The entry point group other packages register under."""
        self._refs: dict[str, str] = dict(builtins or {})
        # what every entry must satisfy, checked when it is registered or first resolved (a
        # ConfigError naming it): a newcomer's mistake said at once, not a silent wrong path later
        self._admit = admit
        self._loaded: dict[str, T] = {}
        self._plugins: dict[str, str] | None = None

    def _plugin_refs(self) -> dict[str, str]:
        if self._plugins is None:
            self._plugins = {ep.name: ep.value for ep in entry_points(group=self.group)}
        return self._plugins

    def register(self, name: str, factory: T, *, replace: bool = False) -> None:
        """Add ``name`` in this process (a test, or a program that builds its own server)."""
        if name in self and not replace:
            raise ConfigError(f"{self.what} {name!r} is already registered")
        if self._admit is not None:
            self._admit(name, factory)
        self._loaded[name] = factory

    def unregister(self, name: str) -> None:
        """Take back a name :meth:`register` added in this process."""
        self._loaded.pop(name, None)

    def names(self) -> list[str]:
        """Every name that resolves (or would): rollcut's own first, then installed packages'."""
        seen = dict.fromkeys([*self._refs, *self._loaded, *sorted(self._plugin_refs())])
        return list(seen)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (
            name in self._loaded or name in self._refs or name in self._plugin_refs()
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __getitem__(self, name: str) -> T:
        """The factory registered as ``name``; :class:`ConfigError` naming the choices if none is."""
        if name in self._loaded:
            return self._loaded[name]
        ref = self._refs.get(name) or self._plugin_refs().get(name)
        if ref is None:
            have = ", ".join(self.names()) or "none installed"
            raise ConfigError(f"unknown {self.what} {name!r}; have: {have}")
        try:
            factory: T = _resolve(ref)  # type: ignore[assignment]
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"{self.what} {name!r} ({ref}) does not load: {exc}") from exc
        if self._admit is not None:
            self._admit(name, factory)
        self._loaded[name] = factory
        return factory

    def check(self, name: str) -> None:
        """Refuse a name that does not resolve, naming the choices (before anything is bound)."""
        self[name]
