"""Policy versions through a crash and a weight update, at process level: the model server is
restarted under a newer version, the collection resumes, and every row says which versions made it.

With ``--max-policy-lag`` too small for the gap, no rollout carries tokens of the old version into
the new one: each interrupted rollout starts over from its input (``fresh_dispatch``). Without it,
the continued rollouts mix both versions, and their rows and the export say so token by token.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollcut.demo import demo_rows

from .conftest import SIGTERM, Deployment, deploy, finish

pytestmark = pytest.mark.slow


def _versions(row: dict[str, Any]) -> set[int]:
    return {seg["version"] for item in row["response"]["output"] for seg in item.get("policy_segments") or []}


def _crash_and_update(dep: Deployment, new: dict[str, Any]) -> dict[str, Any]:
    """Collect until 4 rows, SIGKILL every Gym process, restart the model server under ``new``'s
    version and options, resume; the resumed collection's summary."""
    proc = dep.collect()
    dep.wait_rows(4, proc)
    dep.crash()
    proc.send_signal(SIGTERM)
    finish(proc)
    dep.stack_options["model_options"] = new
    dep.restart()
    code, summary = finish(dep.collect("--resume"), timeout=240)
    assert code == 0, summary
    dep.each_rollout_once()
    return summary


@pytest.mark.parametrize("lag", [1, None], ids=["max-policy-lag-1", "no-lag-bound"])
def test_a_weight_update_across_a_crash_is_recorded_per_token_and_bounded_by_the_lag(
    tmp_path: Path, lag: int | None
) -> None:
    with deploy(
        tmp_path,
        demo_rows(16, seed=0),
        token_delay=0.004,
        tool_turns=4,
        model_options={"policy_version": 1},
    ) as dep:
        new = {"policy_version": 3, **({"max_policy_lag": lag} if lag is not None else {})}
        summary = _crash_and_update(dep, new)
        rows = dep.rows()
        for row in rows:
            versions = _versions(row)
            assert versions <= {1, 3} and versions
            assert (row["version_start"], row["version_end"]) == (min(versions), max(versions))
        mixed = [r for r in rows if _versions(r) == {1, 3}]
        if lag is not None:
            # two versions apart, one allowed: nothing old is carried into the new version
            assert mixed == [] and summary["fallbacks_to_fresh"] >= 1
        else:
            assert mixed and summary["recovery"]["continue"] >= 1
        # the export's per-token versions: -1 where the policy did not generate, else the segment's
        out = tmp_path / "turns.jsonl"
        export = ["export", str(dep.output), "--home", str(dep.root), "--out", str(out)]
        done = subprocess.run(
            [sys.executable, "-m", "rollcut", *export],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        turns = [json.loads(line) for line in out.read_text().splitlines()]
        by_rollout: dict[str, set[int]] = {}
        for t in turns:
            generated = [v for v, m in zip(t["versions"], t["mask"], strict=True) if m]
            assert all(v == -1 for v, m in zip(t["versions"], t["mask"], strict=True) if not m)
            assert generated and set(generated) <= {1, 3}
            by_rollout.setdefault(t["rollout_id"], set()).update(generated)
        assert by_rollout == {r["rollout_id"]: _versions(r) for r in rows}
