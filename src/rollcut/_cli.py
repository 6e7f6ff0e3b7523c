"""The ``rollcut`` command line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ._errors import RollcutError
from ._runtime import default_home, open_log

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Crash-safe partial-rollout checkpointing."
)
ledger_app = typer.Typer(no_args_is_help=True, help="The LMDB ledger: status and rebuild from the stream.")
bench_app = typer.Typer(
    no_args_is_help=True, help="Benchmarks against raw baselines, measured in the same run."
)
app.add_typer(ledger_app, name="ledger")
app.add_typer(bench_app, name="bench")

console = Console(stderr=True)

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", envvar="ROLLCUT_URL", help="NATS URL; omitted: the embedded server under --home."),
]
HomeOpt = Annotated[
    Path | None, typer.Option("--home", envvar="ROLLCUT_HOME", help="Data directory (default ./.rollcut).")
]
NsOpt = Annotated[str, typer.Option("--namespace", "-n", envvar="ROLLCUT_NAMESPACE", help="Event namespace.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
CredsOpt = Annotated[
    Path | None,
    typer.Option("--credentials", envvar="ROLLCUT_CREDENTIALS", help="Role credentials file for --url."),
]
LedgerOpt = Annotated[Path | None, typer.Option("--ledger", help="Ledger directory (default HOME/ledger).")]
TokensOpt = Annotated[
    Path | None, typer.Option("--tokens", help="Token store directory (default HOME/tokens).")
]


def _print_json(obj: Any) -> None:
    sys.stdout.write(msgspec.json.encode(obj).decode() + "\n")


@asynccontextmanager
async def _opened(
    url: str | None,
    home: Path,
    namespace: str,
    credentials: Path | None,
    ledger: Path | None,
    tokens: Path | None,
    *,
    role: str = "admin",
) -> AsyncIterator[tuple[Any, Any, Any]]:
    """The bus, the ledger and the token store a control command works on."""
    from .ledger import Ledger
    from .tokens import LocalTokenStore

    async with open_log(url, home=home, namespace=namespace, role=role, credentials=credentials) as log:
        with Ledger(ledger or home / "ledger") as led, LocalTokenStore(tokens or home / "tokens") as tk:
            yield log, led, tk


def _run(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except RollcutError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


@app.command()
def nats(
    data: Annotated[Path, typer.Option("--data", help="JetStream data directory.")] = Path(".rollcut/nats"),
    port: Annotated[int, typer.Option(help="Client port; 0 picks a free one.")] = 4222,
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    sync: Annotated[str | None, typer.Option(help="JetStream sync_interval, e.g. 'always' or '2m'.")] = None,
    namespace: NsOpt = "default",
    no_auth: Annotated[
        bool, typer.Option("--no-auth", help="Accept unauthenticated clients (dev only).")
    ] = False,
) -> None:
    """Run the embedded nats-server with JetStream in the foreground, with per-role credentials."""
    from ._runtime import credentials_for
    from .bus import EmbeddedServer

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        creds = None if no_auth else credentials_for(data, namespace)
        server = EmbeddedServer(data, host=host, port=port, sync_interval=sync, credentials=creds).start()
    except RollcutError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    console.print(
        f"nats-server {'.'.join(map(str, server.version or ()))} with JetStream on {server.url} (data {data})"
        + ("" if no_auth else f"; role credentials in {data / 'credentials.json'}")
    )
    sys.stdout.write(server.url + "\n")
    sys.stdout.flush()
    try:
        stop.wait()
    finally:
        server.stop()


@ledger_app.command("rebuild")
def ledger_rebuild(
    url: UrlOpt = None,
    home: HomeOpt = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rebuild the ledger from the stream alone; the old one is kept beside it."""
    from .ledger import Ledger, rebuild_ledger

    home = home or default_home()
    path = ledger or home / "ledger"

    async def go() -> dict[str, Any]:
        async with open_log(url, home=home, namespace=namespace, credentials=credentials) as log:
            last = await log.last_seq()
            with Progress(
                TextColumn("rebuilding ledger"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                disable=as_json,
            ) as prog:
                task = prog.add_task("rebuild", total=last)
                n, kept = await rebuild_ledger(
                    log, path, on_page=lambda seq, end: prog.update(task, completed=seq)
                )
        with Ledger(path, readonly=True) as led:
            return {
                "ledger": str(path),
                "events": n,
                "watermark": led.watermark,
                "rollouts": sum(1 for _ in led.rollouts()),
                "checkpoints": len(led.checkpoints()),
                "previous_kept_at": str(kept) if kept else None,
            }

    out = _run(go())
    if as_json:
        _print_json(out)
    else:
        console.print(
            f"rebuilt {out['ledger']} from {out['events']} events: {out['rollouts']} rollouts, "
            f"{out['checkpoints']} checkpoints"
            + (f"; previous ledger kept at {out['previous_kept_at']}" if out["previous_kept_at"] else "")
        )


@ledger_app.command("status")
def ledger_status(
    url: UrlOpt = None,
    home: HomeOpt = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    ledger: LedgerOpt = None,
    catch_up: Annotated[bool, typer.Option(help="Project new events first.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Show the ledger's watermark and per-rollout index."""
    from .ledger import Ledger, Projector

    home = home or default_home()
    path = ledger or home / "ledger"

    async def go() -> dict[str, Any]:
        with Ledger(path) as led:
            if catch_up:
                async with open_log(url, home=home, namespace=namespace, credentials=credentials) as log:
                    await Projector(led, log).catch_up()
            return {
                "ledger": str(path),
                "watermark": led.watermark,
                "rollouts": [msgspec.to_builtins(r) for r in led.rollouts()],
                "checkpoints": [msgspec.to_builtins(c) for c in led.checkpoints()],
            }

    out = _run(go())
    if as_json:
        _print_json(out)
        return
    table = Table(
        "rollout",
        "attempt",
        "status",
        "dispatch",
        "boundary",
        "accepted",
        title=f"ledger at seq {out['watermark']}",
    )
    for r in out["rollouts"]:
        table.add_row(
            r["rollout_id"],
            str(r["current_attempt"]),
            r["status"],
            str(r["dispatch_seq"]),
            str(r["last_boundary_seq"] or "-"),
            str(r["accepted_seq"] or "-"),
        )
    Console().print(table)


@app.command("replay")
def replay_cmd(
    url: UrlOpt = None,
    home: HomeOpt = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    up_to: Annotated[
        int | None, typer.Option("--up-to", help="Cut: last stream sequence to include.")
    ] = None,
    rollout: Annotated[str | None, typer.Option("--rollout", help="Only this rollout.")] = None,
    checkpoint: Annotated[
        str | None, typer.Option("--checkpoint", help="Replay up to this published checkpoint's cut.")
    ] = None,
    ledger: LedgerOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Rebuild session state from the log as of a checkpoint or a stream sequence."""
    from .ledger import Ledger
    from .replay import replay

    home = home or default_home()
    if checkpoint is not None:
        with Ledger(ledger or home / "ledger", readonly=True) as led:
            rec = led.checkpoint(checkpoint)
        if rec is None:
            console.print(f"[red]error:[/red] no published checkpoint {checkpoint}")
            raise typer.Exit(1)
        up_to = rec.cut

    async def go() -> Any:
        async with open_log(url, home=home, namespace=namespace, credentials=credentials) as log:
            return await replay(log, up_to=up_to, rollout_id=rollout)

    res = _run(go())
    if as_json:
        _print_json(
            {
                "cut": res.cut,
                "events": res.events,
                "rollouts": {k: msgspec.to_builtins(v) for k, v in res.rollouts.items()},
            }
        )
        return
    table = Table("rollout", "attempt", "status", "events", title=f"state at seq {res.cut}")
    for rid, st in sorted(res.rollouts.items()):
        table.add_row(
            rid, str(st.current_attempt), st.status, str(sum(a.events for a in st.attempts.values()))
        )
    Console().print(table)


serve_app = typer.Typer(no_args_is_help=True, help="Run the Gym servers (policy model, …) as participants.")
app.add_typer(serve_app, name="serve")


@serve_app.command("model")
def serve_model(
    url: Annotated[
        str | None, typer.Option("--url", envvar="ROLLCUT_URL", help="NATS URL of the bus.")
    ] = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    tokens: Annotated[Path, typer.Option("--tokens", help="Token store directory.")] = Path(
        ".rollcut/tokens"
    ),
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port; 0 picks a free one.")] = 8000,
    name: Annotated[str, typer.Option(help="Participant group name.")] = "model",
    workers: Annotated[int, typer.Option(help="Worker processes, each its own participant.")] = 1,
    backend: Annotated[str, typer.Option(help="Generation backend: local | openai.")] = "local",
    upstream: Annotated[str, typer.Option(help="openai backend: the upstream's base URL.")] = "",
    seed: Annotated[int, typer.Option(help="Seed of the local backend.")] = 0,
    token_delay: Annotated[float, typer.Option("--token-delay", help="Seconds per generated token.")] = 0.0,
    tool_turns: Annotated[int, typer.Option("--tool-turns", help="Tool calls before a final answer.")] = 3,
    worker_index: Annotated[int | None, typer.Option(hidden=True)] = None,
    listen_fd: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """The OpenAI-compatible policy model server with durable call custody."""
    from .gym.model._serve import ModelServeOptions, run_model_server

    if not url:
        console.print(
            "[red]error:[/red] serve model needs the bus: --url or ROLLCUT_URL (see `rollcut nats`)"
        )
        raise typer.Exit(2)
    if backend not in ("local", "openai") or (backend == "openai" and not upstream):
        console.print(f"[red]error:[/red] backend {backend!r}: use local, or openai with --upstream URL")
        raise typer.Exit(2)
    opts = ModelServeOptions(
        url=url,
        namespace=namespace,
        tokens=tokens,
        credentials=credentials,
        host=host,
        port=port,
        name=name,
        workers=workers,
        seed=seed,
        token_delay_s=token_delay,
        tool_turns=tool_turns,
        backend=backend,
        upstream=upstream,
    )
    try:
        run_model_server(opts, worker_index=worker_index, listen_fd=listen_fd)
    except RollcutError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


def _serve(
    kind: str,
    argv: list[str],
    opts: Any,
    host: str,
    port: int,
    worker_index: int | None,
    listen_fd: int | None,
) -> None:
    from .gym import _runners
    from .gym._serving import run_servers

    if not opts.url:
        console.print(
            f"[red]error:[/red] serve {kind} needs the bus: --url or ROLLCUT_URL (see `rollcut nats`)"
        )
        raise typer.Exit(2)
    body = {
        "resources": _runners.serve_resources,
        "agent": _runners.serve_agent,
        "environment": _runners.serve_environment,
    }[kind]
    run_servers(
        host=host,
        port=port,
        workers=opts.workers,
        child_argv=[sys.executable, "-m", "rollcut._cli", "serve", *argv],
        serve_one=lambda sock, i: body(opts, sock, i),
        worker_index=worker_index,
        listen_fd=listen_fd,
    )


_BusUrl = Annotated[str | None, typer.Option("--url", envvar="ROLLCUT_URL", help="NATS URL of the bus.")]
_Host = Annotated[str, typer.Option(help="Listen address.")]
_Port = Annotated[int, typer.Option(help="Listen port; 0 picks a free one.")]
_Workers = Annotated[int, typer.Option(help="Worker processes, each its own participant.")]
_Hidden = Annotated[int | None, typer.Option(hidden=True)]


@serve_app.command("resources")
def serve_resources_cmd(
    name: Annotated[
        str, typer.Argument(help="Environment: counter, blackjack, workplace, math, scratchpad.")
    ],
    url: _BusUrl = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    host: _Host = "127.0.0.1",
    port: _Port = 0,
    workers: _Workers = 1,
    worker_index: _Hidden = None,
    listen_fd: _Hidden = None,
) -> None:
    """A stateful resources (tool) server whose sessions restore exactly."""
    from .gym._runners import ServeOptions
    from .gym.resources import ENVIRONMENTS

    if name not in ENVIRONMENTS:
        console.print(f"[red]error:[/red] unknown environment {name!r}; have: {', '.join(ENVIRONMENTS)}")
        raise typer.Exit(2)
    opts = ServeOptions(
        url=url or "", namespace=namespace, credentials=credentials, name=name, workers=workers
    )
    argv = [
        "resources",
        name,
        "--url",
        opts.url,
        "--namespace",
        namespace,
        "--workers",
        str(workers),
        *(["--credentials", str(credentials)] if credentials else []),
    ]
    _serve("resources", argv, opts, host, port, worker_index, listen_fd)


@serve_app.command("agent")
def serve_agent_cmd(
    kind: Annotated[str, typer.Argument(help="Agent: simple.")],
    model: Annotated[str, typer.Option(help="Policy model server base URL.")],
    resources: Annotated[list[str], typer.Option(help="ENV=URL of a resources server (repeatable).")],
    url: _BusUrl = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    host: _Host = "127.0.0.1",
    port: _Port = 0,
    workers: _Workers = 1,
    name: str = "agent",
    worker_index: _Hidden = None,
    listen_fd: _Hidden = None,
) -> None:
    """The Simple Agent: /run with boundaries, parking and continuation."""
    from .gym._runners import ServeOptions

    if kind != "simple":
        console.print(f"[red]error:[/red] unknown agent {kind!r}; have: simple")
        raise typer.Exit(2)
    envs = dict(r.split("=", 1) for r in resources)
    opts = ServeOptions(
        url=url or "",
        namespace=namespace,
        credentials=credentials,
        name=name,
        workers=workers,
        model=model,
        resources=envs,
    )
    argv = [
        "agent",
        kind,
        "--model",
        model,
        *[a for r in resources for a in ("--resources", r)],
        "--url",
        opts.url,
        "--namespace",
        namespace,
        "--workers",
        str(workers),
        "--name",
        name,
        *(["--credentials", str(credentials)] if credentials else []),
    ]
    _serve("agent", argv, opts, host, port, worker_index, listen_fd)


@serve_app.command("environment")
def serve_environment_cmd(
    agent: Annotated[str, typer.Option(help="Agent server base URL.")],
    url: _BusUrl = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    host: _Host = "127.0.0.1",
    port: _Port = 0,
    workers: _Workers = 1,
    name: str = "environment",
    worker_index: _Hidden = None,
    listen_fd: _Hidden = None,
) -> None:
    """The episode orchestrator: one /run per task, recording each episode's completion."""
    from .gym._runners import ServeOptions

    opts = ServeOptions(
        url=url or "", namespace=namespace, credentials=credentials, name=name, workers=workers, agent=agent
    )
    argv = [
        "environment",
        "--agent",
        agent,
        "--url",
        opts.url,
        "--namespace",
        namespace,
        "--workers",
        str(workers),
        "--name",
        name,
        *(["--credentials", str(credentials)] if credentials else []),
    ]
    _serve("environment", argv, opts, host, port, worker_index, listen_fd)


@app.command("demo")
def demo_cmd(
    rollouts: Annotated[int, typer.Option(help="Rollouts to collect (bundled tasks).")] = 64,
    seed: Annotated[int, typer.Option(help="Seed of the task set and the local model.")] = 0,
    no_crash: Annotated[
        bool, typer.Option("--no-crash", help="Do not kill the Gym processes mid-run.")
    ] = False,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The main job: collect with checkpoints, SIGKILL every Gym process mid-run, resume, report."""
    from .collect import run_demo

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=as_json,
    ) as prog:
        task = prog.add_task("collecting", total=rollouts)

        def progress(summary: Any, total: int, running: int) -> None:
            prog.update(
                task,
                completed=summary.results_written,
                description=f"collecting ({running} running, {summary.checkpoints_published} checkpoints)",
            )

        out = _run(run_demo(rollouts=rollouts, seed=seed, crash=not no_crash, home=home, progress=progress))
    if as_json:
        _print_json(out)
        return
    table = Table("", "", title="rollcut demo: what was saved")
    for k, v in out.items():
        table.add_row(k, json.dumps(v) if isinstance(v, dict) else str(v))
    Console().print(table)


@app.command("collect")
def collect_cmd(
    config: Annotated[Path, typer.Argument(help="Collection config (YAML).")],
    resume: Annotated[
        bool, typer.Option("--resume", help="Recover from the latest checkpoint, then finish.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Collect rollouts with checkpoints; exits 75 after a checkpoint on SIGTERM (requeue me)."""
    from .collect import Collector, load_config
    from .collect._collector import EXIT_REQUEUE, summary_dict
    from .ledger import Ledger
    from .tokens import LocalTokenStore

    try:
        cfg, base = load_config(config)
    except RollcutError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    home = cfg.path(cfg.home, base)
    tasks = [json.loads(line) for line in cfg.path(cfg.tasks, base).read_text().splitlines() if line.strip()]

    async def go() -> Any:
        creds = cfg.path(cfg.credentials, base) if cfg.credentials else None
        async with open_log(cfg.nats_url, home=home, namespace=cfg.namespace, credentials=creds) as log:
            with (
                Ledger(cfg.path(cfg.ledger, base) if cfg.ledger else home / "ledger") as led,
                LocalTokenStore(cfg.path(cfg.tokens, base) if cfg.tokens else home / "tokens") as tk,
                Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=console,
                    disable=as_json,
                ) as prog,
            ):
                bar = prog.add_task("collecting", total=len(tasks) * cfg.num_repeats)

                def progress(summary: Any, total: int, running: int) -> None:
                    prog.update(
                        bar,
                        completed=summary.results_written,
                        description=f"collecting: {running} running, recovered "
                        f"{summary.recovery['continue']} continued / {summary.recovery['fresh_dispatch']} "
                        f"restarted, last checkpoint {summary.last_checkpoint or '-'}",
                    )

                col = Collector(
                    log,
                    led,
                    tk,
                    environment_url=cfg.environment_url,
                    tasks=tasks,
                    output=cfg.path(cfg.output, base),
                    num_repeats=cfg.num_repeats,
                    concurrency=cfg.concurrency,
                    max_attempts=cfg.max_attempts,
                    checkpoint_every_s=cfg.checkpoint.every_s,
                    checkpoint_deadline_s=cfg.checkpoint.deadline_s,
                    on_progress=progress,
                )
                col.install_signals(
                    on_sigusr1=cfg.checkpoint.on_sigusr1, on_sigterm=cfg.checkpoint.on_sigterm
                )
                return await col.run(resume=resume)

    summary = _run(go())
    if as_json:
        _print_json(summary_dict(summary))
    else:
        console.print(
            f"collected {summary.results_written}/{summary.rollouts} rollouts; "
            f"{summary.checkpoints_published} checkpoints; recovery {summary.recovery}; "
            f"healed {summary.healed}"
        )
    if summary.interrupted:
        raise typer.Exit(EXIT_REQUEUE)


def _collector_for(log: Any, led: Any, tk: Any) -> Any:
    from .collect import Collector

    return Collector(log, led, tk, environment_url="", tasks=[], output=Path(os.devnull))


@app.command("restore")
def restore_cmd(
    checkpoint: Annotated[str, typer.Option("--checkpoint", help="The published checkpoint to restore.")],
    url: UrlOpt = None,
    home: HomeOpt = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    ledger: LedgerOpt = None,
    tokens: TokensOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Plan recovery from a checkpoint, open the next attempts, rebuild every participant's
    sessions at its cut, and leave them paused (then `rollcut resume`)."""
    from .collect import plan_recovery

    home = home or default_home()

    async def go() -> dict[str, Any]:
        async with _opened(url, home, namespace, credentials, ledger, tokens) as (log, led, tk):
            plan = await plan_recovery(log, led, checkpoint_id=checkpoint)
            col = _collector_for(log, led, tk)
            await col.apply_plan(plan)
            restored = await col.restore_participants(checkpoint, plan.cut)
            return {
                "checkpoint_id": checkpoint,
                "cut": plan.cut,
                "completed": plan.completed,
                "continue": plan.continue_,
                "fresh_dispatch": plan.fresh_dispatch,
                "retired": plan.retired,
                "participants_paused": restored,
            }

    out = _run(go())
    if as_json:
        _print_json(out)
    else:
        console.print(
            f"restored {checkpoint} at cut {out['cut']}: {len(out['continue'])} continue, "
            f"{len(out['fresh_dispatch'])} fresh, {len(out['completed'])} completed; "
            f"{len(out['participants_paused'])} participants paused until `rollcut resume`"
        )


@app.command("retire")
def retire_cmd(
    rollout: Annotated[str, typer.Argument(help="The rollout to give up for good.")],
    reason: Annotated[str, typer.Option("--reason", help="Why; kept on the log and in its row.")] = "",
    url: UrlOpt = None,
    home: HomeOpt = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Retire a rollout: its attempt is fenced off, every server drops it, no attempt opens again,
    and the collection writes its row as ``retired``."""
    from ._runtime import open_log

    home = home or default_home()

    async def go() -> dict[str, Any]:
        async with open_log(
            url, home=home, namespace=namespace, role="collector", credentials=credentials
        ) as log:
            state = await log.retire(rollout, instance="cli", reason=reason)
            return {"rollout_id": rollout, "attempt": state.attempt, "retired_seq": state.seq}

    out = _run(go())
    if as_json:
        _print_json(out)
    else:
        console.print(f"retired {rollout} (attempt {out['attempt']}) at seq {out['retired_seq']}")


@app.command("resume")
def resume_cmd(
    checkpoint: Annotated[
        str, typer.Option("--checkpoint", help="The checkpoint a restore paused everyone for.")
    ],
    url: UrlOpt = None,
    home: HomeOpt = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    ledger: LedgerOpt = None,
    tokens: TokensOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Release every participant a restore left paused."""

    home = home or default_home()

    async def go() -> list[str]:
        async with _opened(url, home, namespace, credentials, ledger, tokens) as (log, led, tk):
            return await _collector_for(log, led, tk).resume_participants(checkpoint)

    released = _run(go())
    if as_json:
        _print_json({"checkpoint_id": checkpoint, "resumed": released})
    else:
        console.print(f"resumed {len(released)} participants")


checkpoints_app = typer.Typer(no_args_is_help=True, help="Published checkpoints: list, show, verify.")
app.add_typer(checkpoints_app, name="checkpoints")


def _record_dict(rec: Any) -> dict[str, Any]:
    return msgspec.to_builtins(rec)


@app.command("checkpoint")
def checkpoint_cmd(
    url: UrlOpt = None,
    home: HomeOpt = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    ledger: LedgerOpt = None,
    tokens: TokensOpt = None,
    deadline: Annotated[
        float, typer.Option("--deadline", help="Seconds until the checkpoint must publish.")
    ] = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """Take a checkpoint of whatever is running on the bus, and print its record."""
    from .participants import Coordinator

    home = home or default_home()

    async def go() -> Any:
        async with _opened(url, home, namespace, credentials, ledger, tokens, role="coordinator") as (
            log,
            led,
            tk,
        ):
            return await Coordinator(log, led, tk).checkpoint(deadline_s=deadline)

    res = _run(go())
    out = {
        **_record_dict(res.record),
        "phases_ms": res.phases_ms,
        "validated_events": res.validated_events,
        "unreproducible": res.unreproducible,
        "resumed": res.resumed,
    }
    if as_json:
        _print_json(out)
    else:
        to_publish = ("acquire", "discover", "prepare", "seal", "validate", "publish")
        ms = sum(res.phases_ms.get(k, 0.0) for k in to_publish)
        console.print(
            f"published [bold]{res.record.checkpoint_id}[/bold] at cut {res.record.cut} "
            f"with {len(res.participants)} participants in {ms:.1f} ms"
        )


@checkpoints_app.command("list")
def checkpoints_list(home: HomeOpt = None, ledger: LedgerOpt = None, as_json: JsonOpt = False) -> None:
    """Published checkpoints, oldest first."""
    from .ledger import Ledger

    with Ledger(ledger or (home or default_home()) / "ledger", readonly=True) as led:
        recs = led.checkpoints()
    if as_json:
        _print_json([_record_dict(r) for r in recs])
        return
    table = Table("checkpoint", "cut", "participants", "token snapshot", title="published checkpoints")
    for r in recs:
        table.add_row(r.checkpoint_id, str(r.cut), ",".join(r.participants), r.token_snapshot_id)
    Console().print(table)


@checkpoints_app.command("show")
def checkpoints_show(
    checkpoint_id: str, home: HomeOpt = None, ledger: LedgerOpt = None, as_json: JsonOpt = False
) -> None:
    """One checkpoint record."""
    from .ledger import Ledger

    with Ledger(ledger or (home or default_home()) / "ledger", readonly=True) as led:
        rec = led.checkpoint(checkpoint_id)
    if rec is None:
        console.print(f"[red]error:[/red] no published checkpoint {checkpoint_id}")
        raise typer.Exit(1)
    if as_json:
        _print_json(_record_dict(rec))
    else:
        for k, v in _record_dict(rec).items():
            Console().print(f"{k:>24}: {v}")


@checkpoints_app.command("verify")
def checkpoints_verify(
    checkpoint_id: str,
    url: UrlOpt = None,
    home: HomeOpt = None,
    namespace: NsOpt = "default",
    credentials: CredsOpt = None,
    ledger: LedgerOpt = None,
    tokens: TokensOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-validate digests and references against the stream and token store; exit 1 on any mismatch."""
    from .ledger import verify_checkpoint

    home = home or default_home()

    async def go() -> list[str]:
        async with _opened(url, home, namespace, credentials, ledger, tokens) as (log, led, tk):
            return await verify_checkpoint(log, led, tk, checkpoint_id)

    problems = _run(go())
    if as_json:
        _print_json({"checkpoint_id": checkpoint_id, "ok": not problems, "problems": problems})
    elif problems:
        for p in problems:
            console.print(f"[red]x[/red] {p}")
    else:
        console.print(f"[green]ok[/green] {checkpoint_id} verifies")
    if problems:
        raise typer.Exit(1)


def _report(title: str, status: str, coro: Any, as_json: bool) -> None:
    """Run one benchmark with a spinner; print its JSON object or a table."""
    with console.status(status, spinner="dots"):
        out = _run(coro)
    if as_json:
        _print_json(out)
        return
    table = Table("metric", "value", title=title)
    for k, v in out.items():
        table.add_row(k, str(v))
    Console().print(table)


@bench_app.command("log")
def bench_log_cmd(
    events: Annotated[int, typer.Option(help="Events to append and replay.")] = 20_000,
    concurrency: Annotated[
        int, typer.Option(help="Concurrent writers, for rollcut and the raw baseline alike.")
    ] = 1024,
    repeat: Annotated[int, typer.Option(help="Paired runs; medians are reported.")] = 3,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Append and replay rate against plain nats-py on the same server, same run."""
    from .bench import bench_log

    _report(
        "rollcut bench log",
        f"benchmarking {events} events at concurrency {concurrency}",
        bench_log(events=events, concurrency=concurrency, url=url, repeat=repeat),
        as_json,
    )


@bench_app.command("checkpoint")
def bench_checkpoint_cmd(
    rollouts: Annotated[int, typer.Option(help="Active rollouts, each with a history.")] = 10_000,
    url: UrlOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Checkpoint time and files against a per-rollout-file checkpoint of the same state."""
    from .bench import bench_checkpoint

    _report(
        "rollcut bench checkpoint",
        f"benchmarking a checkpoint of {rollouts} rollouts",
        bench_checkpoint(rollouts=rollouts, url=url),
        as_json,
    )


@bench_app.command("model")
def bench_model_cmd(
    calls: Annotated[int, typer.Option(help="Sequential calls, each its own rollout.")] = 1000,
    as_json: JsonOpt = False,
) -> None:
    """Latency that durable custody adds to a model call (p50/p99)."""
    from .bench import bench_model

    _report("rollcut bench model", f"benchmarking {calls} model calls", bench_model(calls=calls), as_json)


@bench_app.command("e2e")
def bench_e2e_cmd(
    rollouts: Annotated[int, typer.Option(help="Rollouts of the demo workload.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed of the task set and the local model.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """One crash, recovered three ways: rollcut, last checkpoint only, restart from input."""
    from .bench import bench_e2e

    _report(
        "rollcut bench e2e",
        f"three recoveries of {rollouts} rollouts",
        bench_e2e(rollouts=rollouts, seed=seed),
        as_json,
    )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
