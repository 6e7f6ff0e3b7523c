"""``rollcut bench``: each benchmark against its raw baseline, measured in the same run."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import typer

from ._target import ExitCode, JsonOpt, UrlOpt, app, console, fail, report, run

__all__ = ["bench_app", "measure", "pick"]

bench_app = typer.Typer(
    no_args_is_help=True, help="Benchmarks against raw baselines, measured in the same run."
)
app.add_typer(bench_app, name="bench")


def measure(name: str, status: str, as_json: bool, **options: Any) -> dict[str, Any]:
    """Run the benchmark ``rollcut.bench.<name>`` under a spinner (``bench_log``: ``rollcut bench log``);
    its figures, as printed."""
    from .. import bench

    fn: Callable[..., Coroutine[Any, Any, dict[str, Any]]] = getattr(bench, name)
    with console.status(status, spinner="dots"):
        out = run(fn(**options))
    report("rollcut " + name.replace("_", " "), out, as_json)
    return out


def soak_exit(out: dict[str, Any]) -> int:
    """A soak's exit code (the README's table), saying why on stderr when it is not 0: its figures are
    printed either way (they show where it stopped), but only a soak that wrote every row exits 0."""
    if out["bus_outage"]:
        fail(f"the bus stopped answering after {out['written']}/{out['rollouts']} rows: {out['bus_outage']}")
        return ExitCode.STORAGE
    if out["unwritten"]:  # the rollouts without a row, and those out of attempts: as ``collect`` counts them
        shown = "; ".join(f"{k}: {v}" for k, v in list(out["failed"].items())[:5])
        fail(f"{out['unwritten']} rollouts without a row ({shown or 'no failure said'})")
        return ExitCode.ROLLOUTS_FAILED
    return ExitCode.OK


REPEAT = 3
"""How many times a bench measures each case by default: a median and a spread need three."""
RepeatOpt = Annotated[
    int,
    typer.Option(
        min=1,
        help="Times each case is measured, each beside its baseline where it has one; medians and spreads "
        "are over them.",
    ),
]


def pick(given: dict[str, Any], names: str) -> dict[str, Any]:
    """The flags ``names`` (space-separated) of a command's ``locals()``, passed on as they are."""
    return {n: given[n] for n in names.split()}


