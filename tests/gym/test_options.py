"""Serve options are declared once: the command line builds them, workers get them as JSON, and the
harness rebuilds the command line from them; each way gives back the same options."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from rollcut.cli import app
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
