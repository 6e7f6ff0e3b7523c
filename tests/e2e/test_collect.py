"""`rollcut collect` and `rollcut demo` end to end: real processes, SIGKILL, SIGTERM, SIGUSR1."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from .conftest import SIGTERM, SIGUSR1, Deployment, finish

pytestmark = pytest.mark.slow


def _exactly_once(dep: Deployment) -> None:
    ids = Counter(r["rollout_id"] for r in dep.rows())
    assert len(ids) == dep.rollouts and max(ids.values()) == 1


def test_demo_saves_everything_once_and_regenerates_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rollcut._cli", "demo", "--rollouts", "24", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["crashes"] == 1 and report["results_written"] == 24
    assert report["duplicate_results"] == 0
    assert report["model_calls"]["regenerated_after_crash"] == 0
    assert report["checkpoints_published"] >= 2
    assert sum(report["recovery"].values()) == 24 and report["recovery"]["continue"] >= 1


def test_sigterm_checkpoints_exits_75_and_resume_finishes(deployment: Deployment) -> None:
    proc = deployment.collect()
    deployment.wait_rows(4, proc)
    proc.send_signal(SIGTERM)
    code, summary = finish(proc)
    assert code == 75 and summary["interrupted"] is True and summary["checkpoints_published"] == 1
    code, summary = finish(deployment.collect("--resume"))
    assert code == 0, summary
    _exactly_once(deployment)
    assert summary["recovery"]["completed"] >= 4


def test_sigusr1_checkpoints_and_collection_goes_on(deployment: Deployment) -> None:
    proc = deployment.collect()
    deployment.wait_rows(2, proc)
    proc.send_signal(SIGUSR1)
    code, summary = finish(proc)
    assert code == 0 and summary["checkpoints_published"] == 1 and not summary["interrupted"]
    _exactly_once(deployment)


def test_crash_of_every_gym_process_then_resume_finishes_exactly_once(deployment: Deployment) -> None:
    proc = deployment.collect()
    deployment.wait_rows(4, proc)
    deployment.crash()  # SIGKILL every Gym process mid-run
    proc.send_signal(SIGTERM)  # the collector notices and stops, as a scheduler would stop it
    finish(proc)
    deployment.restart()
    code, summary = finish(deployment.collect("--resume"))
    assert code == 0, summary
    _exactly_once(deployment)
    assert summary["recovery"]["continue"] + summary["recovery"]["fresh_dispatch"] >= 1


def test_a_corrupted_ledger_is_rebuilt_from_the_stream_and_collection_resumes(deployment: Deployment) -> None:
    proc = deployment.collect()
    deployment.wait_rows(4, proc)
    proc.send_signal(SIGTERM)
    assert finish(proc)[0] == 75
    data = deployment.root / "ledger" / "data.mdb"
    data.write_bytes(b"\\x00" * 8192 + data.read_bytes()[8192:])
    code, summary = finish(deployment.collect("--resume"))
    assert code == 2  # refused, untouched
    creds = deployment.root / "nats" / "credentials.json"
    rebuilt = subprocess.run(
        [
            sys.executable,
            "-m",
            "rollcut._cli",
            "ledger",
            "rebuild",
            "--url",
            deployment.url,
            "--namespace",
            "demo",
            "--credentials",
            str(creds),
            "--ledger",
            str(deployment.root / "ledger"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-1000:]
    assert json.loads(rebuilt.stdout)["checkpoints"] >= 1
    code, summary = finish(deployment.collect("--resume"))
    assert code == 0, summary
    _exactly_once(deployment)
