"""NeMo Gym's routing of rows by ``agent_ref`` and its per-agent ``num_repeats``, through ``rollcut
collect``: rows naming ``simple_agent`` go to one environment server, rows naming ``judge_agent`` to
another (each fronting its agent), each agent's rows are repeated as many times as its entry says,
and every rollout is written once, by the server its row named."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from rollcut.demo import demo_rows
from rollcut.testing import ServerProcess

from .conftest import Deployment, deploy, finish
from .episodes import episodes

pytestmark = pytest.mark.slow


async def _served_by(dep: Deployment, rids: list[str]) -> dict[str, set[str]]:
    """The environment servers (by group) that logged anything for each rollout."""
    async with episodes(dep) as ep:
        return {
            rid: {
                e.instance.rsplit("-w", 1)[0] for _, e in await ep.events(rid) if e.component == "environment"
            }
            for rid in rids
        }


def test_rows_run_on_the_agent_their_agent_ref_names_with_its_own_repeats(tmp_path: Path) -> None:
    rows = demo_rows(6, seed=2, envs=("counter",))
    for i, row in enumerate(rows):
        row["agent_ref"] = {
            "type": "responses_api_agents",
            "name": "judge_agent" if i % 2 else "simple_agent",
        }
    with deploy(tmp_path, tasks=rows, envs=("counter",)) as dep:
        first = dep.stack[-1]
        argv = list(first.argv)
        argv[argv.index("--port") + 1] = "0"
        second = ServerProcess([*argv, "--name", "judge-env"], workers=first.workers, logs=first.logs).start()
        dep.stack.append(second)  # torn down with the rest
        dep.extra_config = [
            "agents:",
            f"  simple_agent: {first.url}",
            f"  judge_agent: {second.url}",
            "num_repeats:",
            "  simple_agent: 3",
            "  _default: 1",
        ]
        dep._write_config()
        code, summary = finish(dep.collect())
        assert code == 0, summary
        written = dep.rows()
        assert len(written) == 3 * 3 + 3 * 1 == len({r["rollout_id"] for r in written})
        per_task = collections.Counter(r["_ng_task_index"] for r in written)
        agent_of = {r["_ng_task_index"]: r["agent_ref"]["name"] for r in written}
        assert {t: n for t, n in per_task.items()} == {
            t: 3 if agent_of[t] == "simple_agent" else 1 for t in per_task
        }
        served = asyncio.run(_served_by(dep, [r["rollout_id"] for r in written]))
        for r in written:
            expected = "judge-env" if r["agent_ref"]["name"] == "judge_agent" else "environment"
            assert served[r["rollout_id"]] == {expected}, r


def test_a_row_whose_agent_has_no_repeats_entry_is_refused_before_anything_runs(tmp_path: Path) -> None:
    rows = demo_rows(2, seed=2, envs=("counter",))
    rows[1]["agent_ref"] = {"type": "responses_api_agents", "name": "swe_agent"}
    with deploy(tmp_path, tasks=rows, envs=("counter",)) as dep:
        dep.extra_config = ["num_repeats:", "  simple_agent: 2"]
        dep._write_config()
        code, summary = finish(dep.collect())
        assert code == 2 and "swe_agent" in summary["stderr"] and "_default" in summary["stderr"], summary
        assert dep.rows() == []
