"""``rollcut report``: a collection home as one HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from ._target import JsonOpt, Target, app, console, fail, print_json, run, targeted

__all__ = ["report_cmd"]


_MAX_DEMO_JSON = 16 << 20


def _demo_json(path: Path) -> dict[str, Any] | None:
    """The demo's (or ``bench e2e --home``'s) own summary beside the collection, if there is one: it
    holds the interval comparison the page draws. One that cannot be read is named and left out."""
    if not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_DEMO_JSON + 1)
        if len(raw) > _MAX_DEMO_JSON:
            raise ValueError(f"over {_MAX_DEMO_JSON} bytes")
        out = msgspec.json.decode(raw)
    except (OSError, ValueError, msgspec.DecodeError) as exc:
        console.print(f"[yellow]{path} left out of the page: {exc}[/yellow]")
        return None
    return out if isinstance(out, dict) else None


@app.command("report")
@targeted("url", "home", "namespace", "credentials", "ledger")
def report_cmd(
    target: Target,
    out: Annotated[
        Path | None, typer.Option("--out", help="Where to write the page (default: HOME/report.html).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a self-contained HTML page of a collection (one file, no network): a timeline of every
    rollout's attempts with the checkpoint cuts and the crashes, how each rollout ended up, checkpoint
    durations, and the work kept across crashes."""
    from ..report import write_report

    if target.url is None and not (target.home / "nats").is_dir():
        raise fail(
            f"no collection in {target.home} (no {target.home / 'nats'}): give --home of one, or --url"
        )
    page = (out or target.home / "report.html").absolute()
    if not page.parent.is_dir():
        raise fail(f"--out {page}: {page.parent} is not a directory")

    demo = _demo_json(target.home / "demo.json")

    async def go() -> dict[str, Any]:
        async with target.log() as log:
            with target.ledger(readonly=True) as ledger:
                return await write_report(log, ledger, page, str(target.home.absolute()), demo)

    shown = run(go())
    if as_json:
        print_json(shown)
        return
    c = shown["classes"]
    console.print(
        f"{shown['rollouts']} rollouts, {shown['attempts']} attempts, {shown['crashes']} crashes, "
        f"{shown['checkpoints']} checkpoints; {c['continued']} continued, {c['started over']} started over"
    )
    typer.echo(str(page))
