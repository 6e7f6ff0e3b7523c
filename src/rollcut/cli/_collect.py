"""The main job: ``collect``, and ``export`` of what it wrote."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .._files import write_private

if TYPE_CHECKING:
    from ..collect import Summary

from ._target import ExitCode, JsonOpt, Target, app, console, fail, print_json, progress_bar, run, targeted

__all__ = ["collect_cmd"]


@app.command("collect")
def collect_cmd(
    config: Annotated[Path, typer.Argument(help="Collection config (YAML).")],
    resume: Annotated[
        bool, typer.Option("--resume", help="Recover from the latest checkpoint, then finish.")
    ] = False,
    replicas: Annotated[
        int | None,
        typer.Option(
            "--replicas", envvar="ROLLCUT_REPLICAS", min=1, help="Copies of the stream (default: config)."
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            envvar="ROLLCUT_METRICS_PORT",
            min=0,
            max=65535,
            help="Serve /metrics (Prometheus) and /rollcut/stats (rollcut top) here; 0: a free port.",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="The address --metrics-port binds.")
    ] = "127.0.0.1",
    as_json: JsonOpt = False,
) -> None:
    """Collect rollouts with checkpoints; exits 75 after a checkpoint on SIGTERM (requeue me)."""
    from .._tracing import configure
    from ..collect import Collector, CollectorHooks, load_config, read_rows, serve_metrics, summary_dict

    configure("rollcut-collector")  # spans exported if OTEL_EXPORTER_OTLP_ENDPOINT asks

    async def go() -> Summary:
        cfg, base = load_config(config)
        # streamed into the collection's on-disk index: a million tasks need not be in memory
        numbered, lines = itertools.tee(read_rows(cfg.path(cfg.tasks, base)))
        home = cfg.path(cfg.home, base)
        target = Target(
            url=cfg.nats_url,
            home=home,
            namespace=cfg.namespace,
            credentials=cfg.path(cfg.credentials, base) if cfg.credentials else None,
            ledger_dir=cfg.path(cfg.ledger, base) if cfg.ledger else None,
            tokens_dir=cfg.path(cfg.tokens, base) if cfg.tokens else None,
            replicas=replicas or cfg.replicas,
        )
        async with target.opened() as o:
            with progress_bar(disable=as_json) as prog:
                bar = prog.add_task("collecting", total=None)

                def progress(summary: Summary, total: int, running: int) -> None:
                    prog.update(
                        bar,
                        completed=summary.results_written,
                        description=f"collecting: {running} running, recovered "
                        f"{summary.recovery['continue']} continued / {summary.recovery['fresh_dispatch']} "
                        f"restarted, last checkpoint {summary.last_checkpoint or '-'}",
                    )

                col = Collector(
                    o.log,
                    o.ledger,
                    o.tokens,
                    cfg,  # a config is the collector's options and where things are
                    tasks=(row for _, row in numbered),
                    task_lines=(n for n, _ in lines),
                    output=cfg.path(cfg.output, base),
                    hooks=CollectorHooks(progress=progress),
                )
                prog.update(bar, total=len(col.rows.inputs))
                col.install_signals()
                if metrics_port is None:
                    return await col.run(resume=resume)
                async with serve_metrics(col.metrics, metrics_host, metrics_port, home):
                    return await col.run(resume=resume)

    summary = run(go())
    if as_json:
        print_json(summary_dict(summary))
    else:
        console.print(
            f"collected {summary.results_written}/{summary.rollouts} rollouts; "
            f"{summary.checkpoints_published} checkpoints; recovery {summary.recovery}; "
            f"healed {summary.healed}"
        )
    raise typer.Exit(collect_exit(summary))


def collect_exit(summary: Summary) -> int:
    """The collection's exit code (see ``ExitCode``), saying why on stderr when it is not 0."""
    if summary.bus_outage is not None:
        fail(f"stopped: {summary.bus_outage}; requeue the job, it goes on with --resume once the bus is back")
        return ExitCode.REQUEUE
    if summary.interrupted:
        if summary.requeue_checkpoint is None:
            fail(
                "stopped by SIGTERM, but no checkpoint published "
                f"({summary.failed.get('checkpoint', 'unknown')}); resume will start from the last one"
            )
            return ExitCode.STORAGE
        return ExitCode.REQUEUE
    unwritten = sorted(set(summary.pending) | set(summary.gave_up))
    if unwritten:
        shown = ", ".join(f"{r} ({summary.failed.get(r, 'no row')})" for r in unwritten[:20])
        more = f" and {len(unwritten) - 20} more" if len(unwritten) > 20 else ""
        fail(f"{len(unwritten)} rollouts failed for good or have no row: {shown}{more}")
        return ExitCode.ROLLOUTS_FAILED
    return ExitCode.OK


@app.command("export")
@targeted("home", "tokens")
def export_cmd(
    rows: Annotated[
        Path, typer.Argument(help="A collection's rows (NeMo Gym's format, or rollcut's naming receipts).")
    ],
    target: Target,
    out: Annotated[Path, typer.Option("--out", help="Where to write the training data.")],
    fmt: Annotated[
        str, typer.Option("--format", help="jsonl (one turn a line) or npz (padded arrays).")
    ] = "jsonl",
    as_json: JsonOpt = False,
) -> None:
    """Turn a collection's rows into per-turn token ids, masks and log-probs for a trainer, checking every
    array against its receipt in the token store; exit 1 naming the first row that does not match."""
    from ..collect import ExportError, padded, read_turns
    from ..tokens import LocalTokenStore

    if fmt not in ("jsonl", "npz"):
        raise fail(f"--format {fmt!r}: use jsonl or npz")
    with LocalTokenStore(target.tokens_path) as store:
        try:
            turns = list(read_turns(rows, store))
        except ExportError as exc:
            raise fail(str(exc), 1) from exc
    if fmt == "jsonl":
        data = "".join(json.dumps(t.as_dict()) + "\n" for t in turns).encode()
    else:
        import numpy as np

        buf = io.BytesIO()
        arrays: dict[str, Any] = padded(turns)
        np.savez(buf, **arrays)
        data = buf.getvalue()
        out = out if out.name.endswith(".npz") else out.with_name(out.name + ".npz")  # as numpy names it
    try:  # 0600, atomically; a symlink at --out is replaced, never followed
        write_private(out, data)
    except OSError as exc:
        raise fail(f"cannot write {out}: {exc.strerror or exc}", ExitCode.STORAGE) from exc
    summary = {
        "rows": str(rows),
        "out": str(out),
        "format": fmt,
        "turns": len(turns),
        "rollouts": len({t.rollout_id for t in turns}),
        "tokens": sum(len(t.input_ids) for t in turns),
    }
    if as_json:
        print_json(summary)
    else:
        console.print(f"exported {summary['turns']} turns of {summary['rollouts']} rollouts to {out}")
