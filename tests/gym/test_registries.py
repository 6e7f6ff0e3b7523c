"""Extension points are registries: a name resolves to a factory, and another package adds one
through an entry point without editing rollcut."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rollcut import ConfigError
from rollcut._registry import Registry
from rollcut.bus import EventLog
from rollcut.gym.model.engine import DIALECTS, LlamaCpp, engine_backend
from rollcut.gym.wire import Identity, identity_headers
from rollcut.ledger import Ledger
from rollcut.participants import Coordinator, Restorer
from rollcut.testing import ServerProcess
from rollcut.tokens import LocalTokenStore

PLUGIN = '''
import json
from rollcut.gym.resources import Environment


class Shouting(Environment):
    """A tool environment of another package's: it says what it is told, louder."""

    name = "shouting"
    mode = "event_sourced"
    state_in_events = True

    def tools(self):
        return {"shout": self._shout}

    def _shout(self, state, args):
        state["said"].append(str(args["text"]).upper())
        return " ".join(state["said"]), None  # everything said so far

    def seed(self, args):
        return {"said": []}

    def export_state(self, state):
        return json.dumps(state).encode()

    def import_state(self, blob, codec_version):
        return json.loads(blob)

    @classmethod
    def demo_task(cls, rng):
        return {"prompt": "Shout hello.", "seed": {}}
'''


def _install_plugin(where: Path) -> Path:
    """A package installed as pip lays one out: its module and its ``.dist-info`` with the entry point
    (on a path of its own, so the test's venv is left as it was)."""
    (where / "rollcut_shouting").mkdir(parents=True)
    (where / "rollcut_shouting" / "__init__.py").write_text(PLUGIN)
    info = where / "rollcut_shouting-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rollcut-shouting\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rollcut.environments]\nshouting = rollcut_shouting:Shouting\n")
    return where


def _env_with(path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), os.environ.get("PYTHONPATH", "")])}


async def test_an_environment_of_another_package_is_served_by_name(
    tmp_path: Path, log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = _install_plugin(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", _env_with(site)["PYTHONPATH"])  # the server's process finds it
    helped = subprocess.run(
        [sys.executable, "-m", "rollcut", "serve", "resources", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_env_with(site), "COLUMNS": "300"},
    )
    assert helped.returncode == 0 and "shouting" in helped.stdout and "counter" in helped.stdout
    argv = ["resources", "shouting", "--url", log.config.url, "--namespace", log.config.namespace]
    server = ServerProcess(argv, logs=tmp_path / "logs").start()
    try:
        await log.dispatch("r1", {"env": "shouting"}, instance="collector-0")
        headers = identity_headers(Identity("r1", 1))
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            assert (await http.post("/seed_session", json={}, headers=headers)).status_code == 200
            said = (await http.post("/shout", json={"text": "hello"}, headers=headers)).json()
        assert said["result"] == "HELLO" and said["revision"] == 1
        # checkpointed, its process SIGKILLed, started again and restored from the cut: the plugin's
        # session goes on under the next attempt, as a built-in environment's does
        with Ledger(tmp_path / "ledger") as ledger, LocalTokenStore(tmp_path / "tokens") as tokens:
            coordinator = Coordinator(log, ledger, tokens)
            res = await coordinator.checkpoint(deadline_s=20, expect=set(server.instances))
            assert set(res.record.participants) == set(server.instances)
            server.kill()
            server = ServerProcess(argv, logs=tmp_path / "logs-again").start()
            restorer = Restorer(log, ledger, coordinator)
            cut, ck = res.record.cut, res.record.checkpoint_id
            assert await restorer.next_attempt("r1", from_cut=cut, checkpoint_id=ck, reason="test") == 2
            assert await restorer.restore(ck, cut) == list(server.instances)
            await restorer.resume(ck)
        again = identity_headers(Identity("r1", 2))
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            # no agent boundary was recorded: the continuing agent re-issues the call it made, and
            # is answered from the log, not by shouting again
            replayed = (await http.post("/shout", json={"text": "hello"}, headers=again)).json()
            more = (await http.post("/shout", json={"text": "again"}, headers=again)).json()
        assert (replayed.get("result"), replayed.get("revision")) == ("HELLO", 1), replayed
        assert (more.get("result"), more.get("revision")) == ("HELLO AGAIN", 2), more  # its state restored
    finally:
        server.close()


def test_an_unknown_name_is_refused_naming_what_is_installed() -> None:
    reg: Registry[type] = Registry("widget", "rollcut.tests-widgets", {"plain": "builtins:object"})
    assert reg["plain"] is object
    with pytest.raises(ConfigError, match=r"unknown widget 'fancy'; have: plain"):
        reg["fancy"]


def test_an_entry_that_does_not_import_costs_only_its_own_name() -> None:
    reg: Registry[object] = Registry(
        "widget", "rollcut.tests-widgets", {"plain": "builtins:object", "broken": "no_such_module:Thing"}
    )
    with pytest.raises(ConfigError, match=r"widget 'broken' \(no_such_module:Thing\) does not load"):
        reg["broken"]
    assert reg["plain"] is object and reg.names() == ["plain", "broken"]


def test_a_new_engine_dialect_is_one_class_and_its_registration() -> None:
    class Mine(LlamaCpp):
        name = "mine"

    DIALECTS.register("mine", Mine)
    try:
        backend = engine_backend("http://127.0.0.1:1", "mine")
        assert type(backend.dialect) is Mine
        with pytest.raises(
            ConfigError, match=r"unknown engine dialect 'nope'; have: llama\.cpp, vllm, sglang, mine"
        ):
            engine_backend("http://127.0.0.1:1", "nope")
    finally:
        DIALECTS.unregister("mine")


def test_an_environment_registered_under_a_name_it_does_not_have_is_refused() -> None:
    """A restore finds an environment by the name its events carry: registered under another key it
    would be restored as nothing, a fresh dispatch without a word. Refused at once instead."""
    from rollcut.gym.resources import ENVIRONMENTS, Counter

    with pytest.raises(ConfigError, match=r"'tally'.*'counter'"):
        ENVIRONMENTS.register("tally", Counter)
    assert "tally" not in ENVIRONMENTS
    assert ENVIRONMENTS["counter"] is Counter  # its own name resolves as before
