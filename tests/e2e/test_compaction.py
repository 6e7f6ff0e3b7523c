"""Bounded storage: `rollcut collect` compacts the stream and the token store as it goes, `rollcut
compact` by hand, and restore, `checkpoints verify`, `ledger rebuild`, `replay` and `export` still
work on every kept checkpoint and every row."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollcut.demo import demo_rows
from rollcut.ledger import Ledger

from .conftest import SIGTERM, Deployment, deploy, finish

pytestmark = pytest.mark.slow


@pytest.fixture
def compacting(tmp_path: Path) -> Iterator[Deployment]:
    with deploy(tmp_path, demo_rows(48, seed=2), token_delay=0.004) as dep:  # NeMo rows: they export
        dep.every_s = 0.5
        dep.extra_config = ["compaction:", "  keep: 2"]
        dep._write_config()
        yield dep


def _cli(dep: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    target = ["--url", dep.url, "--namespace", "demo", "--credentials", str(dep.creds)]
    return subprocess.run(
        [sys.executable, "-m", "rollcut", *args, *target, "--home", str(dep.root), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _statuses(ledger: Path) -> dict[str, tuple[str, int]]:
    with Ledger(ledger, readonly=True) as led:
        return {r.rollout_id: (r.status, r.current_attempt) for r in led.rollouts()}


def test_a_collection_compacts_as_it_goes_and_its_checkpoints_still_verify_rebuild_and_replay(
    compacting: Deployment,
) -> None:
    dep = compacting
    code, summary = finish(dep.collect(), timeout=300)
    assert code == 0, summary
    dep.each_rollout_once()
    assert summary["compacted_rollouts"] > 0
    freed = summary["compaction_freed_bytes"]
    # a last compaction by hand: everything accepted below the oldest of the 2 kept checkpoints
    out = _cli(dep, "compact", "--keep", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    rep: dict[str, Any] = json.loads(out.stdout)
    assert rep["stream_bytes_after"] <= rep["stream_bytes_before"]
    # bounded: what the stream holds now is a small part of what it would hold without compaction
    uncompacted = rep["stream_bytes_before"] + freed
    assert rep["stream_bytes_after"] * 4 < uncompacted, (rep, freed)
    with Ledger(dep.root / "ledger", readonly=True) as led:
        kept = [c.checkpoint_id for c in led.checkpoints()]
    assert len(kept) == 2
    for cid in kept:
        ok = _cli(dep, "checkpoints", "verify", cid)
        assert ok.returncode == 0 and json.loads(ok.stdout)["ok"], ok.stdout + ok.stderr[-2000:]
    before = _statuses(dep.root / "ledger")
    rebuilt = _cli(dep, "ledger", "rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert json.loads(rebuilt.stdout)["checkpoints"] == 2
    assert _statuses(dep.root / "ledger") == before  # every rollout as it stood, from the stream alone
    assert all(status == "accepted" for status, _ in before.values())
    replayed = _cli(dep, "replay", "--checkpoint", kept[-1])
    assert replayed.returncode == 0, replayed.stderr[-2000:]

    # the token store let the compacted rollouts' records go, and every row still exports, each turn
    # checked against what the store kept of its released record
    assert summary["compaction_released_token_records"] > 0
    out_file = dep.root / "turns.jsonl"
    exported = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollcut",
            "export",
            str(dep.output),
            "--home",
            str(dep.root),
            "--out",
            str(out_file),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    done = json.loads(exported.stdout)
    assert done["rollouts"] == dep.rollouts and done["turns"] >= dep.rollouts  # every row, each checked


def test_a_collection_that_compacted_is_resumed_from_its_checkpoint_exactly_once(
    compacting: Deployment,
) -> None:
    dep = compacting
    proc = dep.collect()
    dep.wait_rows(20, proc, timeout=120)
    proc.send_signal(SIGTERM)
    code, summary = finish(proc)
    assert code == 75 and summary["compacted_rollouts"] > 0, summary
    code, summary = finish(dep.collect("--resume"), timeout=300)
    assert code == 0, summary
    dep.each_rollout_once()
    assert summary["recovery"]["completed"] >= 20
