"""``rollcut demo``: the main job, end to end, on the embedded default, told as it happens.

A JetStream server, the local policy model, the Simple Agent (two workers), the
counter, blackjack and workplace environments and the environment server, each
a separate process with its own role credentials. A bundled, generated task set
is collected with periodic checkpoints. Every rollout runs at once (up to 64), so
that the crash lands mid-episode: once a checkpoint was published while half of
them were running, every Gym process is SIGKILLed the moment the next rollout
finishes. They are restarted, the collection resumes from the stream's sealed
tail, and every interrupted rollout continues where it was.

What that saved is measured, not estimated: with ``compare``, the collection's
home is copied at the crash (stream, ledger, token store and rows, byte for byte,
with every process stopped) once per alternative, and each copy is recovered the
alternative's way, last checkpoint only and restart from input, on fresh servers,
one after the other. The same crash, three recoveries, counted from each copy's
own log (:func:`count_work`).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from .._errors import ConfigError
from .._files import private_dir, write_private
from .._home import credentials_for
from .._telemetry import percentile
from ..gym._pace import GEMMA_ON_TWO_CORES
from ..gym.resources import NEMO_GYM_DECLARED
from ..participants import RecoveryMode
from ..testing import DEMO_ENVIRONMENTS
from ._baseline import BaselineCut, baseline_cut, default_interval
from ._generated import Counter, Generated, local_options
from ._phase import DEMO_NAMESPACE, Phase, PhaseSpec, run_phase
from ._story import Compared, Comparing, StoryEvent
from ._tasks import NEMO_GYM_DEMO, demo_rows, demo_tasks, nemo_gym_rows

__all__ = ["ALTERNATIVES", "DEMO_NAMESPACE", "ENGINE_TASK_PARAMS", "run_demo"]

ALTERNATIVES = {"last_checkpoint": RecoveryMode.CHECKPOINT, "restart": RecoveryMode.RESTART}
"""What the demo compares rollcut's recovery with, each on its own copy of the crashed collection:
continuing from the last checkpoint published before the crash only, and every unfinished rollout
from its input (a framework without partial-rollout checkpointing)."""

_COPIED = ("nats", "ledger", "tokens")  # the collection's state at the crash; rows are copied too


async def run_demo(
    *,
    rollouts: int = 64,
    seed: int = 0,
    crash: bool = True,
    compare: tuple[str, ...] = (),
    home: Path | None = None,
    story: Callable[[StoryEvent], None] | None = None,
    recovery: RecoveryMode = RecoveryMode.TAIL,
    envs: tuple[str, ...] = DEMO_ENVIRONMENTS,
    workers: tuple[int | None, int | None] = (None, None),
    verify: bool = False,
    checkpoint_every_s: float = 0.5,
    concurrency: int | None = None,
    engine: str | None = None,
    engine_url: str = "",
    engine_cuts: bool = True,
    engine_model: str = "tiny",
    baseline_every_s: float | None = None,
    baseline_intervals: tuple[float, ...] = (),
    agent: str = "simple",
    nemo_gym: bool = False,
    paced: bool = False,
) -> dict[str, Any]:
    """The main job end to end, with a crash and recovery; returns what was saved.

    ``story`` hears each thing as it happens (:mod:`._story`). ``compare`` names ways of
    :data:`ALTERNATIVES` to recover the same crash with too, each on a copy of the collection made
    at the crash (``HOME/compare/<way>``); ``compared`` holds each way's cost beside rollcut's.

    With ``engine`` (a dialect: ``llama.cpp``, ``vllm``) the policy model is a real inference engine:
    the one at ``engine_url``, or else llama.cpp's server on a tiny model started here for the run.
    The engine is not a Gym process: the crash spares it, as a node's failure spares a remote one.
    ``engine_model`` names the model llama.cpp's server runs (``tiny``, or ``gemma-3-270m``: a real
    base model, whose rows ask for a tool call on every turn by constrained decoding, each call
    bounded, as :data:`ENGINE_TASK_PARAMS` says).

    ``baseline_every_s``: the interval of the ``last_checkpoint`` way (a checkpoint-interval design
    recovers from the newest checkpoint it would have taken, :mod:`._baseline`); default the longer
    of NeMo Gym's 5% floor and one episode. ``baseline_intervals``: more copies of the crash, each
    recovered the last-checkpoint way at one of these intervals (``by_interval`` in the result: the
    curve ``bench e2e --intervals`` reports and ``rollcut report`` draws).

    ``envs`` are the resources servers (and the task mix); ``workers`` every server's worker count
    before and after the crash (None: the demo's); with ``verify`` every published checkpoint is
    verified from scratch at the end. ``concurrency`` defaults to every rollout at once, up to 64.
    The demo checkpoints every half second on purpose (many cuts, many in-flight generations).
    ``agent="opaque"``: the rollouts are run by the reference opaque agent, a program of its own
    behind the journaling relay (``docs/opaque-agents.md``), instead of the Simple Agent.
    ``nemo_gym``: the resources servers are NeMo Gym's own (:data:`NEMO_GYM_DEMO`, unmodified, from
    the installed wheel, behind rollcut's journal) and the rows are their own example data; ``nemo_gym``
    in the result says the level each ran at.
    ``paced``: the local model decodes at the pace of a small real model on this machine
    (:data:`~rollcut.gym.model.GEMMA_ON_TWO_CORES`: one decode loop shared by every call, as a batched
    engine's), so the seconds a recovery takes follow the tokens it generates (``rollcut demo``'s
    default); else as fast as it can (the benchmarks, which measure rollcut, not a model).
    """
    t0 = time.perf_counter()
    tell = story or (lambda _: None)
    with tempfile.TemporaryDirectory(prefix="rollcut-demo-") as tmp, contextlib.ExitStack() as engines:
        root = _fresh(home or Path(tmp))
        # the local model's own count of what a crash cost each way, kept across its SIGKILL (a run
        # without a crash has nothing to cost, and a syscall per token would tilt bench e2e's vs_plain)
        count = root / "generated.tokens" if crash else None
        model: dict[str, Any] = {"backend_options": local_options(count, paced)}
        local_engine = None
        if engine is not None:
            from ..gym.model.engine import served_engine

            if not engine_url:
                threads = 1 if engine_model == "tiny" else 2  # a real model: both cores when it decodes
                local_engine = engines.enter_context(
                    served_engine(engine_model, root / "engine", threads=threads)
                )
            model = {
                "backend": "engine",
                "upstream": local_engine.url if local_engine else engine_url,
                "backend_options": {"dialect": engine, "cuts": str(engine_cuts).lower()},
            }
        credentials_for(root / "nats", DEMO_NAMESPACE)
        run_at_once = min(rollouts, concurrency or 64)
        tasks = (
            demo_rows(rollouts, seed, envs, params=ENGINE_TASK_PARAMS if engine else None)
            if agent == "simple"
            else demo_tasks(rollouts, seed, envs)
        )
        if nemo_gym:  # NeMo Gym's servers as they ship, on their own example rows
            envs, tasks = tuple(f"nemo-gym:{s}" for s in NEMO_GYM_DEMO), nemo_gym_rows(rollouts)
        if engine_model != "tiny":  # a real model decodes at tens of tokens a second on a CPU
            tasks = [{**t, "max_steps": REAL_MODEL_MAX_STEPS} for t in tasks]
        spec = PhaseSpec(
            # an opaque agent speaks chat completions, not NeMo Gym's Responses rows: rollcut's task rows
            tasks=tasks,
            seed=seed,
            envs=envs,
            model=model,
            agent=agent_options(agent),
            concurrency=run_at_once,
            every_s=checkpoint_every_s,
            verify=verify,
            tell=tell,
        )
        first = await run_phase(root, spec, workers=workers[0], crash=crash)
        main, compared = first, {}
        counter = Counter.of(local_engine, engine, engine_cuts, count)
        counter.pre = counter.read()  # what the model generated before the crash, shared by every way
        generated = counter.work(main, None)
        by_interval: dict[str, Any] = {}
        if first.crash is not None:
            copies = {way: _copy_at_crash(root, root / "compare" / way) for way in compare}
            every = {
                f"{s:g}": _copy_at_crash(root, root / "compare" / f"every-{s:g}s") for s in baseline_intervals
            }
            main = await run_phase(
                root, spec, workers=workers[1], resume=True, recovery=recovery, after=first
            )
            generated = counter.work(main, counter.pre)
            compared["rollcut"] = _cost(main, first, generated)

            async def recovered(where: Path, mode: RecoveryMode, cut: BaselineCut | None) -> dict[str, Any]:
                """One copy of the crash recovered one way (the last-checkpoint way from ``cut``)."""
                start = counter.read()
                if cut is not None and cut.checkpoint_id is None:
                    mode = RecoveryMode.RESTART  # no checkpoint yet at that interval: all from input
                alt = await run_phase(
                    where,
                    spec.quiet(),
                    workers=workers[1],
                    resume=True,
                    recovery=mode,
                    recovery_checkpoint=cut.checkpoint_id if cut else None,
                    after=first,
                )
                cost = _cost(alt, first, counter.work(alt, start))
                return {**cost, "baseline": cut.as_dict()} if cut is not None else cost

            for way, where in copies.items():
                tell(Comparing(way, str(where)))
                mode = ALTERNATIVES[way]
                cut = _baseline(first, where, baseline_every_s) if mode is RecoveryMode.CHECKPOINT else None
                compared[way] = await recovered(where, mode, cut)
                tell(Compared(way, compared[way]))
            for interval, where in every.items():
                tell(Comparing("last_checkpoint", str(where)))
                cut = _baseline(first, where, float(interval))
                by_interval[interval] = await recovered(where, RecoveryMode.CHECKPOINT, cut)
        out = _report(rollouts, first, main, compared, time.perf_counter() - t0, home, generated)
        out["by_interval"] = by_interval or None
        out["model"] = _served(engine, engine_model if local_engine is not None else None, model, paced)
        out["nemo_gym"] = _levels(NEMO_GYM_DEMO, main.by_env) if nemo_gym else None
        if home is not None:  # what was saved, beside what it was saved from
            write_private(root / "demo.json", msgspec.json.encode(out))
    return out


def _report(
    rollouts: int,
    first: Phase,
    main: Phase,
    compared: dict[str, Any],
    wall_s: float,
    home: Path | None,
    generated: Generated,
) -> dict[str, Any]:
    """The demo's one JSON object (``--json``, and ``HOME/demo.json``): how the run went, by the same
    measures as each compared way (:func:`_cost`), and what the main recovery kept and redid."""
    run = compared.get("rollcut") or _cost(main, first, generated)  # the main recovery's, costed once
    collect_s = round(first.collect_s + (main.collect_s if main is not first else 0.0), 3)
    counts, summary = main.counts, main.summary
    return {
        "rollouts": rollouts,
        "results_written": run["results_written"],
        "duplicate_results": run["duplicate_results"],
        "crashes": int(first.crash is not None),
        "crash": None if first.crash is None else first.crash.as_dict(),
        "checkpoints_published": run["checkpoints_published"],
        "recovery": summary.recovery,
        "fresh_dispatch_never_started": summary.never_started,  # queued at the crash: kept on attempt 1
        "fallbacks_to_fresh": summary.fallbacks_to_fresh,
        "model_calls": {
            "generated": counts["generated"],
            "served_from_log": counts["reused"],
            "kept_across_the_crash": counts["model_calls_kept"],
            "regenerated_after_crash": counts["regenerated"],
            "regenerated_while_continuing": counts["regenerated_continuing"],
        },
        "tokens_kept": counts["tokens_kept"],
        "tokens_regenerated": counts["tokens_regenerated"],
        "tool_calls": {
            "executed": counts["mutations"],
            "kept_across_the_crash": counts["tool_calls_kept"],
            "reexecuted": counts["tool_calls_reexecuted"],
            "served_from_log": main.served_tools,
        },
        "failed": summary.failed,
        **{k: run[k] for k in _TIMINGS},  # checkpoint and pause p50/p99 of the whole run
        "peak_rss_mb": run["peak_rss_mb"],  # per server (its largest process), over the whole run
        "checkpoint_problems": main.problems,  # None: not verified; else every problem found (none: [])
        "compared": compared or None,
        "wall_s": round(wall_s, 2),
        # the collector's own time (every phase's, without starting servers) and its rate in it
        "collect_s": collect_s,
        "rows_per_s": round(run["results_written"] / collect_s, 2) if collect_s > 0 else None,
        "home": str(main.home) if home is not None else None,
        "rows": str(main.rows) if home is not None else None,  # NeMo Gym's row format, one per rollout
        "engine": generated.figures,
        # the interval of the last-checkpoint way, and the checkpoint it recovered from
        "baseline": (compared.get("last_checkpoint") or {}).get("baseline"),
    }


_TIMINGS = ("checkpoint_ms_p50", "checkpoint_ms_p99", "checkpoint_pause_ms_p50", "checkpoint_pause_ms_p99")


ENGINE_TASK_PARAMS: dict[str, Any] = {"tool_choice": "required", "max_output_tokens": 48}
"""What the demo's rows ask of every model call on an engine: a tool call (a base model is held to
one by constrained decoding: docs/engines.md), in a bounded budget, so an episode is its
``max_steps`` tool calls and a crash always finds calls in flight."""


REAL_MODEL_MAX_STEPS = 4
"""Tool calls per episode on a real model (``--model gemma-3-270m``): the demo stays minutes long."""


def _levels(servers: tuple[str, ...], by_env: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    """Per NeMo Gym server: the level it ran at under rollcut and why (declared, never guessed), and
    what the crash did to its rollouts, from the log (:class:`rollcut.replay.WorkByGroup`)."""
    out: dict[str, dict[str, Any]] = {}
    for s in servers:
        level, why = NEMO_GYM_DECLARED[s]
        n = by_env.get(s) or {}
        out[s] = {
            "level": level,
            "why": why,
            "rollouts": n.get("rollouts", 0),
            "rows": n.get("rows", 0),
            "continued": n.get("continued", 0),
            "started_over": n.get("started_over", 0),
            "divergences": n.get("divergences", 0),
            # a replayable server's session is rebuilt by its journaled calls; a stateless one is seeded
            "calls_replayed": n.get("revisions_rebuilt", 0) if level == "replayable" else 0,
            "model_calls_kept": n.get("model_calls_kept", 0),
            "tool_calls_kept": n.get("tool_calls_kept", 0),
            "model_calls_regenerated": n.get("regenerated", 0),
            "tool_calls_reexecuted": n.get("tool_calls_reexecuted", 0),
            "verdicts_from_log": n.get("verdicts_from_log", 0),
        }
    return out


def _served(engine: str | None, name: str | None, model: dict[str, Any], paced: bool) -> dict[str, Any]:
    """Which policy the rows come from: the backend, and on an engine, which engine serving which
    model (``name`` None: an engine started elsewhere, whose model the caller named to it); the
    local model's pace, said (None: as fast as it can)."""
    if engine is None:
        pace = GEMMA_ON_TWO_CORES.what if paced else None
        return {"backend": "local", "engine": None, "name": "rollcut-local", "pace": pace}
    return {"backend": "engine", "engine": engine, "name": name, "upstream": model["upstream"]}


