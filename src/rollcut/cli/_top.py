"""``rollcut top``: a running collection at a glance, refreshed in the terminal.

It reads what ``rollcut collect --metrics-port`` serves (the collector's
``/rollcut/stats``, found through ``<home>/metrics.json`` or given with
``--url``), and asks each server given with ``--server`` (and the
environment the collector runs against) for its health and its workers.
Nothing is read from the bus or the ledger: top is safe to run beside a
collection, as often as one likes, from any host that reaches the ports.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ._target import ExitCode, JsonOpt, app, fail, print_json

__all__ = ["sample", "top_cmd"]


def _collector_url(config: Path | None, url: str | None) -> str:
    if url:
        return url.rstrip("/")
    from ..collect import METRICS_FILE, load_config

    if config is None:
        raise fail("give the collection's config (its home has the collector's URL) or --url", ExitCode.USAGE)
    cfg, base = load_config(config)
    path = cfg.path(cfg.home, base) / METRICS_FILE
    try:
        return str(json.loads(path.read_text())["url"]).rstrip("/")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise fail(
            f"no running collection serves metrics for {config} ({path}: {exc}); "
            "start it with `rollcut collect --metrics-port 0`, or give --url",
            ExitCode.USAGE,
        ) from exc


def _server(client: httpx.Client, url: str) -> dict[str, Any]:
    """One server's health (its deep ``/healthz``) and its workers (from ``/rollcut/stats``)."""
    out: dict[str, Any] = {"url": url, "healthy": False, "workers": []}
    try:
        out["healthy"] = client.get(f"{url}/healthz", timeout=5).status_code == 200
        stats = client.get(f"{url}/rollcut/stats", timeout=5).json()
    except (httpx.HTTPError, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]
        return out
    each = stats.get("workers") if isinstance(stats, dict) else None
    for i, w in enumerate(each if isinstance(each, list) else [stats]):
        w = w if isinstance(w, dict) else {}
        out["workers"].append({"worker": i, "instance": w.get("instance"), "up": "down" not in w})
    return out


def sample(url: str, servers: list[str], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """One look at the collection: what ``--once --json`` prints. ``previous`` (the last sample of a
    live view) makes checkpoints per minute the rate since then instead of since the start."""
    with httpx.Client() as client:
        stats = client.get(f"{url}/rollcut/stats", timeout=5).raise_for_status().json()
        env = stats.get("environment_url")
        looked = [_server(client, u.rstrip("/")) for u in ([env] if env else []) + servers]
    now = time.time()
    published = int(stats["checkpoints_published"])
    since, before = (
        (previous["at"], previous["checkpoints"]["published"]) if previous else (stats["started"], 0)
    )
    minutes = max(now - since, 1e-9) / 60
    return {
        "at": now,
        "collector": url,
        "namespace": stats["namespace"],
        "rollouts": {"total": stats["rollouts"], **stats["states"]},
        "checkpoints": {
            "published": published,
            "failed": stats["checkpoints_failed"],
            "per_minute": round((published - before) / minutes, 2),
            "last": stats["last_checkpoint"],
            "last_pause_ms": None
            if stats["last_pause_s"] is None
            else round(stats["last_pause_s"] * 1000, 1),
            "participants": stats["participants"],
        },
        "recovery": stats["recovery"],
        "bus": {"up": stats["bus_outage"] is None, "outage": stats["bus_outage"]},
        "lease_held": stats["lease_held"],
        "servers": looked,
        "errors": {"total": stats["failures_total"], "recent": stats["failures"]},
    }


def _text(value: object, style: str = "") -> Text:
    """Untrusted text (a rollout's error is a sandboxed program's stderr, a URL is the operator's) as
    text: never read as markup, every control character shown escaped, so it can neither break the
    view (``[/red]``) nor drive the terminal (an OSC title, a cursor move)."""
    raw = str(value)
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in raw)
    return Text(shown, style=style)


def _view(s: dict[str, Any]) -> Group:
    head = Table(title=_text(f"rollcut top: {s['namespace']} at {s['collector']}"), show_header=False)
    r, c = s["rollouts"], s["checkpoints"]
    head.add_row("rollouts", _text(" · ".join(f"{k} {v}" for k, v in r.items())))
    head.add_row(
        "checkpoints",
        _text(
            f"{c['published']} published ({c['per_minute']}/min), {c['failed']} failed; "
            f"last {c['last'] or '-'}, "
            f"pause {c['last_pause_ms'] if c['last_pause_ms'] is not None else '-'} ms, "
            f"{c['participants']} participants"
        ),
    )
    head.add_row("recovery", _text(" · ".join(f"{k} {v}" for k, v in s["recovery"].items())))
    head.add_row("bus", _text("up") if s["bus"]["up"] else _text(f"down: {s['bus']['outage']}", "red"))
    servers = Table("server", "health", "workers")
    for srv in s["servers"]:
        up = sum(w["up"] for w in srv["workers"])
        health = _text("ok", "green") if srv["healthy"] else _text(srv.get("error", "unhealthy"), "red")
        servers.add_row(_text(srv["url"]), health, f"{up}/{len(srv['workers'])} up")
    errors = Table("rollout", "last error", title=f"errors: {s['errors']['total']}")
    for rid, why in list(s["errors"]["recent"].items())[-10:]:
        errors.add_row(_text(rid), _text(why))
    return Group(head, servers, errors)


@app.command("top")
def top_cmd(
    config: Annotated[
        Path | None, typer.Argument(help="The collection's config (its home names the collector's URL).")
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="The collector's --metrics-port URL, instead of a config.")
    ] = None,
    server: Annotated[
        list[str] | None, typer.Option("--server", help="Another server to show (repeat the option).")
    ] = None,
    every: Annotated[float, typer.Option("--every", min=0.2, help="Seconds between refreshes.")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="One sample, then exit.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """A live view of a running collection: rollouts by state, checkpoints per minute and the last
    pause, servers and their workers, errors. --once --json prints one sample."""
    base = _collector_url(config, url)
    servers = server or []
    try:
        current = sample(base, servers)
        if once:
            if as_json:
                print_json(current)
            else:
                Console().print(_view(current))
            return
        with Live(_view(current), refresh_per_second=4) as live:
            while True:
                time.sleep(every)
                current = sample(base, servers, current)
                live.update(_view(current))
    except httpx.HTTPError as exc:
        raise fail(f"the collector at {base} did not answer: {exc}", ExitCode.STORAGE) from exc
    except KeyboardInterrupt:
        return
