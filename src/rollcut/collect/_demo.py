"""``rollcut demo``: the main job, end to end, on the embedded default.

A JetStream server, the local policy model, the Simple Agent (two workers), the
counter, blackjack and workplace environments and the environment server, each
a separate process with its own role credentials. A bundled, generated task set
is collected with periodic checkpoints; mid-run every Gym process is killed
with SIGKILL; they are restarted, the collection resumes from the latest
published checkpoint, and the demo prints what was saved.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from .._runtime import credentials_for
from ..bus import (
    AttemptOpened,
    BusConfig,
    EmbeddedServer,
    EventLog,
    ModelCallCompleted,
    ModelCallReused,
    ResourcesMutated,
)
from ..ledger import Ledger
from ..tokens import LocalTokenStore
from ._collector import Collector

__all__ = ["demo_tasks", "run_demo"]

NS = "demo"


def demo_tasks(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    names = ["Ada", "Grace", "Linus", "Barbara", "Ken", "Margaret"]
    out = []
    for i in range(n):
        kind = ("counter", "blackjack", "workplace")[i % 3]
        if kind == "counter":
            start = rng.randint(0, 9)
            task = {
                "env": "counter",
                "prompt": f"Starting at {start}, add numbers, then report the total.",
                "seed": {"start": start},
                "verify": {},
            }
        elif kind == "blackjack":
            task = {
                "env": "blackjack",
                "prompt": "Play one hand of blackjack and try to win.",
                "seed": {"seed": rng.randint(0, 10_000)},
                "verify": {},
            }
        else:
            who = rng.choice(names)
            task = {
                "env": "workplace",
                "prompt": f"Email {who}, book a meeting, and mark {who} as won.",
                "seed": {"contacts": [{"name": who, "company": "Acme"}]},
                "verify": {"expect": {"crm": [{"name": who}]}},
            }
        out.append({"id": f"t{i:04d}", "max_steps": 8, **task})
    return out


class _Proc:
    def __init__(
        self, argv: list[str], workers: int = 1, logs: Path | None = None, command: list[str] | None = None
    ) -> None:
        self.argv, self.workers, self.logs = argv, workers, logs
        self.command = command or [sys.executable, "-m", "rollcut._cli", "serve"]
        self.p: subprocess.Popen[str] | None = None
        self.url, self.pids = "", []
        self.instances: dict[str, int] = {}  # worker instance name -> pid
        self.log_path: Path | None = None

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None and all(_alive(pid) for pid in self.pids)

    def tail(self) -> str:
        return self.log_path.read_text()[-1500:] if self.log_path and self.log_path.exists() else ""

    def start(self) -> _Proc:
        err: Any = subprocess.DEVNULL
        if self.logs is not None:
            self.logs.mkdir(parents=True, exist_ok=True)
            name = "-".join(a for a in self.argv[:2] if not a.startswith("-"))
            self.log_path = self.logs / f"{name}.log"
            err = self.log_path.open("a")
        self.p = subprocess.Popen(
            [*self.command, *self.argv],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        self.pids, self.instances = [], {}
        while True:
            line = self.p.stdout.readline().strip()  # type: ignore[union-attr]
            if not line:
                raise RuntimeError(f"rollcut serve {self.argv[0]} did not start: {self.tail()}")
            if line.startswith("LISTENING"):
                self.url = line.split()[1]
            elif line.startswith("READY") and "pid=" in line:
                self.pids.append(int(line.rsplit("pid=", 1)[1]))
                self.instances[line.split()[1]] = self.pids[-1]
            if len(self.pids) == self.workers and (self.workers == 1 or line.startswith("READY http")):
                return self

    def kill(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.p is not None:
            self.p.kill()
            self.p.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stack(
    url: str,
    creds: Path,
    tokens: Path,
    seed: int,
    ports: dict[str, int],
    logs: Path | None = None,
    *,
    token_delay: float = 0.002,
    tool_turns: int = 3,
    agent_workers: int = 2,
) -> list[_Proc]:
    c = ["--url", url, "--namespace", NS, "--credentials", str(creds)]
    model = _Proc(
        [
            "model",
            *c,
            "--tokens",
            str(tokens),
            "--port",
            str(ports.get("model", 0)),
            "--seed",
            str(seed),
            "--token-delay",
            str(token_delay),
            "--tool-turns",
            str(tool_turns),
        ],
        logs=logs,
    ).start()
    envs = {
        name: _Proc(["resources", name, *c, "--port", str(ports.get(name, 0))], logs=logs).start()
        for name in ("counter", "blackjack", "workplace")
    }
    agent = _Proc(
        [
            "agent",
            "simple",
            "--model",
            model.url,
            *[a for n, p in envs.items() for a in ("--resources", f"{n}={p.url}")],
            *c,
            "--workers",
            str(agent_workers),
            "--port",
            str(ports.get("agent", 0)),
        ],
        workers=agent_workers,
        logs=logs,
    ).start()
    env = _Proc(
        ["environment", "--agent", agent.url, *c, "--port", str(ports.get("environment", 0))], logs=logs
    ).start()
    return [model, *envs.values(), agent, env]


def _dead(stack: list[_Proc]) -> str | None:
    for p in stack:
        if not p.alive():
            return f"rollcut serve {' '.join(p.argv[:2])} died on its own; its log:\n{p.tail()}"
    return None


def _port(p: _Proc) -> int:
    return int(p.url.rsplit(":", 1)[1])


async def run_demo(
    *,
    rollouts: int = 64,
    seed: int = 0,
    crash: bool = True,
    home: Path | None = None,
    progress: Any = None,
    recovery: str = "tail",
) -> dict[str, Any]:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rollcut-demo-") as tmp:
        root = home or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        creds = credentials_for(root / "nats", NS)
        creds_path = root / "nats" / "credentials.json"
        tasks = demo_tasks(rollouts, seed)
        output = root / "results.jsonl"
        output.unlink(missing_ok=True)
        with EmbeddedServer(root / "nats", credentials=creds) as nats:
            log = await EventLog.connect(
                BusConfig(url=nats.url).as_role(creds, "admin"), name="demo-collector"
            )
            logs = root / "logs"
            stack = _stack(nats.url, creds_path, root / "tokens", seed, {}, logs)
            ports = {
                "model": _port(stack[0]),
                "counter": _port(stack[1]),
                "blackjack": _port(stack[2]),
                "workplace": _port(stack[3]),
                "agent": _port(stack[4]),
                "environment": _port(stack[5]),
            }
            crashes = 0
            try:
                with Ledger(root / "ledger") as ledger, LocalTokenStore(root / "tokens") as tokens:

                    def make() -> Collector:
                        return Collector(
                            log,
                            ledger,
                            tokens,
                            environment_url=stack[-1].url,
                            tasks=tasks,
                            output=output,
                            concurrency=16,
                            checkpoint_every_s=0.5,
                            checkpoint_deadline_s=5,
                            recovery=recovery,
                            on_progress=progress,
                        )

                    first = make()
                    run = asyncio.ensure_future(first.run())
                    if crash:
                        while not run.done():  # bounded by the run itself
                            if (
                                first.summary.checkpoints_published >= 1
                                and len(first._written) >= rollouts // 3
                            ):
                                break
                            died = _dead(stack)
                            if died:
                                first.stop()
                                await run
                                raise RuntimeError(died)
                            await asyncio.sleep(0.05)
                        if not run.done():
                            for p in stack:
                                p.kill()  # every Gym process, SIGKILL, mid-run
                            crashes += 1
                            first.stop()
                    s1 = await run
                    checkpoints = s1.checkpoints_published
                    if crash and crashes:
                        stack = _stack(nats.url, creds_path, root / "tokens", seed, ports, logs)
                        second = make()
                        s2 = await second.run(resume=True)
                        checkpoints += s2.checkpoints_published
                        summary = s2
                    else:
                        summary = s1
                    async with httpx.AsyncClient() as client:
                        served_tools = 0
                        for p in stack[1:4]:
                            served_tools += (await client.get(f"{p.url}/rollcut/stats")).json()[
                                "tool_calls_served_from_log"
                            ]
                    counts = await _count(log)
            finally:
                for p in stack:
                    p.kill()
                await log.close()
        rows = [line for line in output.read_text().splitlines() if line.strip()]
        ids = [__import__("json").loads(r)["rollout_id"] for r in rows]
    return {
        "rollouts": rollouts,
        "results_written": len(set(ids)),
        "duplicate_results": len(ids) - len(set(ids)),
        "crashes": crashes,
        "checkpoints_published": checkpoints,
        "recovery": summary.recovery,
        "fresh_dispatch_never_started": summary.never_started,  # queued at the crash: kept on attempt 1
        "fallbacks_to_fresh": summary.fallbacks_to_fresh,
        "model_calls": {
            "generated": counts["generated"],
            "served_from_log": counts["reused"],
            "regenerated_after_crash": counts["regenerated"],
        },
        "tokens_regenerated": counts["tokens_regenerated"],
        "tool_calls": {"executed": counts["mutations"], "served_from_log": served_tools},
        "failed": summary.failed,
        "wall_s": round(time.perf_counter() - t0, 2),
    }


async def _count(log: EventLog) -> dict[str, int]:
    """What the log says happened, including any completed model call generated twice."""
    completed: dict[str, list[tuple[int, str, int]]] = {}  # rollout -> (attempt, request digest, tokens)
    opened_from: dict[tuple[str, int], int] = {}
    out = {"generated": 0, "reused": 0, "mutations": 0, "regenerated": 0, "tokens_regenerated": 0}
    async for s in log.read():
        ev = s.event
        if isinstance(ev, ModelCallCompleted):
            out["generated"] += 1
            completed.setdefault(ev.rollout_id, []).append((ev.attempt, ev.request_digest, ev.receipt.count))
        elif isinstance(ev, ModelCallReused):
            out["reused"] += 1
        elif isinstance(ev, ResourcesMutated):
            out["mutations"] += 1
        elif isinstance(ev, AttemptOpened):
            opened_from[(ev.rollout_id, ev.attempt)] = ev.from_cut
    for calls in completed.values():  # a completed call generated again, whatever the reason
        for attempt, dig, n in calls:
            if any(a < attempt and d == dig for a, d, _ in calls):
                out["regenerated"] += 1
                out["tokens_regenerated"] += n
    return out
