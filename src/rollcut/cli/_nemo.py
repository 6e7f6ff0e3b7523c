"""``rollcut nemo-gym``: NeMo Gym installed once, and what level each of its servers runs at here."""

from __future__ import annotations

import typer
from rich.table import Table

from ._target import JsonOpt, app, console, fail, print_json

__all__ = ["nemo_app"]

nemo_app = typer.Typer(no_args_is_help=True, help="NeMo Gym's own servers under rollcut.")
app.add_typer(nemo_app, name="nemo-gym")


@nemo_app.command("install")
def nemo_install(as_json: JsonOpt = False) -> None:
    """Install the pinned nemo-gym wheel (its digest checked) into an environment of its own in the
    cache, once (about 75 s); say which Python runs it and why."""
    from ..gym.resources import NemoGymUnavailableError, install_nemo_gym

    try:
        with console.status("installing nemo-gym into its own environment (cached after)"):
            done = install_nemo_gym()
    except NemoGymUnavailableError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print_json({f: getattr(done, f) for f in done.__struct_fields__})
    else:
        console.print(f"nemo-gym {done.version} under Python {done.python_version} ({done.python})")
        console.print(done.why, soft_wrap=True)


@nemo_app.command("list")
def nemo_list(as_json: JsonOpt = False) -> None:
    """Every resources server and agent of the installed nemo-gym, with the level rollcut gives it."""
    from ..gym.resources import NemoGymUnavailableError, nemo_gym_catalogue

    try:
        levels = nemo_gym_catalogue()
    except NemoGymUnavailableError as exc:
        raise fail(str(exc)) from exc
    if as_json:
        print_json([{f: getattr(x, f) for f in x.__struct_fields__} for x in levels])
        return
    table = Table("kind", "name", "level", "why")
    for x in levels:
        table.add_row(x.kind, x.name, x.level, x.why)
    console.print(table)
    counts: dict[str, int] = {}
    for x in levels:
        counts[f"{x.kind} {x.level}"] = counts.get(f"{x.kind} {x.level}", 0) + 1
    console.print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
