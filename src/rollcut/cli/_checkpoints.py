"""Checkpoint commands: ``checkpoint``, ``checkpoints list|show|verify``, ``restore``, ``resume``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from ..ledger import CheckpointRecord
    from ..participants import CheckpointResult, Restorer

from ._target import JsonOpt, Opened, Target, app, console, fail, print_json, report, run, targeted

__all__ = ["checkpoints_app"]

checkpoints_app = typer.Typer(no_args_is_help=True, help="Published checkpoints: list, show, verify.")
app.add_typer(checkpoints_app, name="checkpoints")

CheckpointOpt = Annotated[str, typer.Option("--checkpoint", help="The published checkpoint to restore.")]


def _record_dict(rec: CheckpointRecord) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(rec)
    return out


def _restorer(o: Opened) -> Restorer:
    from ..participants import Coordinator, Restorer

    return Restorer(o.log, o.ledger, Coordinator(o.log, o.ledger, o.tokens), instance="cli")


@app.command("checkpoint")
@targeted("url", "replicas", "home", "namespace", "credentials", "ledger", "tokens")
def checkpoint_cmd(
    target: Target,
    deadline: Annotated[
        float, typer.Option("--deadline", help="Seconds until the checkpoint must publish.")
    ] = 30.0,
    as_json: JsonOpt = False,
) -> None:
    """Take a checkpoint of whatever is running on the bus, and print its record."""

    from ..participants import Coordinator

    async def go() -> CheckpointResult:
        async with target.opened("coordinator") as o:
            return await Coordinator(o.log, o.ledger, o.tokens).checkpoint(deadline_s=deadline)

    res = run(go())
    out = {
        **_record_dict(res.record),
        "phases_ms": res.phases_ms,
        "validated_events": res.validated_events,
        "unreproducible": res.unreproducible,
        "resumed": res.resumed,
        "pause_ms": res.pause_ms,
        "publish_ms": res.publish_ms,
    }
    if as_json:
        print_json(out)
    else:
        console.print(
            f"published [bold]{res.record.checkpoint_id}[/bold] at cut {res.record.cut} "
            f"with {len(res.participants)} participants: paused {res.pause_ms:.1f} ms, "
            f"published {res.publish_ms:.1f} ms after the seal"
        )


@checkpoints_app.command("list")
@targeted("home", "ledger")
def checkpoints_list(target: Target, as_json: JsonOpt = False) -> None:
    """Published checkpoints, oldest first."""
    with target.ledger(readonly=True) as led:
        recs = led.checkpoints()
    if as_json:
        print_json([_record_dict(r) for r in recs])
        return
    table = Table("checkpoint", "cut", "participants", "token snapshot", title="published checkpoints")
    for r in recs:
        table.add_row(r.checkpoint_id, str(r.cut), ",".join(r.participants), r.token_snapshot_id)
    Console().print(table)


@checkpoints_app.command("show")
@targeted("home", "ledger")
def checkpoints_show(checkpoint_id: str, target: Target, as_json: JsonOpt = False) -> None:
    """One checkpoint record."""
    with target.ledger(readonly=True) as led:
        rec = led.checkpoint(checkpoint_id)
    if rec is None:
        raise fail(f"no published checkpoint {checkpoint_id}", 1)
    if as_json:
        print_json(_record_dict(rec))
    else:
        for k, v in _record_dict(rec).items():
            Console().print(f"{k:>24}: {v}")


@checkpoints_app.command("verify")
@targeted("url", "replicas", "home", "namespace", "credentials", "ledger", "tokens")
def checkpoints_verify(checkpoint_id: str, target: Target, as_json: JsonOpt = False) -> None:
    """Re-validate digests and references against the stream and token store; exit 1 on any mismatch.
    A bad record of one rollout or lane is reported as a quarantine (that rollout starts over; the
    lane's record is skipped), not as a failure of the checkpoint."""
    from ..ledger import VerifyReport, verify_report

    async def go() -> VerifyReport:
        async with target.opened() as o:
            return await verify_report(o.log, o.ledger, o.tokens, checkpoint_id)

    report = run(go())
    problems = report.problems
    if as_json:
        out: dict[str, Any] = {"checkpoint_id": checkpoint_id, "ok": not problems, "problems": problems}
        print_json({**out, "quarantined": report.quarantined} if report.quarantined else out)
    else:
        for p in problems:
            console.print(f"[red]x[/red] {p}")
        for key, why in report.quarantined.items():
            console.print(f"[yellow]quarantined[/yellow] {key}: {why}")
        if not problems:
            console.print(f"[green]ok[/green] {checkpoint_id} verifies")
    if problems:
        raise typer.Exit(1)


@app.command("compact")
@targeted("url", "replicas", "home", "namespace", "credentials", "ledger", "tokens")
def compact_cmd(
    target: Target,
    keep: Annotated[int, typer.Option("--keep", min=1, help="Newest checkpoints to keep restorable.")] = 2,
    keep_tokens: Annotated[
        bool,
        typer.Option(
            "--keep-tokens",
            help="Keep the compacted rollouts' token records (an opaque agent's rows name receipts only).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Let go of what no kept checkpoint needs: the event history of rollouts accepted below the oldest
    of the --keep newest checkpoints, older checkpoints, old markers (docs/cluster.md), the sandbox
    blobs no tree left on the stream needs (docs/sandboxes.md), and the compacted rollouts' token
    records unless --keep-tokens (docs/performance.md). For a namespace whose collection is not running:
    a collection compacts itself ('compaction: keep: N')."""
    from ..ledger import Projector, compact

    async def go() -> dict[str, Any]:
        if keep_tokens:
            async with target.log() as log:
                with target.ledger() as led:
                    await Projector(led, log).catch_up()
                    rep = await compact(log, led, keep=keep)
        else:
            async with target.opened() as o:
                await Projector(o.ledger, o.log).catch_up()
                rep = await compact(o.log, o.ledger, keep=keep, tokens=o.tokens)
        return {k: v for k, v in rep.__dict__.items() if k != "dropped"}

    report("rollcut compact", run(go()), as_json)


@app.command("restore")
@targeted("url", "replicas", "home", "namespace", "credentials", "ledger", "tokens")
def restore_cmd(checkpoint: CheckpointOpt, target: Target, as_json: JsonOpt = False) -> None:
    """Plan recovery from a checkpoint, open the next attempts, rebuild every participant's
    sessions at its cut, and leave them paused (then `rollcut resume`)."""

    async def go() -> dict[str, Any]:
        async with target.opened() as o:
            restorer = _restorer(o)
            plan = await restorer.plan(checkpoint_id=checkpoint)
            await restorer.open_attempts(plan)
            restored = await restorer.restore(checkpoint, plan.cut)
            return {
                "checkpoint_id": checkpoint,
                "cut": plan.cut,
                "completed": plan.completed,
                "continue": plan.continue_,
                "fresh_dispatch": plan.fresh_dispatch,
                "retired": plan.retired,
                "quarantined": plan.quarantined,
                "participants_paused": restored,
            }

    out = run(go())
    if as_json:
        print_json(out)
    else:
        console.print(
            f"restored {checkpoint} at cut {out['cut']}: {len(out['continue'])} continue, "
            f"{len(out['fresh_dispatch'])} fresh, {len(out['completed'])} completed; "
            f"{len(out['participants_paused'])} participants paused until `rollcut resume`"
        )


@app.command("resume")
@targeted("url", "replicas", "home", "namespace", "credentials", "ledger", "tokens")
def resume_cmd(
    checkpoint: Annotated[
        str, typer.Option("--checkpoint", help="The checkpoint a restore paused everyone for.")
    ],
    target: Target,
    as_json: JsonOpt = False,
) -> None:
    """Release every participant a restore left paused."""

    async def go() -> list[str]:
        async with target.opened() as o:
            return await _restorer(o).resume(checkpoint)

    released = run(go())
    if as_json:
        print_json({"checkpoint_id": checkpoint, "resumed": released})
    else:
        console.print(f"resumed {len(released)} participants")