@bench_app.command("log")
def bench_log_cmd(
    events: Annotated[int, typer.Option(help="Events to append and replay.")] = 20_000,
    concurrency: Annotated[
        int, typer.Option(help="Concurrent writers, for rollcut and the raw baseline alike.")
    ] = 1024,
    repeat: RepeatOpt = REPEAT,
    url: UrlOpt = None,
    replicas: Annotated[
        list[int] | None,
        typer.Option(
            "--replicas",
            min=1,
            help="Durability axis: also measure streams with this many replicas, each on a cluster of as "
            "many nodes started for the run (repeatable; R1 is always measured beside them).",
        ),
    ] = None,
    sync: Annotated[
        list[str] | None,
        typer.Option(
            "--sync",
            help="Durability axis: JetStream sync_interval of the servers, 'default' or e.g. 'always' "
            "(repeatable).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Append and replay rate against plain nats-py on the same server, same run; with --replicas
    or --sync, the append cost of each durability mode side by side instead."""
    if replicas or sync:
        if url:
            raise fail("--replicas/--sync start their own servers; leave out --url")
        status = f"benchmarking durability modes: {events} events at concurrency {concurrency}"
        measure(
            "bench_durability",
            status,
            as_json,
            events=events,
            concurrency=concurrency,
            replicas=replicas or [1],
            syncs=sync or ["default"],
            repeat=repeat,
        )
        return
    status = f"benchmarking {events} events at concurrency {concurrency}"
    measure("bench_log", status, as_json, events=events, concurrency=concurrency, url=url, repeat=repeat)


@bench_app.command("checkpoint")
def bench_checkpoint_cmd(
    rollouts: Annotated[int, typer.Option(help="Active rollouts, each with a history.")] = 10_000,
    moved: Annotated[
        list[int] | None,
        typer.Option(help="Percent of the rollouts moved since the last checkpoint (repeatable; 1 and 100)."),
    ] = None,
    repeat: RepeatOpt = REPEAT,
    baseline: Annotated[
        list[str] | None, typer.Option(help="A baseline to run: nemo, per_file (repeatable; default both).")
    ] = None,
    url: UrlOpt = None,
    cluster: Annotated[
        int, typer.Option(help="Run on this many nats-server nodes started for it (3: stream at R3).")
    ] = 1,
    as_json: JsonOpt = False,
) -> None:
    """Pause and publication time of a checkpoint, cold and with rollouts moved, against the NeMo-style
    and per-file designs on the same state."""
    from ..bench import BASELINES

    pcts = tuple(moved or (1, 100))
    kinds = tuple(baseline or BASELINES)
    if any(not 0 < p <= 100 for p in pcts) or not set(kinds) <= set(BASELINES):
        raise fail(f"--moved takes percents in 1..100, --baseline one of {BASELINES}")
    status = f"benchmarking checkpoints of {rollouts} rollouts"
    passed = pick(locals(), "rollouts url repeat cluster")
    measure("bench_checkpoint", status, as_json, moved=pcts, baselines=kinds, **passed)


@bench_app.command("model")
def bench_model_cmd(
    calls: Annotated[
        int | None,
        typer.Option(help="Calls per run (default 600; engine: 64), each its own rollout unless --turns."),
    ] = None,
    clients: Annotated[
        list[int] | None,
        typer.Option(help="Concurrent clients (repeatable; default 1, 8 and 64; engine: 1 and 8)."),
    ] = None,
    repeat: RepeatOpt = REPEAT,
    turns: Annotated[
        int,
        typer.Option(
            help="local: calls per rollout, one after another as a multi-turn agent makes them (1: every "
            "call its own rollout, which pays a new rollout's reads on every call)."
        ),
    ] = 1,
    backend: Annotated[
        str,
        typer.Option(
            help="local: custody against the same server without it; engine: against calling llama.cpp's "
            "server directly, and tokens regenerated after a crash with cuts and without."
        ),
    ] = "local",
    tracing: Annotated[
        bool,
        typer.Option(
            "--tracing",
            help="Also the model server exporting every span over OTLP/HTTP (to a sink in this process): "
            "tracing's cost, as its ratio to the server without.",
        ),
    ] = False,
    logprobs: Annotated[
        bool,
        typer.Option(
            "--logprobs",
            help="engine: every call asks for log-probs, of llama.cpp directly and of rollcut (whose "
            "token texts come from the engine's detokenizer).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Throughput and latency of the model server with custody against the same server without."""
    engine = backend == "engine"
    if backend not in ("local", "engine"):
        raise fail(f"--backend {backend!r}: local or engine")
    n = calls or (64 if engine else 600)
    counts = tuple(clients or ((1, 8) if engine else (1, 8, 64)))
    if any(c < 1 for c in counts) or n < 1 or turns < 1:
        raise fail("--calls, --clients and --turns take positive numbers")
    if turns > 1 and engine:
        raise fail("--turns measures the local backend's server: drop --backend engine")
    if tracing and engine:
        raise fail("--tracing measures the local backend's server (an engine's own time would hide it)")
    if logprobs and not engine:
        raise fail("--logprobs measures them on an engine: add --backend engine")
    status = f"benchmarking {n} model calls per run at {', '.join(map(str, counts))} clients"
    measure(
        "bench_model_engine" if engine else "bench_model",
        status,
        as_json,
        calls=n,
        clients=counts,
        repeat=repeat,
        **({"tracing": True} if tracing else {}),
        **({"turns": turns} if turns > 1 else {}),
        **({"logprobs": True} if logprobs else {}),
    )


@bench_app.command("relay")
def bench_relay_cmd(
    calls: Annotated[
        int, typer.Option(help="Model calls through the relay (and as many direct) per repeat.")
    ] = 100,
    repeat: RepeatOpt = REPEAT,
    as_json: JsonOpt = False,
) -> None:
    """What the opaque agent's journaling relay costs a model call, live and replaying, against the
    model server called directly in the same run."""
    measure("bench_relay", f"timing {calls * repeat * 4} model calls", as_json, calls=calls, repeat=repeat)


@bench_app.command("nemo-gym")
def bench_nemo_gym_cmd(
    calls: Annotated[int, typer.Option(help="Tool calls per session before the cut.")] = 50,
    repeat: RepeatOpt = REPEAT,
    as_json: JsonOpt = False,
) -> None:
    """A NeMo Gym session continued by replaying its journal on a fresh upstream session (its own
    stateful counter, unmodified), against rollcut's port of it restored by its codec, per call."""
    status = f"restoring {2 * repeat} sessions of {calls} calls"
    measure("bench_nemo_gym", status, as_json, calls=calls, repeat=repeat)


@bench_app.command("workers")
def bench_workers_cmd(
    rollouts: Annotated[int, typer.Option(help="Sessions per server and repeat.")] = 20,
    calls: Annotated[int, typer.Option(help="Tool calls per session, each over a fresh connection.")] = 25,
    repeat: RepeatOpt = REPEAT,
    as_json: JsonOpt = False,
) -> None:
    """What routing a call to the worker that holds its rollout costs, against one worker."""
    status = f"benchmarking {rollouts * calls * repeat} tool calls on one and two workers"
    measure("bench_workers", status, as_json, rollouts=rollouts, calls=calls, repeat=repeat)


@bench_app.command("sandbox")
def bench_sandbox_cmd(
    files: Annotated[int, typer.Option(help="Files in the task's tree.")] = 500,
    size: Annotated[int, typer.Option(help="Bytes per file (text, as source code compresses).")] = 2048,
    changed: Annotated[
        list[float] | None,
        typer.Option(
            help="Percent of each session's files changed before the second checkpoint (repeatable)."
        ),
    ] = None,
    sessions: Annotated[int, typer.Option(help="Sessions seeded from the same task tree.")] = 8,
    repeat: RepeatOpt = REPEAT,
    as_json: JsonOpt = False,
) -> None:
    """A sandbox's checkpoints as manifests over shared blobs in JetStream's object store, against
    one tar + zstd archive of the whole tree per session and checkpoint."""
    status = f"snapshotting {sessions} sandboxes of {files} files, {repeat} times"
    passed = pick(locals(), "files size sessions repeat")
    measure("bench_sandbox", status, as_json, changed=tuple(changed or (1.0, 100.0)), **passed)


@bench_app.command("train")
def bench_train_cmd(
    steps: Annotated[int, typer.Option(help="Optimizer steps per run.")] = 8,
    repeat: RepeatOpt = REPEAT,
    generations: Annotated[int, typer.Option(help="Completions per prompt (a GRPO group) and per step.")] = 8,
    crash: Annotated[
        bool,
        typer.Option(
            help="Also what a crash mid-step costs the trainer: rollcut against restarting the step."
        ),
    ] = False,
    max_staleness: Annotated[
        int,
        typer.Option(
            "--max-staleness",
            help="Also rollcut's loop collecting this many steps ahead while the trainer trains (0: not).",
        ),
    ] = 0,
    completion_tokens: Annotated[
        int, typer.Option("--completion-tokens", help="Tokens each completion may have.")
    ] = 16,
    as_json: JsonOpt = False,
) -> None:
    """TRL's GRPOTrainer on rollcut's rollouts against TRL's own generation path, same tiny policy
    (needs the 'trl' extra and the engine)."""
    status = f"training {steps} steps each way, {repeat} times"
    passed = pick(locals(), "steps repeat generations crash max_staleness completion_tokens")
    measure("bench_train", status, as_json, **passed)


@bench_app.command("soak")
def bench_soak_cmd(
    rollouts: Annotated[int, typer.Option(help="Rollouts to collect.")] = 10_000,
    cluster: Annotated[int, typer.Option(help="nats-server nodes (3: a cluster, stream at R3; 1: R1).")] = 3,
    concurrency: Annotated[int, typer.Option(help="Rollouts in flight.")] = 64,
    keep: Annotated[int, typer.Option(help="Checkpoints kept restorable (0: no compaction).")] = 2,
    every: Annotated[float, typer.Option("--every", help="Seconds between checkpoints.")] = 2.0,
    sample: Annotated[float, typer.Option("--sample", help="Seconds between samples.")] = 10.0,
    instant: Annotated[
        bool,
        typer.Option(
            help="Through an environment that finishes every rollout at once, distinct tasks streamed: "
            "the collector's own memory and rate (a million rollouts in minutes)."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """A long collection with compaction: stream bytes, disk and memory over time, against what the
    stream would hold without compaction (measured in the same run)."""
    status = f"soaking {rollouts} rollouts on {cluster} node(s)"
    out = measure(
        "bench_soak",
        status,
        as_json,
        rollouts=rollouts,
        cluster=cluster,
        concurrency=concurrency,
        keep=keep,
        checkpoint_every_s=every,
        sample_s=sample,
        instant=instant,
    )
    raise typer.Exit(soak_exit(out))


@bench_app.command("chaos")
def bench_chaos_cmd(
    trials: Annotated[int, typer.Option(help="Short collections, one random fault each.")] = 10,
    rollouts: Annotated[int, typer.Option(help="Rollouts per collection.")] = 8,
    seed: Annotated[int, typer.Option(help="Draws the faults, their moments and each trial's seed.")] = 0,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            "--fault", help="Only these fault kinds (repeatable); default: every one possible here."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Random faults (node and leader kills, an agent worker killed, and as root: the leader or a follower
    cut off, an asymmetric split, the collector's host cut off, every link lossy and slow) over many
    short collections on a three-node cluster; invariant violations per fault kind. Exits 1 if any
    invariant was violated."""
    from ..bench import FAULTS, bench_chaos

    unknown = sorted(set(fault or ()) - set(FAULTS))
    if unknown:
        raise fail(f"--fault {', '.join(unknown)}: the kinds are {', '.join(FAULTS)}")
    # a SIGTERM unwinds like an exception: the trial in progress removes its hosts and processes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with console.status(f"{trials} trials of random faults", spinner="dots"):
        out = bench_chaos(trials=trials, rollouts=rollouts, seed=seed, faults=tuple(fault or FAULTS))
    report("rollcut bench chaos", out, as_json)
    if out["violations"]:
        raise typer.Exit(1)
