"""The Slurm recipe (deploy/slurm/collect.sbatch), run as Slurm would run it, without Slurm: the
script itself under bash, SIGTERM as ``--signal=B:TERM`` delivers it, ``scontrol`` a recorder on
PATH, and the requeued run as Slurm starts it (``SLURM_RESTART_COUNT=1``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from .conftest import SIGTERM, Deployment

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "collect.sbatch"


def _job(dep: Deployment, tmp: Path, **env: str) -> subprocess.Popen[str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"  # records what the job asks Slurm to do
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp / "scontrol.calls"}\n')
    scontrol.chmod(0o755)
    return subprocess.Popen(
        ["bash", str(SCRIPT)],
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "ROLLCUT_CONFIG": str(dep.config),
            "ROLLCUT": f"{sys.executable} -m rollcut",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_preempted_job_checkpoints_exits_75_requeues_and_the_requeued_run_finishes_once(
    deployment: Deployment, tmp_path: Path
) -> None:
    job = _job(deployment, tmp_path, SLURM_JOB_ID="4242")
    deployment.wait_rows(4, job)  # type: ignore[arg-type]
    job.send_signal(SIGTERM)  # --signal=B:TERM: to the batch script, not to its children
    _, err = job.communicate(timeout=120)
    assert job.returncode == 75, err[-2000:]
    assert (tmp_path / "scontrol.calls").read_text().split() == ["requeue", "4242"]
    assert 4 <= len(deployment.rows()) < deployment.rollouts

    again = _job(deployment, tmp_path, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="1")
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    ids = Counter(r["rollout_id"] for r in deployment.rows())
    assert len(ids) == deployment.rollouts and max(ids.values()) == 1
    assert (tmp_path / "scontrol.calls").read_text().split() == ["requeue", "4242"]  # not requeued again
