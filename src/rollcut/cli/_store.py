"""Commands on the stored log: ``nats``, ``ledger rebuild|status``, ``replay``, ``retire``."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from .._errors import RollcutError

if TYPE_CHECKING:
    from ..replay import ReplayResult
from ._target import JsonOpt, NsOpt, Target, app, console, fail, print_json, progress_bar, run, targeted

__all__ = ["ledger_app"]

ledger_app = typer.Typer(no_args_is_help=True, help="The LMDB ledger: status and rebuild from the stream.")
app.add_typer(ledger_app, name="ledger")


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
    cluster: Annotated[
        int,
        typer.Option(
            "--cluster",
            min=1,
            help="Run this many clustered nodes (client ports from --port up; 3 for replicated streams).",
        ),
    ] = 1,
) -> None:
    """Run nats-server with JetStream in the foreground, with per-role credentials: one server, or a
    cluster of --cluster N on this host (their URLs, comma-separated, are what --url takes)."""
    from .._home import credentials_for
    from ..bus import EmbeddedCluster, EmbeddedServer

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server: EmbeddedServer | EmbeddedCluster
    try:
        creds = None if no_auth else credentials_for(data, namespace or "default")
        if cluster > 1:
            if host not in ("127.0.0.1", "localhost"):
                raise fail("--cluster runs its nodes on loopback; across hosts use docker/compose.yaml")
            server = EmbeddedCluster(
                data, size=cluster, credentials=creds, sync_interval=sync, base_port=port
            )
            server.start()
            version = server.nodes[0].version
        else:
            server = EmbeddedServer(data, host=host, port=port, sync_interval=sync, credentials=creds).start()
            version = server.version
    except RollcutError as exc:
        raise fail(str(exc)) from exc
    console.print(
        f"nats-server {'.'.join(map(str, version or ()))} with JetStream on {server.url} (data {data})"
        + ("" if no_auth else f"; role credentials in {data / 'credentials.json'}")
    )
    sys.stdout.write(server.url + "\n")
    sys.stdout.flush()
    try:
        stop.wait()
    finally:
        server.stop()


@app.command("cluster-config")
def cluster_config(
    hosts: Annotated[
        str,
        typer.Option("--hosts", help="The nodes' host names, comma-separated (nats-1,nats-2,nats-3)."),
    ],
    out: Annotated[Path, typer.Option("--out", help="Where the configs and credentials go.")] = Path("conf"),
    namespace: NsOpt = "default",
    sync: Annotated[str | None, typer.Option(help="JetStream sync_interval, e.g. 'always' or '2m'.")] = None,
    store_dir: Annotated[str, typer.Option("--store-dir", help="JetStream data directory on each node.")] = (
        "/data/jetstream"
    ),
) -> None:
    """Write a NATS cluster's node configs ('<host>.conf'), its layout and the role credentials, for
    nodes on separate hosts (docker/compose.yaml). Run again, it keeps the credentials and the route
    password it made the first time, so a node can be replaced without the others."""
    from .._files import write_private
    from .._home import credentials_for
    from ..bus import PARTICIPANT_ROLES, ClusterLayout, node_config, role_file

    names = [h.strip() for h in hosts.split(",") if h.strip()]
    if not names:
        raise fail("--hosts names no host")
    try:
        creds = credentials_for(out, namespace or "default")
        path = out / "cluster.json"
        layout = ClusterLayout.load(path) if path.exists() else ClusterLayout.named(names)
        if [n.name for n in layout.nodes] != names:
            raise fail(f"{path} was made for hosts {[n.name for n in layout.nodes]}, not {names}")
        layout.save(path)
        for i, name in enumerate(names):
            text = node_config(
                layout, i, store_dir=store_dir, credentials=creds, sync_interval=sync, listen_host="0.0.0.0"
            )
            write_private(out / f"{name}.conf", text.encode())
        for role in PARTICIPANT_ROLES:  # each Gym server is given its own role's file, no other's
            role_file(out / "credentials.json", role)
    except RollcutError as exc:
        raise fail(str(exc)) from exc
    console.print(
        f"wrote {len(names)} node configs, cluster.json, credentials.json and a credentials file per "
        f"Gym server role to {out}"
    )
    sys.stdout.write(layout.urls + "\n")


@ledger_app.command("rebuild")
@targeted("url", "replicas", "home", "namespace", "credentials", "ledger")
def ledger_rebuild(target: Target, as_json: JsonOpt = False) -> None:
    """Rebuild the ledger from the stream alone; the old one is kept beside it."""
    from ..ledger import rebuild_ledger

    path = target.ledger_path

    async def go() -> dict[str, Any]:
        async with target.log() as log:
            last = await log.last_seq()
            with progress_bar(disable=as_json) as prog:
                task = prog.add_task("rebuilding ledger", total=last)
                n, kept = await rebuild_ledger(
                    log, path, on_page=lambda seq, end: prog.update(task, completed=seq)
                )
        with target.ledger(readonly=True) as led:
            return {
                "ledger": str(path),
                "events": n,
                "watermark": led.watermark,
                "rollouts": sum(1 for _ in led.rollouts()),
                "checkpoints": len(led.checkpoints()),
                "previous_kept_at": str(kept) if kept else None,
            }

    out = run(go())
    if as_json:
        print_json(out)
    else:
        console.print(
            f"rebuilt {out['ledger']} from {out['events']} events: {out['rollouts']} rollouts, "
            f"{out['checkpoints']} checkpoints"
            + (f"; previous ledger kept at {out['previous_kept_at']}" if out["previous_kept_at"] else "")
        )


@ledger_app.command("status")
@targeted("url", "replicas", "home", "namespace", "credentials", "ledger")
def ledger_status(
    target: Target,
    catch_up: Annotated[bool, typer.Option(help="Project new events first.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Show the ledger's watermark and per-rollout index."""
    from ..ledger import Projector

    async def go() -> dict[str, Any]:
        with target.ledger() as led:
            if catch_up:
                async with target.log() as log:
                    await Projector(led, log).catch_up()
            return {
                "ledger": str(target.ledger_path),
                "watermark": led.watermark,
                "rollouts": [msgspec.to_builtins(r) for r in led.rollouts()],
                "checkpoints": [msgspec.to_builtins(c) for c in led.checkpoints()],
            }

    out = run(go())
    if as_json:
        print_json(out)
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
@targeted("url", "replicas", "home", "namespace", "credentials", "ledger")
def replay_cmd(
    target: Target,
    up_to: Annotated[
        int | None, typer.Option("--up-to", help="Cut: last stream sequence to include.")
    ] = None,
    rollout: Annotated[str | None, typer.Option("--rollout", help="Only this rollout.")] = None,
    checkpoint: Annotated[
        str | None, typer.Option("--checkpoint", help="Replay up to this published checkpoint's cut.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Rebuild session state from the log as of a checkpoint or a stream sequence."""
    from ..replay import replay

    if checkpoint is not None:
        with target.ledger(readonly=True) as led:
            rec = led.checkpoint(checkpoint)
        if rec is None:
            raise fail(f"no published checkpoint {checkpoint}", 1)
        up_to = rec.cut

    async def go() -> ReplayResult:
        async with target.log() as log:
            return await replay(log, up_to=up_to, rollout_id=rollout)

    res = run(go())
    if as_json:
        print_json(
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


@app.command("retire")
@targeted("url", "replicas", "home", "namespace", "credentials")
def retire_cmd(
    target: Target,
    rollout: Annotated[str, typer.Argument(help="The rollout to give up for good.")],
    reason: Annotated[str, typer.Option("--reason", help="Why; kept on the log and in its row.")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Retire a rollout: its attempt is fenced off, every server drops it, no attempt opens again,
    and the collection writes its row as 'retired'."""

    async def go() -> dict[str, Any]:
        async with target.log("collector") as log:
            state = await log.retire(rollout, instance="cli", reason=reason)
            return {"rollout_id": rollout, "attempt": state.attempt, "retired_seq": state.seq}

    out = run(go())
    if as_json:
        print_json(out)
    else:
        console.print(f"retired {rollout} (attempt {out['attempt']}) at seq {out['retired_seq']}")
