"""Every size in the collect YAML is bounded: a typo cannot grow one process without limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BASE = "environment_url: http://127.0.0.1:1\ntasks: tasks.jsonl\noutput: out.jsonl\n"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("concurrency: 100000000", "concurrency"),
        ("num_repeats: 1000000000", "num_repeats"),
        ("max_attempts: 1000000", "max_attempts"),
        ("replicas: 99", "replicas"),
        ("heal_timeout_s: .nan", "heal_timeout_s"),
        ("checkpoint: {every_s: .inf}", "every_s"),
        ("compaction: {keep: 100000}", "keep"),
    ],
)
def test_an_unbounded_size_is_refused_before_anything_starts(tmp_path: Path, line: str, says: str) -> None:
    config = tmp_path / "collect.yaml"
    config.write_text(BASE + line + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "rollcut", "collect", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out.jsonl").exists()
