"""Worker bodies for ``rollcut serve resources|agent|environment``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..bus import BusConfig, EventLog, load_credentials
from ..participants import Participant
from ._environment import create_environment_app
from ._serving import serve_on
from .agent import SimpleAgent, create_agent_app
from .resources import ENVIRONMENTS, ResourcesService, create_resources_app

__all__ = ["ServeOptions", "serve_agent", "serve_environment", "serve_resources"]


@dataclass
class ServeOptions:
    url: str
    namespace: str = "default"
    credentials: Path | None = None
    name: str = ""
    workers: int = 1
    model: str = ""
    resources: dict[str, str] = field(default_factory=dict)
    agent: str = ""


async def _log(opts: ServeOptions, role: str, instance: str) -> EventLog:
    config = BusConfig(url=opts.url, namespace=opts.namespace)
    if opts.credentials:
        config = config.as_role(load_credentials(opts.credentials), role)
    return await EventLog.connect(config, name=instance)


def _nodelay_client(timeout: float) -> httpx.AsyncClient:
    import socket

    transport = httpx.AsyncHTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
    return httpx.AsyncClient(timeout=timeout, transport=transport, limits=httpx.Limits(max_connections=1000))


async def _run(
    opts: ServeOptions, sock: Any, worker: int, component: str, mode: str, drain: bool, make: Any
) -> None:
    instance = f"{opts.name}-w{worker}"
    log = await _log(opts, component, instance)
    participant = Participant(
        log,
        component=component,
        instance=instance,
        mode=mode,
        drain=drain,  # type: ignore[arg-type]
        group=opts.name,
        worker=worker,
        workers=opts.workers,
        process_mode="coordinated_workers" if opts.workers > 1 else "single",
    )
    app, hooks = make(log, instance, participant)
    if hooks is not None:
        participant.hooks = hooks
    await participant.start()
    try:
        await serve_on(app, sock, instance)
    finally:
        await participant.stop()
        await log.close()


async def serve_resources(opts: ServeOptions, sock: Any, worker: int) -> None:
    env = ENVIRONMENTS[opts.name]()
    exported = env.mode == "exported" or env.verification == "wait"

    def make(log: EventLog, instance: str, participant: Participant) -> Any:
        service = ResourcesService(log, env, instance=instance, participant=participant)
        return create_resources_app(service), service

    await _run(opts, sock, worker, "resources", "exported" if exported else env.mode, False, make)


async def serve_agent(opts: ServeOptions, sock: Any, worker: int) -> None:
    def make(log: EventLog, instance: str, participant: Participant) -> Any:
        agent = SimpleAgent(
            log,
            instance=instance,
            model_url=opts.model,
            resources=opts.resources,
            participant=participant,
            http=_nodelay_client(600),
        )
        return create_agent_app(agent), agent

    await _run(opts, sock, worker, "agent", "exported", False, make)


async def serve_environment(opts: ServeOptions, sock: Any, worker: int) -> None:
    def make(log: EventLog, instance: str, participant: Participant) -> Any:
        return create_environment_app(
            log, instance=instance, agent_url=opts.agent, http=_nodelay_client(3600)
        ), None

    await _run(opts, sock, worker, "environment", "event_sourced", False, make)
