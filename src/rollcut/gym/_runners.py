"""Running Gym servers: one worker body per server kind, each a checkpoint participant.

The parent binds the listening socket once and starts K worker processes that
all accept on it (the kernel spreads connections). Each worker connects to the
bus with its kind's role and registers as participant ``<group>-w<i>`` of
group ``<group>`` with ``workers = K``, so a coordinator notices a missing
worker by name. Each process prints ``READY <instance> pid=<pid>`` when it
serves; the parent prints ``LISTENING <url>`` first and ``READY <url>`` once
every worker is ready (see :mod:`rollcut.gym._serving`).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import sys
from pathlib import Path
from typing import Any, get_args

import msgspec
from fastapi import FastAPI

from .._errors import ConfigError
from .._process import http_url
from .._tracing import configure
from ..bus import BusConfig, EventLog, PipeRenewal, WorkerIdentities, identity_from_pipe, load_credentials
from ..participants import CheckpointMode, Participant
from ..tokens import LocalTokenStore
from ._agents import AGENTS, Make
from ._capability import Capability, DivergencePolicy
from ._client import gym_client
from ._environment import create_environment_app
from ._options import (
    AgentServe,
    EnvironmentServe,
    ModelServe,
    ResourcesServe,
    ServeSpec,
    decode_spec,
    encode_spec,
)
from ._peers import Peers
from ._serving import run_servers, run_worker, serve_on, worker_parser
from .resources import ENVIRONMENTS, Environment, ResourcesService, create_resources_app

__all__ = ["Make", "serve", "serve_participant", "serve_worker", "worker_identities"]


async def _log(opts: ServeSpec, role: str, instance: str) -> EventLog:
    config = BusConfig(url=opts.url, namespace=opts.namespace, replicas=opts.replicas)
    renewals: PipeRenewal | None = None
    if opts.credentials:  # a role's file, or fd:N: the worker's own identity, from its parent's pipe
        given = opts.credentials
        if given.startswith("fd:"):
            creds, renewals = identity_from_pipe(int(given[3:]))
        else:
            creds = load_credentials(Path(given))
        config = config.as_role(creds, role, instance)
    return await EventLog.connect(config, name=instance, renewals=renewals)


async def serve_participant(
    opts: ServeSpec,
    sock: socket.socket,
    worker: int,
    mode: CheckpointMode,
    make: Make,
    *,
    peers: Peers | None = None,
    drain: bool = False,
) -> None:
    """Serve one worker: connect as the kind's role, register the participant, serve its app (on the
    port and, with peers, on its private socket, routing each rollout to its owner)."""
    instance = f"{opts.group}-w{worker}"
    log = await _log(opts, opts.kind, instance)
    participant = Participant(
        log,
        component=opts.kind,
        instance=instance,
        mode=mode,
        drain=drain,
        group=opts.group,
        worker=worker,
        workers=opts.workers,
        process_mode="coordinated_workers" if opts.workers > 1 else "single",
    )
    app, hooks = make(log, instance, participant)
    app.state.peers = peers
    app.state.bus_lost = lambda: log.lost_why  # /healthz says so
    app.state.identity_renewals = lambda: log.identity_renewals  # /rollcut/stats says so
    if hooks is not None:
        participant.hooks = hooks
    await participant.start()
    try:
        extra: list[socket.socket] = getattr(app.state, "extra_sockets", [])  # an opaque agent's relay
        listeners = [sock, peers.listener] if peers and peers.listener else [sock]
        lost = asyncio.ensure_future(log.wait_lost())
        await serve_on(app, [*listeners, *extra], instance, lost)
    finally:
        await participant.stop()
        if peers is not None:
            await peers.aclose()
        await log.close()


def served_names(opts: ModelServe) -> list[str]:
    """The model names a model server answers as (the first for a request naming none)."""
    from .model import DEFAULT_MODEL

    return opts.served_model_name or [DEFAULT_MODEL]


def model_app(opts: ModelServe, service: Any) -> FastAPI:
    """The model server's app around ``service``: rollcut's, and the plain bench stack's (its
    service without custody), assembled the same way."""
    from .model import create_app

    return create_app(
        service,
        return_token_ids=opts.return_token_ids,
        served_model_names=served_names(opts),
        max_body_bytes=opts.max_body_bytes,
    )


def environment_of(opts: ResourcesServe) -> Environment:
    """The resources server's environment, opened (a sandbox that cannot isolate its commands
    refuses here)."""
    env = ENVIRONMENTS[opts.env].of(opts)
    env.open(unisolated=opts.unisolated)
    return env


async def _serve_model(opts: ModelServe, sock: socket.socket, worker: int, peers: Peers | None) -> None:
    # imported here: only a model server pays for OpenAI's types (see the package's docstring)
    from .model import BACKENDS, ModelService, PolicyClock

    backend = BACKENDS[opts.backend](opts)
    tokens = LocalTokenStore(opts.tokens)
    policy = PolicyClock(opts.policy_version, opts.policy_version_file or None, opts.max_policy_lag)

    def make(log: EventLog, instance: str, participant: Participant) -> tuple[FastAPI, Any]:
        service = ModelService(
            log,
            tokens,
            backend,
            instance=instance,
            participant=participant,
            policy=policy,
            model_name=served_names(opts)[0],
        )
        return model_app(opts, service), service

    try:
        await serve_participant(opts, sock, worker, "exported", make, peers=peers)
    finally:
        tokens.close()


async def _serve_resources(
    opts: ResourcesServe, sock: socket.socket, worker: int, peers: Peers | None
) -> None:
    env = environment_of(opts)
    exported = env.mode == "exported" or env.verification == "wait"

    services: list[ResourcesService] = []

    def make(log: EventLog, instance: str, participant: Participant) -> tuple[FastAPI, Any]:
        owns = peers.owns if peers is not None else None
        service = ResourcesService(log, env, instance=instance, participant=participant, owns=owns)
        services.append(service)
        return create_resources_app(service, max_body_bytes=opts.max_body_bytes), service

    try:
        await serve_participant(opts, sock, worker, "exported" if exported else env.mode, make, peers=peers)
    finally:  # a clean stop leaves no session behind (a sandbox's directories: issue 49)
        for service in services:
            service.close_all()


def _own_url(opts: ServeSpec, sock: socket.socket) -> str:
    """This server's own base URL, as a process it starts on this host reaches it."""
    host = "127.0.0.1" if opts.host in ("0.0.0.0", "", "::") else opts.host
    return http_url(host, sock.getsockname()[1])


