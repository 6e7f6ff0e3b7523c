"""Fixtures for the control plane: in-process participants, a coordinator, child processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollcut.bus import BusConfig, EventLog
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, Participant, Restorer
from rollcut.tokens import LocalTokenStore

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def plog(bus_config: BusConfig) -> AsyncIterator[EventLog]:
    """A second connection, as a participant process would have."""
    lg = await EventLog.connect(bus_config, name="participant")
    yield lg
    await lg.close()


@pytest.fixture
async def participants(plog: EventLog) -> AsyncIterator[Callable[..., Any]]:
    started: list[Participant] = []

    async def make(instance: str, mode: str = "exported", **kw: Any) -> Participant:
        kw.setdefault("lease_grace_s", 0.3)
        p = Participant(plog, component=kw.pop("component", "resources"), instance=instance, mode=mode, **kw)
        started.append(await p.start())
        return p

    yield make
    for p in started:
        await p.stop()


@pytest.fixture
def tokens(tmp_path: Path) -> Iterator[LocalTokenStore]:
    with LocalTokenStore(tmp_path / "tokens") as t:
        yield t


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(tmp_path / "ledger") as led:
        yield led


@pytest.fixture
def coordinator(log: EventLog, ledger: Ledger, tokens: LocalTokenStore) -> Coordinator:
    return Coordinator(log, ledger, tokens, grace_s=0.3, discovery_idle_s=0.05)


class Proc:
    """A child process that reports milestones on stdout."""

    def __init__(self, *args: str) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "tests.participants.procs", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def expect(self, word: str) -> str:
        while True:
            line = self.p.stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise AssertionError(f"process exited before {word}: {self.p.stderr.read()}")  # type: ignore[union-attr]
            if line.startswith(word):
                return line.strip()

    async def aexpect(self, word: str) -> str:
        """expect() without blocking the event loop the test's own coroutines run on."""
        import asyncio

        return await asyncio.to_thread(self.expect, word)

    def kill(self) -> None:
        self.p.kill()  # SIGKILL
        self.p.wait()


@pytest.fixture
def spawn() -> Iterator[Callable[..., Proc]]:
    procs: list[Proc] = []

    def make(*args: str) -> Proc:
        procs.append(Proc(*args))
        return procs[-1]

    yield make
    for pr in procs:
        if pr.p.poll() is None:
            pr.kill()


@pytest.fixture
def kill_coordinator_after(
    nats_url: str, namespace: str, tmp_path: Path, spawn: Callable[..., Proc]
) -> Callable[[str], Any]:
    """A coordinator in a process of its own (ledger ``tmp_path/dead-ledger``, deadline 1 s),
    SIGKILLed once it has done ``phase`` of a checkpoint."""

    async def kill(phase: str) -> None:
        dead = spawn(
            "coordinator",
            *("--url", nats_url, "--ns", namespace, "--deadline", "1.0", "--hang-after", phase),
            *("--ledger", str(tmp_path / "dead-ledger"), "--tokens", str(tmp_path / "dead-tokens")),
        )
        await dead.aexpect(f"AFTER {phase}")
        dead.kill()

    return kill


@pytest.fixture
def checkpoint_when_free(log: EventLog, ledger: Ledger, coordinator: Coordinator) -> Callable[[], Any]:
    """The next checkpoint, asked again while the lane still belongs to a dead coordinator's (until its
    deadline and grace have passed; bounded): the restorer's tail seal, which does exactly that."""
    return Restorer(log, ledger, coordinator, instance="collector-0", deadline_s=3).seal_tail
