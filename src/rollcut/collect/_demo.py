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
import json
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from .._files import private_dir
from .._runtime import credentials_for
from .._telemetry import percentile
from ..bus import (
    AttemptOpened,
    BusConfig,
    EmbeddedServer,
    EventLog,
    ModelCallCompleted,
    ModelCallContinued,
    ModelCallReused,
    ResourcesMutated,
)
from ..gym import DEMO_ENVIRONMENTS, ServerProcess, start_stack
from ..ledger import Ledger, verify_checkpoint
from ..participants import RecoveryMode
from ..tokens import LocalTokenStore
from ._collector import Collector
from ._rows import failures_path
from ._summary import Summary

__all__ = ["DEMO_NAMESPACE", "count_work", "demo_rows", "demo_tasks", "run_demo"]

DEMO_NAMESPACE = "demo"
"""The namespace the demo (and the end-to-end tests' deployment) runs in."""


def _task(kind: str, rng: random.Random) -> dict[str, Any]:
    """One generated task for environment ``kind`` (its prompt, seed and verify arguments)."""
    if kind == "counter":
        start = rng.randint(0, 9)
        return {
            "prompt": f"Starting at {start}, add numbers, then report the total.",
            "seed": {"start": start},
            "verify": {},
        }
    if kind == "blackjack":
        return {
            "prompt": "Play one hand of blackjack and try to win.",
            "seed": {"seed": rng.randint(0, 10_000)},
        }
    if kind in ("workplace", "workplace_exported"):
        who = rng.choice(_NAMES)
        return {
            "prompt": f"Email {who}, book a meeting, and mark {who} as won.",
            "seed": {"contacts": [{"name": who, "company": "Acme"}]},
            "verify": {"expect": {"crm": [{"name": who}]}},
        }
    if kind == "stateful_counter":
        start = rng.randint(0, 9)
        return {
            "prompt": f"The counter starts at {start}; increment it, then read it.",
            "seed": {"initial_count": start},
            "verify": {"expected_count": start + 3},
        }
    if kind == "math":
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        return {"prompt": f"What is {a} + {b}?", "seed": {}, "verify": {"expected": str(a + b)}}
    if kind == "judge":
        return {
            "prompt": "Explain in one sentence why the sky is blue.",
            "seed": {},
            "verify": {"expect_words": ["light", "scatter"], "judge_delay_s": 0.05},
        }
    if kind == "scratchpad":
        return {"prompt": "Write down three ideas for a name.", "seed": {}}
    raise ValueError(f"no generated tasks for environment {kind!r}")


_NAMES = ["Ada", "Grace", "Linus", "Barbara", "Ken", "Margaret"]


def demo_tasks(n: int, seed: int, envs: tuple[str, ...] = DEMO_ENVIRONMENTS) -> list[dict[str, Any]]:
    """A generated task set, one environment of ``envs`` after the other (the demo's: counter,
    blackjack and workplace; a mixed collection: every bundled environment)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = envs[i % len(envs)]
        out.append({"id": f"t{i:04d}", "max_steps": 8, "env": kind, "verify": {}, **_task(kind, rng)})
    return out


def demo_rows(n: int, seed: int, envs: tuple[str, ...] = DEMO_ENVIRONMENTS) -> list[dict[str, Any]]:
    """The demo's task set as NeMo Gym input rows: ``responses_create_params``, ``agent_ref``, and the
    environment's own fields (``env``, ``seed``, ``verify``, ``max_steps``)."""
    return [
        {
            "responses_create_params": {"input": [{"role": "user", "content": t["prompt"]}], "tools": []},
            "agent_ref": {"type": "responses_api_agents", "name": "simple_agent"},
            **{k: t[k] for k in ("env", "seed", "verify", "max_steps")},
        }
        for t in demo_tasks(n, seed, envs)
    ]


def _dead(stack: list[ServerProcess]) -> str | None:
    for p in stack:
        if not p.alive():
            return f"rollcut serve {' '.join(p.argv[:2])} died on its own; its log:\n{p.tail()}"
    return None