async def _serve_agent(opts: AgentServe, sock: socket.socket, worker: int, peers: Peers | None) -> None:
    make = AGENTS[opts.agent](opts, _own_url(opts, sock))
    await serve_participant(opts, sock, worker, "exported", make, peers=peers)


async def _serve_environment(
    opts: EnvironmentServe, sock: socket.socket, worker: int, peers: Peers | None
) -> None:
    def make(log: EventLog, instance: str, participant: Participant) -> tuple[FastAPI, Any]:
        app = create_environment_app(
            log,
            instance=instance,
            agent_url=opts.agent,
            http=gym_client(3600),
            max_body_bytes=opts.max_body_bytes,
        )
        return app, None

    await serve_participant(opts, sock, worker, "event_sourced", make, peers=peers)


async def serve_worker(opts: ServeSpec, sock: socket.socket, worker: int, peers: Peers | None = None) -> None:
    """The body of one worker process of the server ``opts`` describes."""
    configure(f"rollcut-{opts.kind}", f"{opts.group}-w{worker}")  # spans exported if OTEL_* asks
    if isinstance(opts, ModelServe):
        await _serve_model(opts, sock, worker, peers)
    elif isinstance(opts, ResourcesServe):
        await _serve_resources(opts, sock, worker, peers)
    elif isinstance(opts, AgentServe):
        await _serve_agent(opts, sock, worker, peers)
    else:
        await _serve_environment(opts, sock, worker, peers)


def check(opts: ServeSpec) -> None:
    """Refuse options that cannot run, before anything is bound: every name resolves in its
    registry, and the factory it names accepts the options."""
    if not opts.url:
        raise ConfigError(f"serve {opts.kind} needs the bus: --url or ROLLCUT_URL (see `rollcut nats`)")
    if isinstance(opts, ModelServe):
        from .model import BACKENDS, BackendFactory

        factory = BACKENDS[opts.backend]
        if isinstance(factory, BackendFactory):  # it brings its options: they are read now
            factory.check(opts)
    if isinstance(opts, ResourcesServe):
        ENVIRONMENTS.check(opts.env)
    if isinstance(opts, AgentServe):
        _check_agent(opts)


def _check_agent(opts: AgentServe) -> None:
    if opts.capability not in set(Capability):
        raise ConfigError(f"unknown capability {opts.capability!r}; have: {', '.join(Capability)}")
    if opts.on_divergence not in get_args(DivergencePolicy):
        raise ConfigError(f"--on-divergence {opts.on_divergence!r}: use fresh_dispatch or go_live")
    AGENTS[opts.agent](opts, "http://127.0.0.1:0")  # a factory refuses what it cannot run


def serve(opts: ServeSpec) -> None:
    """Blocking: serve until SIGTERM/SIGINT, in this process or in ``opts.workers`` children."""
    check(opts)
    run_servers(
        host=opts.host,
        port=opts.port,
        workers=opts.workers,
        child_argv=[sys.executable, "-m", "rollcut.gym", "--spec", encode_spec(opts)],
        serve_one=functools.partial(serve_worker, opts),
        identities=worker_identities(opts),
        fd=opts.fd,
    )


def worker_main(argv: list[str] | None = None) -> None:
    """Blocking: one worker of a server with several, as its supervisor starts it
    (``python -m rollcut.gym --spec JSON --worker-index …``, :func:`worker_parser`). The worker logs
    in as itself (``--identity``), never with its role's key."""
    args = worker_parser("python -m rollcut.gym").parse_args(argv)
    opts = decode_spec(args.spec)
    if args.identity:
        opts = msgspec.structs.replace(opts, credentials=args.identity)
    run_worker(functools.partial(serve_worker, opts), args, opts.workers)


def worker_identities(opts: ServeSpec) -> WorkerIdentities | None:
    """The workers' own bus identities, made from the role's key by their parent and handed to each
    through a pipe (``run_servers``), never a file, with their renewals after them. A worker holds
    no key that makes another identity (it cannot act as a sibling), and a restarted worker gets a
    new one (the identity authority revokes the old). None: credentials of schema 1/2, one identity
    per role."""
    if not opts.credentials:
        return None
    creds = load_credentials(Path(opts.credentials))
    if not creds.signing:
        return None
    if opts.kind not in creds.signing:
        raise ConfigError(f"no signing key for role {opts.kind!r}; roles here: {', '.join(creds.signing)}")

    def issue(worker: int) -> tuple[bytes, str]:
        made = creds.issue(opts.kind, f"{opts.group}-w{worker}")
        assert made.identity is not None
        return msgspec.json.encode(made), made.identity.jwt

    return WorkerIdentities(issue, creds.signing[opts.kind])
