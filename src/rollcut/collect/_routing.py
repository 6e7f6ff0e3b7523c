"""Which agent a row goes to, and how many rollouts it makes: NeMo Gym's ``agent_ref`` routing and
per-agent ``num_repeats`` (``nemo_gym/rollout_collection.py``, read 2026-12-03 at NVIDIA-NeMo/Gym
07d6b0d).

- ``agents`` maps an ``agent_ref.name`` to the environment server that runs that agent (each of
  rollcut's environment servers fronts one agent); a row naming no agent, or one not in the map,
  goes to ``environment_url``, the collection's default.
- ``num_repeats`` is an int for every row, or a mapping by ``agent_ref.name`` with ``_default`` as
  the fallback; a row whose agent has no entry and no fallback is refused when the rows are read
  (NeMo Gym refuses the same rows; it names them all, rollcut the first, with its line).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError

__all__ = ["DEFAULT_KEY", "Routing", "agent_name"]

DEFAULT_KEY = "_default"
"""The key of a per-agent ``num_repeats`` that applies to every agent it does not name."""


def agent_name(row: Mapping[str, Any]) -> str | None:
    """The name in a row's ``agent_ref`` (NeMo Gym's ``{"type": ..., "name": ...}``), if any."""
    ref = row.get("agent_ref")
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) else None


@dataclass(frozen=True)
class Routing:
    """Where each row's rollouts run and how many there are."""

    environment_url: str
    num_repeats: int | Mapping[str, int] = 1
    agents: Mapping[str, str] = field(default_factory=dict)

    def repeats(self, row: Mapping[str, Any]) -> int:
        """How many rollouts ``row`` makes."""
        if isinstance(self.num_repeats, int):
            return self.num_repeats
        name = agent_name(row)
        if name is not None and name in self.num_repeats:
            return self.num_repeats[name]
        if DEFAULT_KEY in self.num_repeats:
            return self.num_repeats[DEFAULT_KEY]
        listed = ", ".join(sorted(k for k in self.num_repeats if k != DEFAULT_KEY)) or "none"
        raise ConfigError(
            f"num_repeats has no entry for agent {name!r} and no {DEFAULT_KEY!r} fallback (listed: {listed})"
        )

    def url(self, row: Mapping[str, Any]) -> str:
        """The environment server whose ``/run`` takes this row's rollouts."""
        name = agent_name(row)
        return (self.agents.get(name) if name is not None else None) or self.environment_url

    def urls(self) -> list[str]:
        """Every environment server the collection posts to."""
        return list(dict.fromkeys([self.environment_url, *self.agents.values()]))
