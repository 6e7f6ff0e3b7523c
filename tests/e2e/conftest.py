"""A whole deployment for end-to-end tests: JetStream with role credentials, every Gym
server as its own process, and `rollcut collect` driven through its command line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rollcut._home import credentials_for
from rollcut.bus import BusConfig, EmbeddedCluster, EmbeddedServer, EventLog
from rollcut.demo import DEMO_NAMESPACE as NS
from rollcut.demo import demo_tasks
from rollcut.testing import ServerProcess, start_stack, stop_stack

from ..helpers import each_rollout_once


@dataclass
class Deployment:
    root: Path
    url: str
    config: Path
    output: Path
    stack: list[Any]
    rollouts: int
    stack_options: dict[str, Any]
    replicas: int = 1
    every_s: float | None = None  # checkpoint every this many seconds, besides on signals
    extra_config: list[str] = field(default_factory=list)  # more lines of the collect YAML

    def collect(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "rollcut", "collect", str(self.config), "--json", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def rows(self) -> list[dict[str, Any]]:
        """The rows written so far: whole lines only (read while the collector writes, the last line
        of a long row can be half there)."""
        if not self.output.exists():
            return []
        lines = self.output.read_text().split("\n")[:-1]  # after the last newline: not yet whole
        return [json.loads(line) for line in lines if line.strip()]

    def each_rollout_once(self) -> None:
        """Every rollout of the collection has its row, once (``tests/helpers.each_rollout_once``)."""
        each_rollout_once(self.rows(), self.rollouts)

    def wait_rows(self, n: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
        give_up = time.monotonic() + timeout
        while len(self.rows()) < n:  # bounded: the collection makes progress or the test fails
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < give_up, f"only {len(self.rows())} rows after {timeout}s"
            time.sleep(0.05)

    def crash(self) -> None:
        for p in self.stack:
            p.kill()

    def crash_one(self, name: str) -> None:
        """SIGKILL one server (every process of it) and start it again on its port, as a supervisor
        would; the others go on."""
        i, proc = next((i, p) for i, p in enumerate(self.stack) if p.name == name)
        proc.kill()
        argv = list(proc.argv)
        argv[argv.index("--port") + 1] = str(proc.port)
        self.stack[i] = ServerProcess(argv, workers=proc.workers, logs=proc.logs).start()

    def restart(self, *, same_ports: bool = False) -> None:
        """Start every Gym server again; on the ports they had, as a supervisor would, if asked."""
        ports = {p.name: p.port for p in self.stack} if same_ports else {}
        self.stack = start_stack(
            self.url,
            self.creds,
            self.root / "tokens",
            namespace=NS,
            ports=ports,
            replicas=self.replicas,
            **self.stack_options,
        )
        self._write_config()

    @property
    def creds(self) -> Path:
        return self.root / "nats" / "credentials.json"

    def _write_config(self) -> None:
        self.config.write_text(
            "\n".join(
                [
                    f"nats_url: {self.url}",
                    f"replicas: {self.replicas}",
                    f"namespace: {NS}",
                    f"credentials: {self.root / 'nats' / 'credentials.json'}",
                    f"home: {self.root}",
                    f"environment_url: {self.stack[-1].url}",
                    "tasks: tasks.jsonl",
                    "output: results.jsonl",
                    "concurrency: 8",
                    "checkpoint:",
                    "  deadline_s: 5",
                    *([f"  every_s: {self.every_s}"] if self.every_s else []),
                    *self.extra_config,
                    "",
                ]
            )
        )


@contextlib.contextmanager
def deploy(
    root: Path,
    tasks: list[dict[str, Any]] | None = None,
    *,
    nats: EmbeddedServer | EmbeddedCluster | None = None,
    replicas: int = 1,
    **stack_options: Any,
) -> Iterator[Deployment]:
    """JetStream with role credentials, its stream, 16 demo tasks (or ``tasks``) and every Gym server
    as a process. ``nats``: a cluster (or server) already started on ``root / "nats"``'s credentials;
    by default one server is started here. Every server has one worker, as ``rollcut serve`` does by
    default, unless ``workers`` or ``agent_workers`` says otherwise (the tests of several workers
    say so; a worker more per deployment cost a second of CPU at every start, on CI's two cores)."""
    if "workers" not in stack_options:
        stack_options.setdefault("agent_workers", 1)
    creds = credentials_for(root / "nats", NS)
    with contextlib.ExitStack() as stack_of:
        if nats is None:
            nats = stack_of.enter_context(EmbeddedServer(root / "nats", credentials=creds))
        # as an operator would, before any server starts
        asyncio.run(_create_stream(nats.url, creds, replicas))
        tasks = tasks if tasks is not None else demo_tasks(16, seed=0)
        (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
        stack = start_stack(
            nats.url,
            root / "nats" / "credentials.json",
            root / "tokens",
            namespace=NS,
            replicas=replicas,
            **stack_options,
        )
        dep = Deployment(
            root,
            nats.url,
            root / "collect.yaml",
            root / "results.jsonl",
            stack,
            len(tasks),
            stack_options,
            replicas,
        )
        dep._write_config()
        try:
            yield dep
        finally:
            stop_stack(dep.stack)


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    """Server processes a test starts; every process of each is SIGKILLed at the end, and what they
    left in the temporary directory removed."""
    started: list[ServerProcess] = []
    yield started
    for s in started:
        s.close()


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with deploy(tmp_path) as dep:
        yield dep


async def _create_stream(url: str, creds: Any, replicas: int = 1) -> None:
    log = await EventLog.connect(BusConfig(url=url, replicas=replicas).as_role(creds, "admin"))
    await log.close()


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, dict[str, Any]]:
    out, err = proc.communicate(timeout=timeout)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else {"stderr": err[-2000:]})


SIGTERM, SIGUSR1 = signal.SIGTERM, signal.SIGUSR1


def collected(dep: Deployment, crash: bool) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Collect ``dep``'s tasks (with ``crash``: SIGKILL every Gym process once 4 rows are written,
    start them again, resume) and check what a user checks first: exit 0, every rollout's row exactly
    once, no failures file. The rows by rollout id, and the collector's summary."""
    proc = dep.collect()
    if crash:
        dep.wait_rows(4, proc)
        dep.crash()  # SIGKILL every Gym process mid-run
        proc.send_signal(SIGTERM)
        finish(proc)
        dep.restart()
        proc = dep.collect("--resume")
    code, summary = finish(proc)
    assert code == 0, summary
    rows = dep.rows()
    assert len(rows) == dep.rollouts == len({r["rollout_id"] for r in rows}), "every rollout exactly once"
    assert not (dep.output.parent / "results_failures.jsonl").exists()
    return {r["rollout_id"]: r for r in rows}, summary
