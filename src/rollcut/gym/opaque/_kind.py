"""The opaque agent as an agent kind (``rollcut serve agent opaque``): its ``rollcut.agents`` factory,
its sandbox provider by name, and the relay's private socket for its sandboxed programs."""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from ... import _registries
from ..._errors import ConfigError
from ..._process import sweep_dead_dirs
from ..._registry import Registry
from ...bus import EventLog
from ...participants import Participant
from ...sandbox._isolation import Isolation
from .._agents import Make
from .._capability import Capability
from .._client import gym_client
from .._normalise import Normalise
from .._options import AgentServe
from ._launcher import OpaqueAgent, SandboxSnapshot
from ._routes import create_opaque_app

__all__ = ["SANDBOXES", "opaque", "sandbox_of"]

SANDBOXES: Registry[Callable[[str], SandboxSnapshot]] = _registries.SANDBOXES
"""Snapshotters of an opaque agent's sandbox (``--sandbox NAME[:ARG]``; entry point group
``rollcut.sandboxes``): called with ``ARG``. Built in: ``tree``, the agent's working directory
(``--sandbox DIR-TEMPLATE``, short for ``--sandbox tree:DIR-TEMPLATE``)."""


def sandbox_of(opts: AgentServe) -> SandboxSnapshot | None:
    """The sandbox provider ``--sandbox NAME[:ARG]`` names (see :data:`rollcut.gym.SANDBOXES`); a
    value with a ``/`` before any ``:`` is a directory template for the built-in ``tree``."""
    if not opts.sandbox:
        return None
    name, _, arg = opts.sandbox.partition(":")
    if "/" in name:
        name, arg = "tree", opts.sandbox
    return SANDBOXES[name](arg)


def opaque(opts: AgentServe, own_url: str) -> Make:
    """An agent rollcut cannot see inside: its own program per attempt, behind the journaling relay."""
    command = shlex.split(opts.command)
    if not command:
        raise ConfigError("serve agent opaque needs --command: the program that runs one attempt")
    sandbox = sandbox_of(opts)
    if opts.capability == Capability.SANDBOX_SNAPSHOT and sandbox is None:
        raise ConfigError("capability sandbox_snapshot needs a sandbox provider (--sandbox DIR-TEMPLATE)")
    if not opts.run_timeout >= 0:  # NaN too
        raise ConfigError(f"--run-timeout {opts.run_timeout}: seconds, 0 for none")
    isolation = None if opts.unisolated else Isolation.find()  # refused here where bwrap cannot run
    normalise = Normalise(opts.normalise)  # a rule that does not parse stops the server here

    def make(log: EventLog, instance: str, participant: Participant) -> tuple[FastAPI, Any]:
        relay_socket, listener = _relay_socket(instance) if isolation is not None else (None, None)
        agent = OpaqueAgent(
            log,
            instance=instance,
            command=command,
            relay_url=own_url,
            model_url=opts.model,
            resources=opts.resources,
            http=gym_client(600),
            participant=participant,
            capability=Capability(opts.capability),
            on_divergence=opts.on_divergence,
            sandbox=sandbox,
            run_timeout_s=opts.run_timeout or None,
            isolation=isolation,
            relay_socket=relay_socket,
            normalise=normalise,
        )
        app = create_opaque_app(agent, max_body_bytes=opts.max_body_bytes)
        app.state.extra_sockets = [listener] if listener is not None else []
        return app, agent

    return make


def _relay_socket(instance: str) -> tuple[Path, socket.socket]:
    """This worker's relay on a Unix socket, in a directory only its user can enter: what its
    sandboxed programs reach (bind-mounted in), and only they. Removed with the process; the
    directory's name holds the pid, so what a SIGKILLed worker left behind is swept by the next."""
    sweep_dead_dirs("rollcut-relay-")
    where = Path(tempfile.mkdtemp(prefix=f"rollcut-relay-{os.getpid()}-{instance}-"))
    atexit.register(shutil.rmtree, where, True)
    path = where / "relay.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(512)
    return path, listener
