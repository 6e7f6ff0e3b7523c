"""Collect NeMo Gym's own example data through NeMo Gym's own servers, unmodified, under rollcut.

    python examples/nemo_gym_collection.py [--home DIR] [--crash] [--json]

Runs, each as the ``rollcut serve`` process a user would start: rollcut's model server; NeMo Gym's
``example_session_state_mgmt`` (replayable), ``example_multi_step`` and ``mcqa`` (stateless) behind
rollcut's journal, driven by rollcut's Simple Agent; and NeMo Gym's ``blackjack`` (restart-only)
driven by NeMo Gym's own ``gymnasium_agent``. The rows are each server's ``data/example.jsonl`` from
the installed wheel, with ``env`` added where the Simple Agent fronts several servers; blackjack's
rows go to their own agent by their ``agent_ref`` (the collect config's ``agents:`` map). Then
``rollcut collect`` on the config written to ``HOME/collect.yaml``; with ``--crash``, every Gym
process is SIGKILLed once the first rows are written, started again, and ``rollcut collect
--resume`` finishes the collection. NeMo Gym is installed into rollcut's cache on first use
(``rollcut nemo-gym install``, about 70 s).

Prints, per server, the rows it ran, their mean reward and what the log says the crash did to its
rollouts (continued, started over, divergences, calls given again to rebuild a session, model and
tool calls kept or done again, verdicts computed or given again from the journal), and the
collection's recovery.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rollcut.bus import BusConfig, Credentials, EmbeddedServer, EventLog
from rollcut.gym.resources import install_nemo_gym, nemo_gym_example_rows
from rollcut.replay import count_work_by
from rollcut.testing import ServerProcess, start_stack

NAMESPACE = "nemogym"
SIMPLE = ("example_session_state_mgmt", "example_multi_step", "mcqa")
GYMNASIUM = "blackjack"


def _rows() -> list[dict[str, Any]]:
    rows = [{**json.loads(line), "env": s} for s in SIMPLE for line in nemo_gym_example_rows(s)]
    return rows + [json.loads(line) for line in nemo_gym_example_rows(GYMNASIUM)]


def _stacks(url: str, home: Path) -> list[list[ServerProcess]]:
    common: dict[str, Any] = {"namespace": NAMESPACE, "logs": home / "logs"}
    creds, tokens = home / "nats" / "credentials.json", home / "tokens"
    simple = start_stack(url, creds, tokens, envs=tuple(f"nemo-gym:{s}" for s in SIMPLE), **common)
    gymnasium = start_stack(  # a second stack on the same bus: its servers named apart
        url,
        creds,
        tokens,
        envs=(f"nemo-gym:{GYMNASIUM}",),
        model_options={"name": "model-gymnasium"},
        agent_options={"agent": "nemo-gym", "server": "gymnasium_agent"},
        environment_options={"name": "environment-gymnasium"},
        **common,
    )
    return [simple, gymnasium]


def _config(home: Path, stacks: list[list[ServerProcess]], url: str, rows: int) -> Path:
    agent_ref = json.loads(nemo_gym_example_rows(GYMNASIUM)[0])["agent_ref"]["name"]
    config = {
        "nats_url": url,
        "namespace": NAMESPACE,
        "credentials": str(home / "nats" / "credentials.json"),
        "home": str(home),
        "environment_url": stacks[0][-1].url,
        "agents": {agent_ref: stacks[1][-1].url},
        "tasks": "tasks.jsonl",
        "output": "rows.jsonl",
        "concurrency": min(rows, 16),
        "checkpoint": {"every_s": 1, "deadline_s": 10},
        # the history is read after the run for its per-server figures: kept whole (a collection that
        # does not read it back lets compaction free a handed-off rollout's events)
        "compaction": {"enabled": False},
    }
    path = home / "collect.yaml"
    path.write_text(json.dumps(config, indent=2))  # YAML is a superset of JSON
    return path


def _collect(config: Path, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "rollcut", "collect", str(config), "--json", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _written(home: Path) -> int:
    path = home / "rows.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _kill(stacks: list[list[ServerProcess]]) -> None:
    for stack in stacks:
        for p in stack:
            p.kill()


async def _stream(url: str, creds: Credentials) -> None:
    log = await EventLog.connect(BusConfig(url=url).as_role(creds, "admin"))  # made by the operator
    await log.close()


_CRASH_FIGURES = (
    "continued",
    "started_over",
    "divergences",
    "revisions_rebuilt",
    "model_calls_kept",
    "regenerated",
    "tool_calls_kept",
    "tool_calls_reexecuted",
    "verdicts_computed",
    "verdicts_from_log",
)


async def _crash_figures(url: str, creds: Credentials) -> dict[str, dict[str, int]]:
    """Per server, what the log says the crash did to its rollouts (rollcut.replay.WorkByGroup)."""
    log = await EventLog.connect(BusConfig(url=url).as_role(creds, "admin"))
    try:
        _, by = await count_work_by(log, _server_of)
    finally:
        await log.close()
    return {server: {k: n[k] for k in _CRASH_FIGURES} for server, n in by.items()}


def _server_of(row: Any) -> str:
    text = json.dumps(row.get("responses_create_params", {}).get("input")) if isinstance(row, dict) else ""
    return next((s for s in (GYMNASIUM, *SIMPLE) if _is(row, text, s)), "?")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", type=Path, default=Path(time.strftime("rollcut-nemo-gym-%Y%m%d-%H%M%S")))
    ap.add_argument("--crash", action="store_true", help="SIGKILL every Gym process mid-run, then resume")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    home: Path = args.home.absolute()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    install_nemo_gym()
    rows = _rows()
    (home / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    creds = Credentials.generate(NAMESPACE)
    creds.save(home / "nats" / "credentials.json")
    with EmbeddedServer(home / "nats", credentials=creds) as nats:
        asyncio.run(_stream(nats.url, creds))
        stacks = _stacks(nats.url, home)
        try:
            config = _config(home, stacks, nats.url, len(rows))
            proc = _collect(config)
            if args.crash:
                while _written(home) < 3 and proc.poll() is None:
                    time.sleep(0.2)  # polling the rows file: the collector says nothing else mid-run
                _kill(stacks)  # every Gym process at once, NeMo Gym's children with them
                proc.send_signal(signal.SIGTERM)
                proc.communicate(timeout=120)
                stacks = _stacks(nats.url, home)
                config = _config(home, stacks, nats.url, len(rows))
                proc = _collect(config, "--resume")
            out, err = proc.communicate(timeout=600)
            figures = asyncio.run(_crash_figures(nats.url, creds))
        finally:
            _kill(stacks)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    summary = json.loads(lines[-1]) if lines else {"error": err[-2000:]}
    written = [json.loads(line) for line in (home / "rows.jsonl").read_text().splitlines()]
    by: dict[str, list[float]] = {}
    for row in written:
        by.setdefault(_server_of(row), []).append(float(row.get("reward") or 0.0))
    result = {
        "exit": proc.returncode,
        "rows": len(written),
        "per_server": {
            s: {"rows": len(r), "mean_reward": round(sum(r) / len(r), 3), **figures.get(s, {})}
            for s, r in by.items()
        },
        "recovery": summary.get("recovery"),
        "home": str(home),
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return int(proc.returncode or 0)


def _is(row: dict[str, Any], text: str, server: str) -> bool:
    """Which server a written row came from (its verify answer drops ``env``): by its own data."""
    return {
        GYMNASIUM: "Blackjack" in text,
        "example_session_state_mgmt": "get the count" in text,
        "example_multi_step": "synonym" in text,
        "mcqa": "boxed" in text,
    }[server]


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main())
