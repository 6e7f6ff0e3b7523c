"""The registry of agent kinds, typed; the kinds live with what only they use
(``gym/agent/_kind.py``: the Simple Agent; ``gym/opaque/_kind.py``: the opaque agent, and its
registry of sandbox providers).

Each kind's factory takes the agent server's options and its own base URL (where a program it
starts reaches it) and returns a :data:`Make`: what builds one worker's app and its participant
hooks. ``rollcut serve agent NAME`` resolves ``NAME`` in :data:`rollcut.gym.AGENTS`; another
package adds a kind through the same entry point group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from .. import _registries
from .._registry import Registry
from ..bus import EventLog
from ..participants import Participant
from ._options import AgentServe

__all__ = ["AGENTS", "Make"]

Make = Callable[[EventLog, str, Participant], tuple[FastAPI, Any]]
"""Builds a worker's app and its participant hooks (or None) from its log, instance and participant."""

AGENTS: Registry[Callable[[AgentServe, str], Make]] = _registries.AGENTS
"""Agent kinds (``rollcut serve agent NAME``; entry point group ``rollcut.agents``): called with the
server's options and its own base URL."""