def _baseline(first: Phase, copy: Path, every_s: float | None) -> BaselineCut:
    """Where the last-checkpoint way recovers from on its copy of the crash."""
    assert first.crash is not None
    if every_s is None:
        every_s, why = default_interval(first.episodes)
    else:
        why = "--baseline-every"
    crashed_at = first.started_at + first.crash.at_s
    return baseline_cut(copy / "ledger", first.started_at, crashed_at, every_s, why)


def _fresh(home: Path) -> Path:
    """A demo works in a home of its own: one a collection already used would answer its rollouts
    from the old run (their ids are the same), so it is refused, naming a way out."""
    if any((home / name).exists() for name in (*_COPIED, "rollouts.jsonl")):
        raise ConfigError(f"{home} already holds a collection; give the demo a new --home (or none)")
    return private_dir(home)


def _copy_at_crash(root: Path, where: Path) -> Path:
    """The collection as the crash left it (every process stopped), copied to ``where``: its stream,
    ledger, token store and rows. Logs stay behind; the copy writes its own."""
    private_dir(where.parent)
    private_dir(where)
    for name in _COPIED:
        shutil.copytree(root / name, where / name, ignore=shutil.ignore_patterns("*.log", "ports"))
    for p in root.glob("rollouts.jsonl*"):
        shutil.copy2(p, where / p.name)
    return where


