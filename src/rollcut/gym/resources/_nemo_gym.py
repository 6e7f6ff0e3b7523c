"""NeMo Gym's own resources servers under rollcut: what level each runs at, and the server run as a child.

The level of a server is declared, never guessed (docs/nemo-gym.md, "NeMo Gym's servers under
rollcut"): ``stateless`` (its tools are functions of their arguments and its verify reads only
the row: a continued session is seeded afresh), ``replayable`` (its answers are a function of its
seed and the calls it was given: a continued session is rebuilt by giving a fresh one the
journaled calls, each answer compared), ``restart_only`` (the default: the rollout starts over
from its input). rollcut declares only servers it has checked, each with its reason;
``--replayable`` declares one for a run.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
from pathlib import Path
from typing import Any

from ..._cache import ChildServer
from ..._errors import ConfigError
from ..._process import free_port
from ...participants import CheckpointMode
from .._normalise import Normalise
from ._nemo_install import NemoGymUnavailableError, env_python, site_packages
from ._upstream import UpstreamEnvironment

__all__ = ["DECLARED", "DEFAULT", "NemoGym", "NemoGymServer", "example_rows"]

DECLARED: dict[str, tuple[str, str]] = {
    "example_session_state_mgmt": (
        "replayable",
        "a count per session: every answer is a function of initial_count and the increments given "
        "(checked: tests/gym/test_nemo_upstream.py rebuilds a session by replay)",
    ),
    "example_multi_step": (
        "stateless",
        "its tools are functions of their arguments (a synonym's letters) and verify reads only the "
        "row's last extract_synonym_values call",
    ),
    "mcqa": (
        "stateless",
        "no tools and no session: verify reads the row's options and expected answer and the "
        "response's last message",
    ),
    "blackjack": (
        "restart_only",
        "deals from an unseeded random.Random(): a replayed /reset deals other cards (checked: "
        "declared replayable in a test, the divergence is found at the first answer)",
    ),
}
"""The servers rollcut has checked, by name: their level and why."""

_MODES: dict[str, CheckpointMode] = {
    "replayable": "event_sourced",
    "stateless": "stateless",
    "restart_only": "restart_only",
}
DEFAULT = ("restart_only", "not checked by rollcut: a crash restarts its rollouts from their input")


class NemoGymServer(ChildServer):
    """One NeMo Gym server from the installed wheel, a child process on a free port: a resources
    server, or (``kind="responses_api_agents"``) an agent whose resources and model servers are
    rollcut's (``peers``: ``{"resources": {"name": NAME, "url": URL}, "model": URL}``)."""

    unavailable = NemoGymUnavailableError

    def __init__(
        self,
        name: str,
        *,
        log: Path | None = None,
        kind: str = "resources_servers",
        peers: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(log=log)
        self.name, self.kind, self.peers = name, kind, peers or {}
        self.what = f"NeMo Gym's {name}"  # type: ignore[misc]

    def start(self, *, timeout_s: float = 120.0) -> NemoGymServer:
        """Start it (on its port again after a kill) and wait until it answers ``/health``."""
        self.port = self.port or free_port()
        script = Path(__file__).with_name("nemo_gym_child.py")
        argv = [str(env_python()), str(script), self.kind, self.name, str(self.port)]
        self._spawn(argv, {**os.environ, "ROLLCUT_NEMO_GYM_PEERS": json.dumps(self.peers)}, timeout_s)
        return self


class NemoGym(UpstreamEnvironment):
    """``rollcut serve resources nemo-gym NAME``: NeMo Gym's server NAME behind rollcut's journal."""

    name = "nemo-gym"

    @classmethod
    def of(cls, opts: Any) -> NemoGym:
        server: str = opts.server
        if not server:
            raise ConfigError("nemo-gym needs the server's name: rollcut serve resources nemo-gym NAME")
        level = "replayable" if opts.replayable else DECLARED.get(server, DEFAULT)[0]
        url, child = opts.upstream, None
        if not url:
            child = NemoGymServer(server)  # its log unnamed: nothing of it outlives this process
            atexit.register(child.kill)  # and its lifeline, should this process be killed
            url = child.start().url
        normalise = Normalise(opts.normalise)  # a rule that does not parse stops the server here
        env = cls(server, url, level=_MODES[level], timeout_s=opts.upstream_timeout, normalise=normalise)
        env.child = child
        env.discover()
        return env

    child: NemoGymServer | None = None
    _restarting: asyncio.Lock | None = None

    async def ready(self) -> None:
        """The server this environment started, started again on its port if it died: every session
        of the dead one is broken (its next call refused, not continued), new ones are made here."""
        if self.child is None or self.child.alive():
            return
        self._restarting = self._restarting or asyncio.Lock()
        async with self._restarting:
            if not self.child.alive():
                await asyncio.to_thread(self.child.start)
                self.generation += 1


def example_rows(server: str) -> list[str]:
    """The lines of a server's own example data (``data/example.jsonl`` in the installed wheel)."""
    path = site_packages() / "resources_servers" / server / "data" / "example.jsonl"
    if not path.is_file():
        raise NemoGymUnavailableError(f"NeMo Gym's {server} ships no data/example.jsonl")
    return [line for line in path.read_text().splitlines() if line.strip()]
