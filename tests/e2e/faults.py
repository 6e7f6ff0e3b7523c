"""What every fault test of a collection on a cluster checks, whatever the fault (node kills in
``test_cluster.py``, network partitions in ``test_partitions.py``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rollcut._home import credentials_for
from rollcut.bus import Credentials, EmbeddedCluster
from rollcut.demo import DEMO_NAMESPACE as NS
from rollcut.ledger import Ledger
from rollcut.testing import generated_twice

from ..cluster import missing_acks
from ..helpers import until
from .conftest import Deployment, finish

__all__ = ["cli", "collect_through", "creds_of", "exactly_once", "rows_grow", "slurm_job", "until_rows"]


def creds_of(dep: Deployment) -> Credentials:
    return credentials_for(dep.root / "nats", NS)


def published_since(dep: Deployment, t: float) -> int:
    with Ledger(dep.root / "ledger", readonly=True) as led:
        return sum(1 for rec in led.checkpoints() if rec.ts >= t)


def collect_through(dep: Deployment, cluster: EmbeddedCluster, fault: Callable[[], None]) -> None:
    """Run the collection, inject ``fault`` once it is under way, and check what every test checks."""
    proc = dep.collect()
    dep.wait_rows(3, proc, timeout=120)
    t_fault = time.time()
    fault()
    code, summary = finish(proc, timeout=300)
    assert code == 0, summary
    # the healed cluster checkpoints, and the newest checkpoint then covers the whole collection:
    # taken here, since whether one of the collector's own lands between the heal and its last row is
    # timing (its checkpoints abort while a participant's node is cut off; CI once saw none)
    taken = cli(dep, "checkpoint")
    assert taken.returncode == 0, taken.stdout + taken.stderr[-2000:]
    assert published_since(dep, t_fault) >= 1, "no checkpoint published after the fault"
    exactly_once(dep, cluster)


def exactly_once(dep: Deployment, cluster: EmbeddedCluster) -> None:
    """Every rollout's row once; every append any writer was told was stored, in the stream at the
    sequence it was told; the newest checkpoint verifies against the stream and the token store."""
    dep.each_rollout_once()
    told, wrong = missing_acks(cluster.url, creds_of(dep), dep.root / "acks")
    assert told > dep.rollouts * 10 and wrong == []
    assert generated_twice(cluster.url, creds_of(dep)) == []  # nothing completed was generated again
    with Ledger(dep.root / "ledger", readonly=True) as led:
        newest = max(led.checkpoints(), key=lambda c: c.cut).checkpoint_id
    ok = cli(dep, "checkpoints", "verify", newest)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"], ok.stdout + ok.stderr[-2000:]


def cli(dep: Deployment, *args: str) -> subprocess.CompletedProcess[str]:
    """A rollcut command on the deployment's bus, as its admin."""
    target = ["--url", dep.url, "--namespace", NS, "--credentials", str(dep.creds)]
    return subprocess.run(
        [sys.executable, "-m", "rollcut", *args, *target, "--home", str(dep.root), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )


def rows_grow(dep: Deployment, by: int) -> None:
    have = len(dep.rows())
    until_rows(dep, have + by)


def until_rows(dep: Deployment, n: int) -> None:
    asyncio.run(until(lambda: len(dep.rows()) >= min(n, dep.rollouts), timeout=120, what=f"{n} rows"))


SLURM_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "collect.sbatch"


def slurm_job(dep: Deployment, tmp: Path, **env: str) -> subprocess.Popen[str]:
    """The Slurm recipe (deploy/slurm/collect.sbatch) as Slurm runs it, with ``scontrol`` a recorder
    on PATH (what it was asked goes to ``tmp/scontrol.calls``)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    scontrol = bin_dir / "scontrol"  # records what the job asks Slurm to do
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp / "scontrol.calls"}\n')
    scontrol.chmod(0o755)
    return subprocess.Popen(
        ["bash", str(SLURM_SCRIPT)],
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
