"""Serve options are declared once: the command line builds them, workers get them as JSON, and the
harness rebuilds the command line from them; each way gives back the same options."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import pytest
import typer
from typer.testing import CliRunner

from rollcut._flag import flag
from rollcut.cli import app
from rollcut.cli._flags import command_of
from rollcut.gym import (
    AgentServe,
    EnvironmentServe,
    ModelServe,
    ResourcesServe,
    ServeSpec,
    cli_argv,
    decode_spec,
    encode_spec,
)

EXAMPLES: list[ServeSpec] = [
    ModelServe(
        url="nats://127.0.0.1:4222",
        tokens="/t",
        backend_options={"seed": "3", "token_delay": "0.004"},
        workers=2,
        port=8123,
    ),
    ResourcesServe(url="nats://h:1", namespace="demo", credentials="/c.json", env="workplace", name="wp"),
    AgentServe(
        url="nats://h:1", model="http://m", resources={"counter": "http://c", "blackjack": "http://b"}
    ),
    EnvironmentServe(url="nats://h:1", agent="http://a", host="127.0.0.2", workers=3),
]


@pytest.mark.parametrize("opts", EXAMPLES, ids=lambda o: o.kind)
def test_a_worker_gets_exactly_its_servers_options(opts: ServeSpec) -> None:
    assert decode_spec(encode_spec(opts)) == opts


@pytest.mark.parametrize("opts", EXAMPLES, ids=lambda o: o.kind)
def test_the_command_line_the_harness_builds_parses_back_to_the_same_options(
    opts: ServeSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr("rollcut.gym.serve", seen.append)  # parse only; serving is the e2e suite's
    result = CliRunner().invoke(app, ["serve", *cli_argv(opts)])
    assert result.exit_code == 0, result.output
    assert seen == [opts]


def test_an_unknown_environment_is_refused_naming_the_choices() -> None:
    result = CliRunner().invoke(app, ["serve", "resources", "nope", "--url", "nats://h:1"])
    assert result.exit_code == 2
    assert "counter" in result.output and "workplace" in result.output


def test_a_backend_option_it_does_not_take_is_refused_before_anything_binds_naming_the_ones_it_does() -> None:
    argv = ["serve", "model", "--url", "nats://127.0.0.1:1", "--backend-option", "sead=3"]
    result = CliRunner().invoke(app, argv, terminal_width=300)
    assert result.exit_code == 2
    assert "sead" in result.output and "seed, token_delay, tool_turns" in result.output


def test_a_backend_brings_its_options_and_the_server_gets_them_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollcut.gym.model import BACKENDS, EngineOptions, LocalBackend

    seen: list[Any] = []
    monkeypatch.setattr("rollcut.gym.serve", seen.append)
    argv = ["serve", "model", "--url", "nats://h:1", "--backend-option", "seed=7"]
    argv += ["--backend-option", "token_delay=0.5", "--backend-option", "tool_turns=2"]
    assert CliRunner().invoke(app, argv).exit_code == 0
    backend = BACKENDS["local"](seen[0])
    assert isinstance(backend, LocalBackend)
    assert (backend.seed, backend.token_delay_s, backend.tool_turns) == (7, 0.5, 2)
    engine = ModelServe(url="u", backend="engine", upstream="http://e", backend_options={"cuts": "false"})
    assert BACKENDS["engine"].options_of(engine) == EngineOptions(cuts=False)  # type: ignore[attr-defined]


class Opts(msgspec.Struct, kw_only=True):
    """A plugin's options, declared as rollcut's are."""

    name: Annotated[str, flag("Who.")]
    times: Annotated[int, flag("How often.", min=1)] = 2
    loud: Annotated[bool, flag("Shout.")] = False
    tags: Annotated[dict[str, str], flag("KEY=VALUE.", flag="--tag")] = {}


def test_a_field_on_an_options_struct_is_a_flag_with_its_help_and_nothing_else_is_written() -> None:
    """One declaration per option: the flag, its default and its help come from the field."""
    built: list[Opts] = []
    cli = typer.Typer()
    cli.command()(command_of(Opts, built.append, arguments=("name",)))
    out = CliRunner().invoke(cli, ["--help"], terminal_width=200).output
    assert "Who." in out and "How often." in out and "Shout." in out and "--tag" in out
    assert CliRunner().invoke(cli, ["ann", "--times", "3", "--loud", "--tag", "a=b"]).exit_code == 0
    assert built == [Opts(name="ann", times=3, loud=True, tags={"a": "b"})]
    assert CliRunner().invoke(cli, ["ann", "--times", "0"]).exit_code == 2  # its min, from the field