def agent_options(agent: str) -> dict[str, Any]:
    """The agent server's options for ``agent``: the Simple Agent, or the reference opaque agent
    behind the relay, declared replayable (it is: deterministic, every side effect over HTTP)."""
    if agent == "simple":
        return {}
    if agent != "opaque":
        raise ConfigError(f"unknown agent {agent!r}; have: simple, opaque")
    from ..gym.opaque import REFERENCE_AGENT, Isolation

    isolated = Isolation.available()
    if not isolated:
        print("bubblewrap cannot run here: the opaque agent's program runs --unisolated", file=sys.stderr)

    return {
        "agent": "opaque",
        "command": shlex.join([sys.executable, str(REFERENCE_AGENT)]),
        "capability": "replayable_egress",
        "unisolated": not isolated,
    }


def _cost(done: Phase, before: Phase, generated: Generated) -> dict[str, Any]:
    """What finishing after the crash cost one way (work done again, work kept, the time it took),
    and how that run went (``bench e2e`` reports it per way)."""
    c = done.counts
    ids = [json.loads(r)["rollout_id"] for r in done.rows.read_text().splitlines() if r.strip()]
    ms, pause = before.checkpoint_ms + done.checkpoint_ms, before.pause_ms + done.pause_ms
    return {
        "model_calls_regenerated": c["regenerated"],
        "model_calls_regenerated_while_continuing": c["regenerated_continuing"],
        "tokens_regenerated": c["tokens_regenerated"],
        "tool_calls_reexecuted": c["tool_calls_reexecuted"],
        "model_calls_kept": c["model_calls_kept"],
        "tokens_kept": c["tokens_kept"],
        "tool_calls_kept": c["tool_calls_kept"],
        "model_calls_generated": c["generated"],
        "exchanges_replayed": c["exchanges_replayed"],
        "divergences": c["divergences"],
        "after_crash_s": done.finished_s,  # to the last row: the demo's counting after it is not the way's
        "after_crash_wall_s": done.wall_s,
        "wall_s": round(before.wall_s + done.wall_s, 2),
        "results_written": len(set(ids)),
        "duplicate_results": len(ids) - len(set(ids)),
        "recovery": done.summary.recovery,
        "checkpoints_published": done.checkpoints,
        "checkpoint_ms_p50": percentile(ms, 50),
        "checkpoint_ms_p99": percentile(ms, 99),
        "checkpoint_pause_ms_p50": percentile(pause, 50),
        "checkpoint_pause_ms_p99": percentile(pause, 99),
        "checkpoint_pause_breakdown": {
            "before_crash": before.summary.checkpoint_pause_breakdown,
            "after_crash": done.summary.checkpoint_pause_breakdown,
        },
        "peak_rss_mb": {k: max(before.peak.get(k, 0.0), v) for k, v in done.peak.items()},
        "engine": generated.figures,
        # the model's own count (None: an engine rollcut did not start); seconds follow these
        "tokens_generated_after_crash": generated.after_crash,
        "tokens_lost_in_flight": (generated.figures or {}).get("tokens_wasted"),
        "home": str(done.home),
    }
