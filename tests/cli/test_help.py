"""Every command's ``--help`` reads as text: no reStructuredText markup (the docstrings that say why
are also what a user reads in a terminal)."""

from __future__ import annotations

from collections.abc import Iterator

import typer
from typer.testing import CliRunner

from rollcut.cli import app


def _commands(group: typer.Typer, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for command in group.registered_commands:
        name = command.name or (command.callback.__name__ if command.callback else "")
        yield (*path, name.replace("_", "-"))
    for sub in group.registered_groups:
        assert sub.typer_instance is not None and sub.name
        yield (*path, sub.name)
        yield from _commands(sub.typer_instance, (*path, sub.name))


def test_no_command_s_help_shows_rst_markup() -> None:
    runner = CliRunner()
    seen, marked = 0, []
    for path in [(), *_commands(app)]:
        out = runner.invoke(app, [*path, "--help"], terminal_width=200)
        assert out.exit_code == 0, (path, out.output)
        seen += 1
        if "``" in out.output or ":func:" in out.output or ":class:" in out.output:
            marked.append(" ".join(path) or "rollcut")
    assert seen > 30 and marked == []


def test_every_bench_that_repeats_refuses_zero_repeats_before_it_starts() -> None:
    """``--repeat 0`` had no median to take: a traceback after the stack was up (exit 70). Every bench
    declares the option once (``RepeatOpt``, at least 1), so each refuses it in typer's words, exit 2."""
    runner = CliRunner()
    bench = next(g.typer_instance for g in app.registered_groups if g.name == "bench")
    assert bench is not None
    refused = []
    for (name,) in _commands(bench):
        if "--repeat" not in runner.invoke(app, ["bench", name, "--help"], terminal_width=200).output:
            continue
        out = runner.invoke(app, ["bench", name, "--repeat", "0"])
        assert out.exit_code == 2 and "--repeat" in out.output, (name, out.output)
        refused.append(name)
    assert len(refused) >= 9, refused


def test_main_loads_for_each_command_the_modules_that_register_it() -> None:
    """``main`` loads only the modules its table names for the command it runs: the table must name,
    for every top-level command and group, every module that registers on it, or a command (or a
    group's subcommand) would be missing when it runs alone."""
    from rollcut import cli

    def home(callback: object) -> str:
        return str(getattr(callback, "__module__", "")).rpartition(".")[2]

    registered: dict[str, set[str]] = {}
    for command in app.registered_commands:  # a command's name is typer's: its function's, dashed
        name = command.name or getattr(command.callback, "__name__", "").replace("_", "-")
        registered.setdefault(name, set()).add(home(command.callback))
    for group in app.registered_groups:
        assert group.typer_instance is not None and group.name
        homes = {home(c.callback) for c in group.typer_instance.registered_commands}
        registered.setdefault(group.name, set()).update(homes)
    declared: dict[str, set[str]] = {}
    for module, names in cli._COMMANDS.items():
        for name in names:
            declared.setdefault(name, set()).add(module)
    assert declared == registered


def test_every_command_runs_through_main_in_a_process_of_its_own() -> None:
    """What ``main`` loads is per command, so only a fresh process shows what a user gets: each
    top-level command and group, loaded alone, must still be a command of the root group (typer
    makes an app with a single command that command itself, which refused ``rollcut demo``)."""
    import os
    import subprocess
    import sys

    from rollcut import cli

    names = sorted({name for names in cli._COMMANDS.values() for name in names})
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "rollcut", name, "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        for name in names
    }
    refused = {}
    for name, run in runs.items():
        out, _ = run.communicate(timeout=120)
        if run.returncode != 0 or f"rollcut {name} " not in out:
            refused[name] = (run.returncode, out[-600:])
    assert len(names) >= 17 and refused == {}
