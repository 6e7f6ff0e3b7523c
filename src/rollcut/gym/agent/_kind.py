"""The Simple Agent as an agent kind (``rollcut serve agent simple``): its ``rollcut.agents`` factory."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from ..._errors import ConfigError
from ...bus import EventLog
from ...participants import Participant
from .._agents import Make
from .._client import gym_client
from .._options import AgentServe
from ._routes import create_agent_app
from ._simple import SimpleAgent

__all__ = ["simple"]


def simple(opts: AgentServe, own_url: str) -> Make:
    """The Simple Agent: its loop on rollcut's task rows or NeMo Gym's Responses rows."""
    if opts.normalise:
        raise ConfigError(
            "--normalise is an opaque agent's (its relay compares requests); the Simple Agent has none"
        )

    def make(log: EventLog, instance: str, participant: Participant) -> tuple[FastAPI, Any]:
        agent = SimpleAgent(
            log,
            instance=instance,
            model_url=opts.model,
            resources=opts.resources,
            participant=participant,
            http=gym_client(600),
        )
        return create_agent_app(agent, max_body_bytes=opts.max_body_bytes), agent

    return make