async def run_demo(
    *,
    rollouts: int = 64,
    seed: int = 0,
    crash: bool = True,
    home: Path | None = None,
    progress: Callable[[Summary, int, int], None] | None = None,
    recovery: RecoveryMode = RecoveryMode.TAIL,
    envs: tuple[str, ...] = DEMO_ENVIRONMENTS,
    workers: tuple[int | None, int | None] = (None, None),
    verify: bool = False,
    checkpoint_every_s: float = 0.5,
    concurrency: int = 16,
    engine: str | None = None,
    engine_url: str = "",
    engine_cuts: bool = True,
) -> dict[str, Any]:
    """The main job end to end, with a crash and recovery; returns what was saved.

    With ``engine`` (a dialect: ``llama.cpp``, ``vllm``) the policy model is a real inference engine:
    the one at ``engine_url``, or else llama.cpp's server on a tiny model started here for the run.
    The engine is not a Gym process: the crash spares it, as a node's failure spares a remote one.

    ``envs`` are the resources servers (and the task mix); ``workers`` every
    server's worker count before and after the crash (None: the demo's); with
    ``verify`` every published checkpoint is verified from scratch at the end. The demo
    checkpoints every half second on purpose (many cuts, many in-flight generations).
    """
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rollcut-demo-") as tmp, contextlib.ExitStack() as engines:
        root = private_dir(home or Path(tmp))
        model: dict[str, Any] = {}
        local_engine = None
        if engine is not None:
            from ..gym.model.engine import tiny_engine

            if not engine_url:
                local_engine = engines.enter_context(tiny_engine(root / "engine"))
            model = {
                "backend": "engine",
                "upstream": local_engine.url if local_engine else engine_url,
                "engine_dialect": engine,
                "engine_no_cuts": not engine_cuts,
            }
        creds = credentials_for(root / "nats", DEMO_NAMESPACE)
        creds_path = root / "nats" / "credentials.json"
        tasks = demo_rows(rollouts, seed, envs)
        output = root / "rollouts.jsonl"
        output.unlink(missing_ok=True)
        failures_path(output).unlink(missing_ok=True)
        output.with_name(output.name + ".collection.json").unlink(missing_ok=True)
        with EmbeddedServer(root / "nats", credentials=creds) as nats:
            log = await EventLog.connect(
                BusConfig(url=nats.url).as_role(creds, "admin"), name="demo-collector"
            )
            logs = root / "logs"
            opts: dict[str, Any] = {
                "namespace": DEMO_NAMESPACE,
                "seed": seed,
                "logs": logs,
                "envs": envs,
                "model_options": model,
            }
            stack = start_stack(nats.url, creds_path, root / "tokens", workers=workers[0], **opts)
            ports = {p.name: p.port for p in stack}
            crashes = 0
            peak: dict[str, float] = {}
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
                            concurrency=concurrency,
                            checkpoint_every_s=checkpoint_every_s,
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
                            _note_peaks(stack, peak)
                            for p in stack:
                                p.kill()  # every Gym process, SIGKILL, mid-run
                            crashes += 1
                            first.stop()
                    s1 = await run
                    checkpoints, checkpoint_ms = s1.checkpoints_published, list(first.checkpoint_ms)
                    pause_ms = list(first.pause_ms)
                    summary = s1
                    if crash and crashes:
                        stack = start_stack(
                            nats.url, creds_path, root / "tokens", ports=ports, workers=workers[1], **opts
                        )
                        second = make()
                        summary = await second.run(resume=True)
                        checkpoints += summary.checkpoints_published
                        checkpoint_ms += second.checkpoint_ms
                        pause_ms += second.pause_ms
                    async with httpx.AsyncClient() as client:
                        served_tools = 0
                        for p in stack[1 : 1 + len(envs)]:  # each server's stats sum its workers'
                            served_tools += (await client.get(f"{p.url}/rollcut/stats")).json()[
                                "tool_calls_served_from_log"
                            ]
                    counts = await count_work(log)
                    engine_tokens = local_engine.tokens_predicted() if local_engine else None
                    problems = await _verify_all(log, ledger, tokens) if verify else None
            finally:
                _note_peaks(stack, peak)
                for p in stack:
                    p.kill()
                await log.close()
        rows = [line for line in output.read_text().splitlines() if line.strip()]
        ids = [json.loads(r)["rollout_id"] for r in rows]
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
            "regenerated_while_continuing": counts["regenerated_continuing"],
        },
        "tokens_regenerated": counts["tokens_regenerated"],
        "tool_calls": {"executed": counts["mutations"], "served_from_log": served_tools},
        "failed": summary.failed,
        "checkpoint_ms_p50": percentile(checkpoint_ms, 50),
        "checkpoint_ms_p99": percentile(checkpoint_ms, 99),
        "checkpoint_pause_ms_p50": percentile(pause_ms, 50),  # the collection stood still this long
        "checkpoint_pause_ms_p99": percentile(pause_ms, 99),
        "peak_rss_mb": peak,  # per server (its largest process), over the whole run
        "checkpoint_problems": problems,  # None: not verified; else every problem found (none: [])
        "wall_s": round(time.perf_counter() - t0, 2),
        "rows": str(output) if home is not None else None,  # NeMo Gym's row format, one per rollout
        "engine": None if engine is None else _engine_work(engine, engine_cuts, engine_tokens, counts),
    }


