"""A collection of NeMo Gym rows across a crash: every rollout written once, in NeMo Gym's format, with
transcripts and token arrays the token store vouches for, and the same rows as a run without the crash
for the rollouts that were done before it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import ResponseOutputMessage

from rollcut.collect import read_turns
from rollcut.demo import demo_rows
from rollcut.gym.opaque import REFERENCE_AGENT
from rollcut.tokens import LocalTokenStore

from ..gym.nemo_bodies import stateful_counter_rows
from .conftest import collected, deploy

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[2] / "examples" / "padded_batch.py"


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on the crash: the episode and its verdict (ids name attempts, times differ)."""
    items = [{k: v for k, v in i.items() if k != "id"} for i in row["response"]["output"]]
    return {
        "output": items,
        "reward": row["reward"],
        "task": row["_ng_task_index"],
        "repeat": row["_ng_rollout_index"],
    }


ROW_SETS = {
    "demo": (demo_rows(12, seed=3), {}),
    # NeMo Gym rows through the reference opaque agent behind the relay: its answer is verified as
    # the Response NeMo Gym's /verify grades, and the row carries the episode's model calls
    "opaque": (
        demo_rows(8, seed=3, envs=("counter",)),
        {
            "envs": ("counter",),
            "agent_options": {
                "agent": "opaque",
                "command": f"{sys.executable} {REFERENCE_AGENT}",
                "capability": "replayable_egress",
            },
        },
    ),
    # the NeMo Gym server ported by docs/porting-a-gym-server.md, on rows shaped like its example data
    "stateful_counter": (stateful_counter_rows(10), {"envs": ("stateful_counter",)}),
}


@pytest.mark.parametrize("name", sorted(ROW_SETS))
def test_nemo_rows_through_a_crash_match_a_run_without_it(tmp_path: Path, name: str) -> None:
    rows, stack = ROW_SETS[name]
    with deploy(tmp_path / "reference", tasks=rows, **stack) as ref_dep:
        reference, _ = collected(ref_dep, crash=False)
    with deploy(tmp_path / "crashed", tasks=rows, **stack) as dep:
        crashed, _ = collected(dep, crash=True)
        done_before = {
            json.loads(line)["rollout_id"]
            for line in dep.output.read_text().splitlines()[:4]  # written before the crash
        }
        for rid, row in crashed.items():
            assert {"responses_create_params", "response", "reward", "_ng_task_index"} <= row.keys()
            assert row["_ng_attempt_index"] == row["attempt"] - 1 and row["_ng_rollout_id"] == rid
        assert set(crashed) == set(reference)
        for rid in done_before:
            assert _comparable(crashed[rid]) == _comparable(reference[rid]), rid
        with LocalTokenStore(dep.root / "tokens") as tokens:
            turns = list(read_turns(dep.output, tokens))
        assert {t.rollout_id for t in turns} == set(crashed)
        assert len(turns) == sum(len(r["rollcut"]["model_calls"]) for r in crashed.values())
        shown = subprocess.run(
            [sys.executable, str(EXAMPLE), str(dep.root), str(dep.output)], capture_output=True, text=True
        )
        assert shown.returncode == 0, shown.stderr
        assert f"{len(turns)} turns of {len(crashed)} rollouts" in shown.stdout
        for row in crashed.values():  # the episode's last item: the answer, as OpenAI's message type
            last = ResponseOutputMessage.model_validate(row["response"]["output"][-1])
            assert last.role == "assistant" and row["response"]["object"] == "response"
        if name == "stateful_counter":  # every verdict, continued or not
            assert {r: row["reward"] for r, row in crashed.items()} == {
                r: row["reward"] for r, row in reference.items()
            }
        if name == "opaque":  # its Response is the answer's: the token arrays are the model calls'
            return
        # a row whose arrays the store does not vouch for is refused, naming it
        lines = dep.output.read_text().splitlines()
        first = json.loads(lines[0])
        item = next(i for i in first["response"]["output"] if "generation_token_ids" in i)
        item["generation_token_ids"][0] += 1
        tampered = dep.root / "tampered.jsonl"
        tampered.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "rollcut",
                "export",
                str(tampered),
                "--home",
                str(dep.root),
                "--out",
                str(dep.root / "x.jsonl"),
            ],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 1 and first["rollout_id"] in out.stderr
