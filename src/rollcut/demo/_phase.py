"""One stretch of the demo's collection: a server, the Gym stack and a collector on one home.

The demo runs up to three kinds of phase: the first (it may end in the crash),
the recovery of the same home, and the recovery of a copy made at the crash
(another way, for the comparison). Each starts the embedded server on its home,
the Gym processes on the ports the first phase used, and one collector.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .._home import credentials_for
from ..bus import BusConfig, EmbeddedServer, EventLog
from ..collect import NO_COMPACTION, CheckpointPolicy, CollectOptions, Collector, CollectorHooks, Summary
from ..ledger import Ledger, verify_checkpoint
from ..participants import CheckpointResult, RecoveryMode, RecoveryResult
from ..replay import count_work_by
from ..testing import ServerProcess, start_stack, stop_stack
from ..tokens import LocalTokenStore
from ._baseline import episode_seconds
from ._story import (
    Checkpointed,
    Continuation,
    Crashed,
    Progressed,
    Resumed,
    Standing,
    Started,
    StoryEvent,
    standing,
)

__all__ = ["DEMO_NAMESPACE", "CrashInfo", "Phase", "PhaseSpec", "run_phase"]

DEMO_NAMESPACE = "demo"
"""The namespace the demo (and the end-to-end tests' deployment) runs in."""


@dataclass(frozen=True)
class PhaseSpec:
    """What every phase of one demo shares: the tasks, the deployment and who hears the story."""

    tasks: list[dict[str, Any]]
    seed: int
    envs: tuple[str, ...]
    model: dict[str, Any]
    agent: dict[str, Any]
    concurrency: int
    every_s: float
    verify: bool
    tell: Callable[[StoryEvent], None]

    def quiet(self) -> PhaseSpec:
        """The same, telling nothing (a comparison's recovery runs behind one line of its own)."""
        return dataclasses.replace(self, tell=lambda _: None, verify=False)


@dataclass(frozen=True)
class CrashInfo:
    """The crash: who was killed, where the rollouts stood, the last checkpoint before it."""

    killed: dict[str, int]
    standing: Standing
    last_checkpoint: str | None
    at_s: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``--json``."""
        return {**dataclasses.asdict(self), "standing": dataclasses.asdict(self.standing)}


def _env_of(row: Any) -> str:
    """The environment a row names (the group of its rollout's work in :attr:`Phase.by_env`)."""
    return str(row.get("env", "")) if isinstance(row, dict) else ""


@dataclass
class Phase:
    """What one phase did."""

    home: Path
    summary: Summary
    counts: dict[str, int]
    ports: dict[str, int]
    wall_s: float
    checkpoints: int  # published so far, this phase's and its predecessors'
    checkpoint_ms: list[float] = field(default_factory=list)
    pause_ms: list[float] = field(default_factory=list)
    crash: CrashInfo | None = None
    peak: dict[str, float] = field(default_factory=dict)
    served_tools: int = 0
    problems: list[str] | None = None
    started_at: float = 0.0  # wall clock at the phase's start
    episodes: list[float] = field(default_factory=list)  # seconds of each rollout finished by its end
    collect_s: float = 0.0  # the collector's run alone: from its start to its last row (or its stop)
    finished_s: float = 0.0
    """From the phase's start (its bus, its processes) to its last row: what a user waits for. The
    demo's own counting and checks after it (a scan of the whole log) and the stack's stop are not."""
    by_env: dict[str, dict[str, int]] = field(default_factory=dict)  # counts per environment of the rows

    @property
    def rows(self) -> Path:
        """The collection's rows (NeMo Gym's format)."""
        return self.home / "rollouts.jsonl"


def _dead(stack: list[ServerProcess]) -> str | None:
    for p in stack:
        if not p.alive():
            return f"rollcut serve {' '.join(p.argv[:2])} died on its own; its log:\n{p.tail()}"
    return None


def _note_peaks(stack: list[ServerProcess], peak: dict[str, float]) -> None:
    for p in stack:
        peak[p.name] = max(peak.get(p.name, 0.0), p.peak_rss_mb())


class _Watch:
    """The collector's hooks for one phase: tells the story, and arms the crash."""

    def __init__(self, spec: PhaseSpec, ledger: Ledger, base: int, crash: bool) -> None:
        self.spec, self.ledger = spec, ledger
        self.published = base
        self.crash_now = asyncio.Event()
        # the crash is armed by the first checkpoint published while half of what runs at once was
        # running and one had a turn done (or had finished), and lands when the next rollout
        # finishes: the others are mid-episode then (mid-call, for one-turn episodes), the crash
        # shows every kind (finished and kept, running and continued), and where it falls between
        # two checkpoints is up to the rollouts, not us
        self.half = (min(len(spec.tasks), spec.concurrency) + 1) // 2 if crash else 0
        self.armed = False
        self.running: Callable[[], int] = lambda: 0  # the collector's live count, once it exists

    def hooks(self) -> CollectorHooks:
        return CollectorHooks(progress=self.progress, checkpoint=self.checkpoint, recovery=self.recovery)

    def progress(self, s: Summary, total: int, running: int) -> None:
        self.spec.tell(Progressed(s.results_written, running, total, self.published))
        if self.armed and running > 0:
            self.crash_now.set()

    def checkpoint(self, res: CheckpointResult) -> None:
        self.published += 1
        st = standing(self.ledger, res.record.cut)
        ms = sum(res.phases_ms.values())
        cid = res.record.checkpoint_id
        self.spec.tell(Checkpointed(self.published, cid, res.record.cut, st, round(ms, 1), res.pause_ms))
        running = self.running()
        if self.half and running >= self.half and st.mid_episode + st.finished > 0:
            self.armed = True  # half running, and some work already done: a crash now costs something
        elif self.half and st.finished and running:  # they outran the half: land now
            self.crash_now.set()

    def recovery(self, res: RecoveryResult) -> None:
        plan = res.plan
        if res.sealed is not None:
            self.published += 1
        continued = []
        for rid in plan.continue_:
            rec = self.ledger.rollout(rid)  # projected up to the plan's cut, at least
            turns = (rec.last_boundary_turn or 0) if rec else 0
            unit = "request" if self.spec.agent.get("agent") == "opaque" else "turn"
            continued.append(Continuation(rid, plan.opened.get(rid, 0), turns, unit))
        never = len(plan.unstarted)
        self.spec.tell(
            Resumed(
                plan.checkpoint_id,
                plan.cut,
                len(plan.completed),
                continued,
                len(plan.fresh_dispatch) - never,
                never,
            )
        )


async def run_phase(
    home: Path,
    spec: PhaseSpec,
    *,
    workers: int | None,
    crash: bool = False,
    resume: bool = False,
    recovery: RecoveryMode = RecoveryMode.TAIL,
    recovery_checkpoint: str | None = None,
    after: Phase | None = None,
) -> Phase:
    """Collect on ``home`` until every row is written, or until the crash: with ``crash``, every Gym
    process is SIGKILLed when a rollout finishes after a checkpoint was published while half of
    what runs at once was running.
    ``after``: the phase this one follows (its ports, its checkpoint count); ``resume``: recover first."""
    t0, started_at = time.perf_counter(), time.time()
    creds = credentials_for(home / "nats", DEMO_NAMESPACE)
    peak: dict[str, float] = {}
    with EmbeddedServer(home / "nats", credentials=creds) as nats:
        log = await EventLog.connect(BusConfig(url=nats.url).as_role(creds, "admin"), name="demo-collector")
        stack = start_stack(
            nats.url,
            home / "nats" / "credentials.json",
            home / "tokens",
            ports=after.ports if after else None,
            workers=workers,
            namespace=DEMO_NAMESPACE,
            seed=spec.seed,
            logs=home / "logs",
            envs=spec.envs,
            model_options=spec.model,
            agent_options=spec.agent,
        )
        spec.tell(Started({p.name: p.pids[0] if p.pids else 0 for p in stack}, nats.url, restarted=resume))
        try:
            with Ledger(home / "ledger") as ledger, LocalTokenStore(home / "tokens") as tokens:
                watch = _Watch(spec, ledger, after.checkpoints if after else 0, crash)
                col = Collector(
                    log,
                    ledger,
                    tokens,
                    CollectOptions(
                        environment_url=stack[-1].url,
                        concurrency=spec.concurrency,
                        checkpoint=CheckpointPolicy(every_s=spec.every_s, deadline_s=5),
                        compaction=NO_COMPACTION,  # the demo verifies every rollout's history after
                    ),
                    tasks=spec.tasks,
                    output=home / "rollouts.jsonl",
                    recovery=recovery,
                    recovery_checkpoint=recovery_checkpoint,
                    hooks=watch.hooks(),
                )
                watch.running = lambda: col.running
                c0 = time.perf_counter()
                run = asyncio.ensure_future(col.run(resume=resume))
                crashed = await _crash_when_armed(run, watch, stack, col, ledger, t0) if crash else None
                summary = await run
                now = time.perf_counter()
                collect_s, finished_s = now - c0, now - t0
                spec.tell(Progressed(summary.results_written, 0, len(spec.tasks), watch.published))
                served = 0 if crashed else await _served_tools(stack, len(spec.envs))
                counts, by_env = await count_work_by(log, _env_of)
                episodes = await episode_seconds(log)
                problems = await _verify_all(log, ledger, tokens) if spec.verify and not crashed else None
        finally:
            _note_peaks(stack, peak)
            stop_stack(stack)
            await log.close()
    return Phase(
        home=home,
        summary=summary,
        counts=counts,
        by_env=by_env,
        ports={p.name: p.port for p in stack},
        wall_s=round(time.perf_counter() - t0, 2),
        checkpoints=watch.published,
        checkpoint_ms=list(col.checkpoint_ms),
        pause_ms=list(col.pause_ms),
        crash=crashed,
        peak=peak,
        served_tools=served,
        problems=problems,
        started_at=started_at,
        episodes=episodes,
        collect_s=round(collect_s, 3),
        finished_s=round(finished_s, 2),
    )


async def _crash_when_armed(
    run: asyncio.Future[Summary],
    watch: _Watch,
    stack: list[ServerProcess],
    col: Collector,
    ledger: Ledger,
    t0: float,
) -> CrashInfo | None:
    """Wait for the checkpoint that arms the crash (or the run's end: nothing to crash); then, if
    rollouts are still running, SIGKILL every Gym process and stop the collector, as a node's failure
    would leave it. Where they stood is the collector's own count at that moment."""
    armed = asyncio.ensure_future(watch.crash_now.wait())
    try:
        while not run.done() and not watch.crash_now.is_set():
            pending: set[asyncio.Future[Any]] = {run, armed}
            await asyncio.wait(pending, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
            died = _dead(stack)
            if died and not run.done():
                col.stop()
                await run
                raise RuntimeError(died)
    finally:
        armed.cancel()
    if run.done() or not col.running:  # everything finished before the crash could land
        return None
    killed = {p.name: p.pids[0] if p.pids else 0 for p in stack}
    col.stop()  # first: a checkpoint started among the dead would wait out its whole deadline
    running, written = col.running, col.summary.results_written
    for p in stack:
        p.kill()  # every Gym process, SIGKILL, mid-run
    at_s = round(time.perf_counter() - t0, 2)
    await run  # rows already in hand-off are written and acknowledged: they finished before the crash
    finished = col.summary.results_written
    mid = max(0, running - (finished - written))  # those handed off were counted as running
    last = ledger.latest_checkpoint()
    standing = Standing(finished, mid, len(watch.spec.tasks) - finished - mid)
    crash = CrashInfo(killed, standing, last.checkpoint_id if last else None, at_s)
    watch.spec.tell(Crashed(crash.killed, crash.standing, crash.last_checkpoint))
    return crash


async def _served_tools(stack: list[ServerProcess], envs: int) -> int:
    """Tool calls the resources servers answered from the log (each server's stats sum its workers')."""
    served = 0
    async with httpx.AsyncClient() as client:
        for p in stack[1 : 1 + envs]:
            served += (await client.get(f"{p.url}/rollcut/stats")).json()["tool_calls_served_from_log"]
    return served


async def _verify_all(log: EventLog, ledger: Ledger, tokens: LocalTokenStore) -> list[str]:
    """Every published checkpoint verified from scratch: the problems found, each named by its id."""
    out: list[str] = []
    for rec in ledger.checkpoints():
        out += [
            f"{rec.checkpoint_id}: {p}"
            for p in await verify_checkpoint(log, ledger, tokens, rec.checkpoint_id)
        ]
    return out