def _engine_work(dialect: str, cuts: bool, total: int | None, counts: dict[str, int]) -> dict[str, Any]:
    """What the engine generated (its own counter, when rollcut started it) against what completed
    calls needed: the rest was generated for nothing (tails of calls in flight at the crash past
    their last cut, or whole calls without cuts; tokens past a cut's boundary before the abort)."""
    needed = counts["completed_tokens"] - counts["continued_tokens"]
    return {
        "dialect": dialect,
        "cuts": cuts,
        "tokens_generated": total,
        "tokens_for_completed_calls": needed,
        "tokens_kept_by_cuts": counts["continued_tokens"],
        "tokens_wasted": None if total is None else total - needed,
    }


def _note_peaks(stack: list[ServerProcess], peak: dict[str, float]) -> None:
    for p in stack:
        peak[p.name] = max(peak.get(p.name, 0.0), p.peak_rss_mb())


async def _verify_all(log: EventLog, ledger: Ledger, tokens: LocalTokenStore) -> list[str]:
    """Every published checkpoint verified from scratch: the problems found, each named by its id."""
    out: list[str] = []
    for rec in ledger.checkpoints():
        out += [
            f"{rec.checkpoint_id}: {p}"
            for p in await verify_checkpoint(log, ledger, tokens, rec.checkpoint_id)
        ]
    return out


async def count_work(log: EventLog) -> dict[str, int]:
    """What the log says happened: model calls generated and reused, tool mutations, and any completed
    model call generated twice (``regenerated``; ``regenerated_continuing``: in an attempt that
    continued from a cut, where it is a loss, not in a fresh dispatch, where it was asked for); the
    tokens of completed calls and the durable prefixes continuations started from."""
    completed: dict[str, list[tuple[int, str, int]]] = {}  # rollout -> (attempt, request digest, tokens)
    opened_from: dict[tuple[str, int], int] = {}
    out = dict.fromkeys(("generated", "reused", "mutations", "regenerated", "tokens_regenerated"), 0)
    out.update(regenerated_continuing=0, completed_tokens=0, continued_tokens=0)
    async for s in log.read():
        ev = s.event
        if isinstance(ev, ModelCallCompleted):
            out["generated"] += 1
            out["completed_tokens"] += ev.receipt.count
            completed.setdefault(ev.rollout_id, []).append((ev.attempt, ev.request_digest, ev.receipt.count))
        elif isinstance(ev, ModelCallContinued):
            out["continued_tokens"] += ev.token_boundary  # a durable prefix, not generated again
        elif isinstance(ev, ModelCallReused):
            out["reused"] += 1
        elif isinstance(ev, ResourcesMutated):
            out["mutations"] += 1
        elif isinstance(ev, AttemptOpened):
            opened_from[(ev.rollout_id, ev.attempt)] = ev.from_cut
    for rid, calls in completed.items():  # a completed call generated again, whatever the reason
        for attempt, dig, n in calls:
            if any(a < attempt and d == dig for a, d, _ in calls):
                out["regenerated"] += 1
                out["tokens_regenerated"] += n
                # in an attempt that continued from a cut, a regeneration is a loss; in a fresh
                # dispatch (a restart-only environment, a refused continuation) it is what was asked
                out["regenerated_continuing"] += opened_from.get((rid, attempt), 0) > 0
    return out
