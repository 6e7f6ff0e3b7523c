"""NeMo Gym as it ships, under rollcut, through a SIGKILL of every Gym process: its own stateful counter
(unmodified, from its wheel) driven by rollcut's Simple Agent and by NeMo Gym's own ``simple_agent``.

What a user checks: every row once; every verdict the same as a run without the crash (the counter's
final values right: each increment applied once, none lost, none doubled); no model call the lineage
completed generated again; no journaled tool call applied to the upstream twice within an attempt's
session; and the continued attempts really continued (calls answered from the log)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollcut.bus import (
    AttemptOpened,
    BusConfig,
    EventLog,
    ModelCallCompleted,
    ModelCallReused,
    ResourcesMutated,
    load_credentials,
)
from rollcut.gym.resources import install_nemo_gym, nemo_gym_example_rows

from ..gym.nemo_bodies import stateful_counter_rows
from .conftest import NS, Deployment, collected, deploy

pytestmark = pytest.mark.slow

COUNTER = "example_session_state_mgmt"
AGENTS = {
    "rollcut_simple_agent": {},
    "nemo_gym_simple_agent": {"agent_options": {"agent": "nemo-gym", "server": "simple_agent"}},
}


async def _events(dep: Deployment) -> list[tuple[int, Any]]:
    log = await EventLog.connect(
        BusConfig(url=dep.url, namespace=NS).as_role(load_credentials(dep.creds), "admin")
    )
    try:
        return [(s.seq, s.event) async for s in log.read()]
    finally:
        await log.close()


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_nemo_gyms_counter_through_a_crash_keeps_every_row_and_verdict(tmp_path: Path, agent: str) -> None:
    install_nemo_gym()  # NeMo Gym's environment, made once per machine (cached after)
    rows = stateful_counter_rows(10, env=COUNTER)
    stack = {"envs": (f"nemo-gym:{COUNTER}",), **AGENTS[agent]}
    with deploy(tmp_path / "reference", tasks=rows, **stack) as ref_dep:
        reference, _ = collected(ref_dep, crash=False)
    with deploy(tmp_path / "crashed", tasks=rows, **stack) as dep:
        crashed, _ = collected(dep, crash=True)
        events = asyncio.run(_events(dep))
    assert {r: row["reward"] for r, row in crashed.items()} == {
        r: row["reward"] for r, row in reference.items()
    }
    assert any(row["reward"] == 1.0 for row in crashed.values())  # NeMo Gym's verify read right counts
    for rid, row in crashed.items():
        assert row["_ng_attempt_index"] == row["attempt"] - 1 and row["_ng_rollout_id"] == rid

    opened = {(e.rollout_id, e.attempt): e.from_cut for _, e in events if isinstance(e, AttemptOpened)}
    continued = {k: cut for k, cut in opened.items() if cut}
    assert continued, "the crash landed before any rollout had begun: nothing was continued"
    completed: dict[str, list[tuple[int, int, str]]] = {}
    reused: dict[tuple[str, int], list[str]] = {}
    for seq, e in events:
        if isinstance(e, ModelCallCompleted):
            completed.setdefault(e.rollout_id, []).append((seq, e.attempt, e.request_digest))
        elif isinstance(e, ModelCallReused):
            reused.setdefault((e.rollout_id, e.attempt), []).append(e.request_digest)
    for rid, calls in completed.items():
        digests = [d for _, _, d in calls]
        assert len(digests) == len(set(digests)), f"{rid}: a completed model call was generated again"
    if agent == "nemo_gym_simple_agent":  # it runs /run again: every call kept is answered from the log
        for (rid, attempt), cut in continued.items():
            kept = [d for seq, a, d in completed.get(rid, []) if a < attempt and seq <= cut]
            assert reused.get((rid, attempt), [])[: len(kept)] == kept, rid
    applied: dict[tuple[str, int], list[int]] = {}
    for _, e in events:
        if isinstance(e, ResourcesMutated):
            applied.setdefault((e.rollout_id, e.attempt), []).append(e.revision)
    assert all(len(revs) == len(set(revs)) for revs in applied.values()), "a revision applied twice"


@pytest.mark.parametrize("declared", ["restart_only", "replayable"])
def test_blackjack_under_nemo_gyms_gymnasium_agent_restarts_what_it_cannot_replay(
    tmp_path: Path, declared: str
) -> None:
    """NeMo Gym's blackjack (cards from an unseeded ``random.Random()``) under its own Gymnasium agent:
    as declared (restart_only) every rollout the crash interrupted starts over from its input; declared
    replayable for the run, each continuation's replayed ``/reset`` deals other cards, the divergence
    is found at that first answer, and the rollout starts over too. Either way every row once, exit 0."""
    install_nemo_gym()
    # more rows than the collection runs at once, each model call taking a while: when the crash
    # comes (at the 4th row), the collection is running 8 others, whatever the machine's load
    rows = [json.loads(line) for line in nemo_gym_example_rows("blackjack")] * 4
    stack: dict[str, Any] = {
        "token_delay": 0.01,
        "envs": ("nemo-gym:blackjack",),
        "agent_options": {"agent": "nemo-gym", "server": "gymnasium_agent"},
        "resources_options": {"replayable": declared == "replayable"},
    }
    with deploy(tmp_path / "crashed", tasks=rows, **stack) as dep:
        crashed, said = collected(dep, crash=True)
        events = asyncio.run(_events(dep))
    assert said["failed"] == {} and all(row["reward"] in (-1.0, 0.0, 1.0) for row in crashed.values())
    continued = {e.rollout_id for _, e in events if isinstance(e, AttemptOpened) and e.from_cut}
    assert continued and said["fallbacks_to_fresh"] >= 1
    if declared == "restart_only":  # nothing of a blackjack session is ever continued
        assert said["fallbacks_to_fresh"] == said["recovery"]["continue"]


EXAMPLE = Path(__file__).parents[2] / "examples" / "nemo_gym_collection.py"


def test_the_example_collects_nemo_gyms_own_data_on_its_own_servers_across_a_crash(tmp_path: Path) -> None:
    """``examples/nemo_gym_collection.py --crash``, as the README runs it: four of NeMo Gym's servers
    (a replayable one, two stateless, a restart-only one under NeMo Gym's own Gymnasium agent) on
    their own example rows; every row once, exit 0."""
    home = tmp_path / "home"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--home", str(home), "--crash", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    tasks = (home / "tasks.jsonl").read_text().splitlines()
    assert out["rows"] == len(tasks) and out["exit"] == 0
    rows = [json.loads(line) for line in (home / "rows.jsonl").read_text().splitlines()]
    assert len({r["rollout_id"] for r in rows}) == len(tasks)
    assert set(out["per_server"]) == {"example_session_state_mgmt", "example_multi_step", "mcqa", "blackjack"}
    for name, server in out["per_server"].items():  # from the log: nothing done twice, every row verified
        assert server["regenerated"] == 0 and server["tool_calls_reexecuted"] == 0, name
        assert server["verdicts_from_log"] + server["verdicts_computed"] >= (
            server["rows"] if name != "blackjack" else 0
        )
    assert (
        out["per_server"]["blackjack"]["started_over"] > 0 or out["per_server"]["blackjack"]["continued"] == 0
    )
