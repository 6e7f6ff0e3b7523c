"""The Slurm recipe (deploy/slurm/collect.sbatch), run as Slurm would run it, without Slurm: the
script itself under bash, SIGTERM as ``--signal=B:TERM`` delivers it, ``scontrol`` a recorder on
PATH, and the requeued run as Slurm starts it (``SLURM_RESTART_COUNT=1``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import SIGTERM, Deployment
from .faults import slurm_job

pytestmark = pytest.mark.slow


def test_preempted_job_checkpoints_exits_75_requeues_and_the_requeued_run_finishes_once(
    deployment: Deployment, tmp_path: Path
) -> None:
    job = slurm_job(deployment, tmp_path, SLURM_JOB_ID="4242")
    deployment.wait_rows(4, job)  # type: ignore[arg-type]
    job.send_signal(SIGTERM)  # --signal=B:TERM: to the batch script, not to its children
    _, err = job.communicate(timeout=120)
    assert job.returncode == 75, err[-2000:]
    assert (tmp_path / "scontrol.calls").read_text().split() == ["requeue", "4242"]
    assert 4 <= len(deployment.rows()) < deployment.rollouts

    again = slurm_job(deployment, tmp_path, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="1")
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    deployment.each_rollout_once()
    assert (tmp_path / "scontrol.calls").read_text().split() == ["requeue", "4242"]  # not requeued again
