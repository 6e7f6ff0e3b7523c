"""``rollcut bench e2e``: the demo's workload, one crash (or several) recovered each way, or its
throughput against the same stack without custody; its options refused together before anything
starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ._bench import bench_app, measure, pick
from ._target import JsonOpt, fail
from ._workload import (
    BENCH_ROLLOUTS,
    AgentOpt,
    BenchRolloutsOpt,
    ModelOpt,
    SeedOpt,
    refuse_workload,
    rollouts_of,
)

__all__ = ["bench_e2e_cmd"]


@bench_app.command("e2e")
def bench_e2e_cmd(
    rollouts: BenchRolloutsOpt = None,
    seed: SeedOpt = 0,
    workers: Annotated[
        int | None, typer.Option(help="Worker processes of every server (default: the demo's).")
    ] = None,
    mixed: Annotated[
        bool, typer.Option("--mixed", help="Every bundled environment, not the demo's three.")
    ] = False,
    way: Annotated[
        list[str] | None,
        typer.Option(
            help="A way to run (repeatable): rollcut, last_checkpoint, restart (the crash's recoveries); "
            "with --no-crash rollcut and plain (the same stack without custody)."
        ),
    ] = None,
    every: Annotated[float, typer.Option("--every", help="Seconds between periodic checkpoints.")] = 0.5,
    concurrency: Annotated[int, typer.Option(help="Rollouts running at once.")] = 16,
    engine: Annotated[
        str | None,
        typer.Option(
            "--engine",
            help="llama.cpp: the policy model is llama.cpp's server on a tiny model (`rollcut engine "
            "build`), and the excluded way (cuts off) runs too.",
        ),
    ] = None,
    agent: AgentOpt = "simple",
    intervals: Annotated[
        str,
        typer.Option(
            "--intervals",
            help="Comma-separated seconds: the same crash recovered the last-checkpoint way at each "
            "checkpoint interval too (a curve per way; `rollcut report --home H` draws it).",
        ),
    ] = "",
    home: Annotated[
        Path | None,
        typer.Option("--home", help="Keep the run (rows, logs, stream, demo.json) in this new directory."),
    ] = None,
    crash: Annotated[
        bool,
        typer.Option(
            "--crash/--no-crash",
            help="--no-crash: throughput instead, rollcut's collection against the plain stack (vs_plain).",
        ),
    ] = True,
    repeat: Annotated[
        int,
        typer.Option(
            min=1,
            help="Crashes (seeds S, S+1, ...: rollcut's seconds to finish over restart's, median and "
            "range), or with --no-crash runs of each way (medians).",
        ),
    ] = 1,
    paced: Annotated[
        bool,
        typer.Option(
            "--paced",
            help="The local model decodes at Gemma 3 270M's measured pace on two cores (rollcut demo's "
            "default), so the seconds to finish follow the tokens; with --no-crash, the plain stack's "
            "model too.",
        ),
    ] = False,
    model: ModelOpt = "tiny",
    as_json: JsonOpt = False,
) -> None:
    """One crash, recovered three ways: rollcut, last checkpoint only, restart from input; or, with
    --no-crash, the collection's throughput against the same stack without custody."""
    from ..bench import THROUGHPUT_WAYS, WAYS

    if engine not in (None, "llama.cpp"):
        raise fail(f"--engine {engine!r}: llama.cpp (the one rollcut can start here)")
    refuse_workload(engine=engine, agent=agent, model=model)
    known = WAYS if crash else THROUGHPUT_WAYS
    ways = tuple(way or ([w for w in known if engine or w != "excluded"]))
    unknown = [w for w in ways if w not in known]
    if unknown:
        what = "recovery" if crash else "way without a crash"
        raise fail(f"unknown {what} {', '.join(unknown)}; have: {', '.join(known)}")
    if engine is None and "excluded" in ways:
        raise fail("--way excluded compares generation cuts on an engine: add --engine llama.cpp")
    if "plain" in ways and agent != "simple":
        raise fail("--way plain runs the Simple Agent: drop --agent opaque")
    if paced and engine is not None:
        raise fail("--paced paces the local model: drop --engine")
    rollouts = rollouts_of(rollouts, model, local=BENCH_ROLLOUTS)
    if not crash and (intervals or home):
        raise fail("--no-crash measures throughput: --intervals and --home belong to a crash")
    try:
        every_of = tuple(float(s) for s in intervals.split(",") if s.strip())
    except ValueError:
        raise fail(f"--intervals {intervals!r}: comma-separated seconds, such as 0.5,2,8,32") from None
    if any(not 0 < s < 1e6 for s in every_of):
        raise fail("--intervals: each interval is a number of seconds above 0")
    passed = pick(locals(), "rollouts seed workers mixed concurrency engine agent crash repeat paced")
    status = (
        f"{len(ways) + len(every_of)} recoveries of {rollouts} rollouts"
        if crash
        else f"{', '.join(ways)}: {repeat} collection(s) of {rollouts} rollouts each"
    )
    measure(
        "bench_e2e",
        status,
        as_json,
        ways=ways,
        checkpoint_every_s=every,
        intervals=every_of,
        home=home.absolute() if home else None,
        engine_model=model,
        **passed,
    )
