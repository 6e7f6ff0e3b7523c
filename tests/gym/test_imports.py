"""A process imports what it serves: a deployment starts about ten Python processes per test and
per collection, and OpenAI's types (the model server's) or gymnasium and numpy (one environment's)
cost each of them most of a second of CPU at start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("code", "absent"),
    [
        ("import rollcut.collect, rollcut.gym.wire", {"openai", "fastapi", "gymnasium"}),
        (
            "from rollcut.gym import serve, ResourcesServe; import rollcut.gym.resources",
            {"openai", "gymnasium", "numpy"},
        ),
        ("import rollcut.gym.agent, rollcut.gym.opaque, rollcut.gym", {"openai"}),
        # Anthropic's types: 1.5 s of CPU, paid on the first Messages call, not at every start
        ("import rollcut.gym.model, rollcut.gym.model._routes", {"anthropic"}),
        # the model and resources servers do not load the opaque agent (its relay, launcher, sandbox)
        ("import rollcut.gym.model, rollcut.gym.resources", {"rollcut.gym.opaque"}),
        # aiohttp: nats-py's WebSocket transport and openai's aiohttp client load it whenever it
        # is installed, 0.16 s of CPU each at every start; rollcut uses neither (rollcut._hidden)
        (
            "import rollcut.gym._runners, rollcut.gym.model, rollcut.gym.agent, rollcut.collect, rollcut.cli",
            {"aiohttp"},
        ),
        # a participant is not a coordinator: no coordinator or restorer in a server
        (
            "import rollcut.gym.resources, rollcut.gym.agent",
            {"rollcut.participants._coordinator", "rollcut.participants._restore"},
        ),
    ],
)
def test_a_server_that_does_not_need_them_does_not_import_them(code: str, absent: set[str]) -> None:
    loaded = "(set(sys.modules) | set(m.split('.')[0] for m in sys.modules))"
    probe = f"{code}; import sys; print(sorted(set({sorted(absent)!r}) & {loaded}))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_model_server_still_builds_its_bodies_with_openais_types() -> None:
    probe = "import rollcut.gym.model, sys; print('openai.types.chat' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["True"]


def test_aiohttp_is_hidden_only_while_rollcut_imports_what_would_load_it() -> None:
    """Hidden for nats-py's and openai's imports, it is importable after them as it is installed."""
    probe = "import rollcut.gym.model, rollcut.bus, aiohttp, nats.aio.transport as t; print(t.aiohttp)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["None"]


def test_rollcut_serve_loads_its_own_command_group_only() -> None:
    """``rollcut serve`` starts every Gym server, again after every crash: the rest of the command
    tree (each bench's, the demo's, the store's parameters) is not built for it; ``--help`` still
    lists what the registry installs."""
    probe = (
        "import sys; sys.argv = ['rollcut', 'serve', 'resources', '--help']\n"
        "from rollcut.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "import json; print(json.dumps([m for m in sys.modules if m.startswith('rollcut.cli._')]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    *shown, loaded = done.stdout.strip().splitlines()
    modules = set(json.loads(loaded))
    assert "counter" in "".join(shown) and "rollcut.cli._serve" in modules
    assert not {"rollcut.cli._bench", "rollcut.cli._demo", "rollcut.cli._store"} & modules
