"""``bench e2e --way plain``: the demo's servers and collection with custody taken out.

What rollcut's collection costs is measured against the same work done the way
a framework without partial-rollout checkpointing does it: the same server
processes (model, one resources server per environment, the agent with its two
workers), the same FastAPI apps, routes, uvicorn and response shapes, the same
backend, environments and agent loop, the same tasks and the same concurrency,
and nothing else:

- no bus and no checkpoints: no event is appended, no participant registers,
  nothing parks;
- the model service only generates (:class:`PlainModelService`): no token store;
- a resources session lives in memory (:class:`PlainResourcesService`): no seeded,
  mutated or retired event, no exported state;
- the agent runs its loop (:class:`PlainAgent`): no attempt claimed, no boundary;
- the collection posts each row's ``/run`` to the agent (NeMo Gym's rollout
  collection does; there is no environment server recording completions) and
  writes the answers as rows, one JSON line each, as rollcut's collection does.

Each server runs as ``python -m rollcut.bench._plain_serve KIND [ENV] --spec JSON``
(the options rollcut's ``serve`` would get, as one JSON struct), several workers
sharing its port as rollcut's do (:func:`rollcut.gym.run_servers`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
from fastapi import FastAPI

from .._errors import ConfigError, RollcutError
from .._files import private_dir
from ..bus import AgentBoundaryRecord, EventLog
from ..collect import Rows
from ..gym import (
    AgentServe,
    ModelServe,
    ResourcesServe,
    ServeSpec,
    encode_spec,
    environment_of,
    model_app,
    serve_on,
    served_names,
)
from ..gym.agent import SimpleAgent, create_agent_app
from ..gym.resources import Environment, ResourcesService, ToolResult, create_resources_app
from ..gym.wire import Identity, identity_headers
from ..testing import ServerProcess
from ._plain_model import PlainModelService

__all__ = ["PlainAgent", "PlainResourcesService", "PlainRun", "collect_plain", "plain_server", "serve_plain"]


class PlainResourcesService(ResourcesService):
    """Tool sessions in memory and nothing on a log: the resources server without custody."""

    def __init__(self, env: Environment, *, instance: str) -> None:
        super().__init__(cast(EventLog, None), env, instance=instance)

    async def _append(self, event: Any) -> int:
        return 0

    async def _logged_state(self, state: Any) -> bytes | None:
        return None

    async def _record_mutation(
        self, ident: Identity, rev: int, name: str, args: dict[str, Any], out: ToolResult, draft: Any
    ) -> None:
        return None

    async def _restored(self, ident: Identity) -> None:
        return None  # nothing continues: every attempt starts from its input


class PlainAgent(SimpleAgent):
    """The Simple Agent's loop alone: no attempt claimed, every one from its input, no boundary."""

    def __init__(self, *, instance: str, model_url: str, resources: dict[str, str]) -> None:
        super().__init__(cast(EventLog, None), instance=instance, model_url=model_url, resources=resources)

    async def _claim(self, ident: Identity) -> None:
        return None

    async def _start_of(self, ident: Identity) -> AgentBoundaryRecord | None:
        return None

    async def boundary(self, run: Any, record: AgentBoundaryRecord) -> None:
        return None  # nothing recorded, nothing to park for


def _app(opts: ServeSpec, instance: str) -> FastAPI:
    """One worker's app: rollcut's app for ``opts`` around the service without custody."""
    if isinstance(opts, ModelServe):
        from ..gym.model import BACKENDS

        plain = PlainModelService(BACKENDS[opts.backend](opts), model_name=served_names(opts)[0])
        return model_app(opts, plain)
    if isinstance(opts, ResourcesServe):
        service = PlainResourcesService(environment_of(opts), instance=instance)
        return create_resources_app(service, max_body_bytes=opts.max_body_bytes)
    if isinstance(opts, AgentServe) and opts.agent == "simple":
        agent = PlainAgent(instance=instance, model_url=opts.model, resources=opts.resources)
        return create_agent_app(agent, max_body_bytes=opts.max_body_bytes)
    raise ConfigError(
        f"the plain stack runs a model, resources servers and the Simple Agent, not {opts.kind}"
    )


async def serve_plain(opts: ServeSpec, sock: socket.socket, worker: int, peers: Any) -> None:
    """One worker of the server ``opts`` describes, without custody."""
    instance = f"{opts.group}-w{worker}"
    app = _app(opts, instance)
    app.state.peers = peers  # a rollout's requests reach the worker holding its session, as in rollcut
    listeners = [sock, peers.listener] if peers is not None and peers.listener else [sock]
    try:
        await serve_on(app, listeners, instance)
    finally:
        if peers is not None:
            await peers.aclose()


def plain_server(opts: ServeSpec, logs: Path | None = None) -> ServerProcess:
    """The process serving ``opts`` without custody (a :func:`rollcut.testing.start_stack` launcher)."""
    named = [opts.kind, *([opts.env] if isinstance(opts, ResourcesServe) else [])]
    command = [sys.executable, "-m", "rollcut.bench._plain_serve"]
    return ServerProcess(
        [*named, "--spec", encode_spec(opts)], workers=opts.workers, logs=logs, command=command
    )


@dataclass(frozen=True)
class PlainRun:
    """What a plain collection did: rows written, and the seconds from its first ``/run`` to its last row."""

    written: int
    collect_s: float

    @property
    def rows_per_s(self) -> float:
        return self.written / self.collect_s if self.collect_s > 0 else 0.0


class PlainCollectionError(RollcutError):
    """A rollout of the plain collection failed: its throughput would not compare like with like."""

    def __init__(self, rollout_id: str, status: int, body: str) -> None:
        super().__init__(f"plain /run of {rollout_id} answered {status}: {body[:300]}")
        self.rollout_id, self.status = rollout_id, status


async def collect_plain(
    agent_url: str, tasks: Iterable[dict[str, Any]], *, concurrency: int, output: Path
) -> PlainRun:
    """Post every task's ``/run`` to the agent, ``concurrency`` at a time, and write each answer as a
    row (the same rollout ids, ``/run`` bodies and rows as rollcut's collection). A failed rollout
    stops it with :class:`PlainCollectionError`: the baseline does the whole workload or nothing."""
    private_dir(output.parent)
    rows = Rows(tasks, 1, output)
    todo = iter(list(rows.inputs))
    written = 0
    try:
        with output.open("w") as out:
            async with httpx.AsyncClient(
                timeout=600, limits=httpx.Limits(max_connections=concurrency)
            ) as http:

                async def worker() -> None:
                    nonlocal written
                    for rid in todo:  # one shared iterator: each rollout is taken once
                        ident = Identity(rid, 1)
                        resp = await http.post(
                            f"{agent_url}/run", json=rows.run_body(rid, 1), headers=identity_headers(ident)
                        )
                        if resp.status_code != 200:
                            raise PlainCollectionError(rid, resp.status_code, resp.text)
                        out.write(json.dumps(rows.result_row(rid, 1, resp.json())) + "\n")
                        written += 1

                t0 = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(concurrency)))
                out.flush()
                collect_s = time.perf_counter() - t0
    finally:
        rows.close()
    return PlainRun(written, round(collect_s, 3))
