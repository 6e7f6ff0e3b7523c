"""Checkpoint at scale: every bundled environment, several workers per server, one crash.

Every rollout is written exactly once, no model call completed before the
crash is generated again by a continuing attempt, and every checkpoint the
collection published verifies from scratch against the stream and the token
store. 80 rollouts here (the whole suite has 30 minutes on 2 cores);
``rollcut bench e2e --rollouts 2000 --workers 2 --mixed`` runs the same at 2,000.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from rollcut.collect import _index
from rollcut.demo import run_demo
from rollcut.gym.resources import ENVIRONMENTS

pytestmark = pytest.mark.slow

ROLLOUTS = 80  # each published checkpoint is verified from scratch: the cost grows faster than the count

BUNDLED = tuple(n for n in ENVIRONMENTS if n != "nemo-gym")
"""rollcut's own environments (NeMo Gym's servers are not bundled: tests/gym/test_nemo_upstream.py)."""


def test_a_mixed_collection_at_scale_crashes_resumes_and_every_checkpoint_verifies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the collection's index past its spill point, as a collection of millions has it: on disk
    monkeypatch.setattr(_index, "SPILL_AT", 32)
    made: list[Path] = []
    disk_init = _index._Disk.__init__

    def spied(self: _index._Disk, near: Path) -> None:
        disk_init(self, near)
        made.append(Path(self.folder))

    monkeypatch.setattr(_index._Disk, "__init__", spied)
    report = asyncio.run(
        run_demo(
            rollouts=ROLLOUTS,
            envs=BUNDLED,
            workers=(2, 3),  # every server: two workers before the crash, three after
            verify=True,
            checkpoint_every_s=2.0,
            concurrency=64,
            home=tmp_path,
        )
    )
    assert report["crashes"] == 1 and report["failed"] == {}, report["failed"]
    assert report["results_written"] == ROLLOUTS and report["duplicate_results"] == 0
    assert report["model_calls"]["regenerated_while_continuing"] == 0
    assert report["recovery"]["continue"] >= 1
    assert report["checkpoints_published"] >= 2 and report["checkpoint_problems"] == []
    assert set(report["peak_rss_mb"]) == {"model", *BUNDLED, "agent", "environment"}
    gc.collect()  # the demo's collectors are garbage now (a CLI's go at exit)
    assert len(made) >= 2 and not any(p.exists() for p in made)  # before and after the crash; gone after
