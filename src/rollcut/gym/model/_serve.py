"""Running the model server: one process per worker, one participant per worker.

The parent binds the listening socket once and starts K worker processes that
all accept on it (the kernel spreads connections). Each worker connects to the
bus as the ``model`` role and registers as participant ``<name>-w<i>`` of
group ``<name>`` with ``workers = K``, so a coordinator notices a missing
worker by name. Each process prints ``READY <instance>`` when it serves; the
parent prints ``LISTENING <url>`` first and ``READY <url>`` once every worker
is ready.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from ...bus import BusConfig, EventLog, load_credentials
from ...participants import Participant
from ...tokens import LocalTokenStore
from .._serving import run_servers, serve_on
from ._app import create_app
from ._backend import Backend
from ._local import LocalBackend
from ._openai import OpenAIBackend
from ._service import ModelService

__all__ = ["ModelServeOptions", "run_model_server"]


@dataclass
class ModelServeOptions:
    url: str
    namespace: str
    tokens: Path
    credentials: Path | None = None
    host: str = "127.0.0.1"
    port: int = 0
    name: str = "model"
    workers: int = 1
    seed: int = 0
    token_delay_s: float = 0.0
    tool_turns: int = 3
    backend: str = "local"
    upstream: str = ""

    def argv(self) -> list[str]:
        out = [
            "--url",
            self.url,
            "--namespace",
            self.namespace,
            "--tokens",
            str(self.tokens),
            "--name",
            self.name,
            "--workers",
            str(self.workers),
            "--seed",
            str(self.seed),
            "--token-delay",
            str(self.token_delay_s),
            "--tool-turns",
            str(self.tool_turns),
            "--backend",
            self.backend,
            "--upstream",
            self.upstream,
        ]
        if self.credentials:
            out += ["--credentials", str(self.credentials)]
        return out


async def _serve_worker(opts: ModelServeOptions, sock: socket.socket, worker: int) -> None:
    config = BusConfig(url=opts.url, namespace=opts.namespace)
    if opts.credentials:
        config = config.as_role(load_credentials(opts.credentials), "model")
    instance = f"{opts.name}-w{worker}"
    log = await EventLog.connect(config, name=instance)
    tokens = LocalTokenStore(opts.tokens)
    backend: Backend
    if opts.backend == "openai":
        backend = OpenAIBackend(httpx.AsyncClient(base_url=opts.upstream, timeout=600))
    else:
        backend = LocalBackend(seed=opts.seed, token_delay_s=opts.token_delay_s, tool_turns=opts.tool_turns)
    participant = Participant(
        log,
        component="model",
        instance=instance,
        mode="exported",
        drain=False,
        group=opts.name,
        worker=worker,
        workers=opts.workers,
        process_mode="coordinated_workers" if opts.workers > 1 else "single",
    )
    service = ModelService(log, tokens, backend, instance=instance, participant=participant)
    participant.hooks = service
    await participant.start()
    try:
        await serve_on(create_app(service), sock, instance)
    finally:
        await participant.stop()
        await log.close()
        tokens.close()


def run_model_server(
    opts: ModelServeOptions, *, worker_index: int | None = None, listen_fd: int | None = None
) -> None:
    """Blocking: serve until SIGTERM/SIGINT."""
    run_servers(
        host=opts.host,
        port=opts.port,
        workers=opts.workers,
        child_argv=[sys.executable, "-m", "rollcut._cli", "serve", "model", *opts.argv()],
        serve_one=lambda sock, i: _serve_worker(opts, sock, i),
        worker_index=worker_index,
        listen_fd=listen_fd,
    )
