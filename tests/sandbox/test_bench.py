"""``rollcut bench sandbox`` as a user runs it: both ways measured in one run, on the same trees."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_sandbox_measures_manifests_over_blobs_against_tar_zstd_in_the_same_run() -> None:
    argv = ["bench", "sandbox", "--files", "40", "--sessions", "2", "--repeat", "1", "--changed", "5"]
    done = subprocess.run(
        [sys.executable, "-m", "rollcut", *argv, "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    fig = {k: v["median"] for k, v in out["by_changed"]["5%"].items()}
    for way in ("rollcut", "tar"):
        for what in ("first_s", "first_bytes", "second_s", "second_bytes", "restore_s"):
            assert fig[f"{way}_{what}"] > 0, (way, what)
    # 2 of 40 files changed per session: the second checkpoint stores those and two manifests
    blob_bytes = 2 * 2 * 2048
    assert blob_bytes < fig["rollcut_second_bytes"] < fig["rollcut_first_bytes"] / 2
    assert fig["vs_tar_second_bytes"] == round(fig["rollcut_second_bytes"] / fig["tar_second_bytes"], 3)
