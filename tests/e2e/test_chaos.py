"""`rollcut bench chaos`: a round of random faults, every kind once, and not one invariant violated
(the closing note of issue 34 gives the figures of a long run)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rollcut.bench import FAULTS

from ..hosts import hosts_available

pytestmark = pytest.mark.slow


def test_a_round_of_every_fault_kind_violates_no_invariant() -> None:
    hosts_available()  # the network faults need hosts of our own: installed here as in CI
    argv = [sys.executable, "-m", "rollcut", "bench", "chaos", "--trials", str(len(FAULTS)), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    out = json.loads(done.stdout)
    assert sorted(out["faults"]) == sorted(FAULTS)  # every kind was tried, partitions included
    assert all(row["trials"] == 1 for row in out["faults"].values())
    assert out["violations"] == 0 and out["failures"] == [], out["failures"]
    assert done.returncode == 0, done.stderr[-2000:]
