"""A new collection that reuses an earlier collection's task ids in the same namespace is refused
naming the collision, before it dispatches anything (finding 11 of issue 29)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rollcut.demo import demo_tasks

from ..e2e.conftest import deploy, finish


def test_the_same_task_ids_again_in_one_namespace_are_refused_naming_them(tmp_path: Path) -> None:
    with deploy(tmp_path, demo_tasks(6, seed=4)) as dep:
        code, first = finish(dep.collect())
        assert code == 0 and first["results_written"] == 6, first
        again = dep.config.with_name("again.yaml")
        again.write_text(dep.config.read_text().replace("output: results.jsonl", "output: again.jsonl"))
        argv = [sys.executable, "-m", "rollcut", "collect", str(again), "--json"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "6 of this collection's rollout ids" in done.stderr and "t0000" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "again.jsonl").exists() or (tmp_path / "again.jsonl").read_text() == ""
