"""Agents: the Simple Agent's /run loop with boundaries, parking and continuation."""

from .._attempts import FreshDispatchNeeded
from ._routes import create_agent_app
from ._simple import SimpleAgent

__all__ = ["FreshDispatchNeeded", "SimpleAgent", "create_agent_app"]
