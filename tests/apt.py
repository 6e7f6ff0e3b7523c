"""Debian packages a test needs (Chromium, bubblewrap), installed where they are absent."""

from __future__ import annotations

import os
import shutil
import subprocess


def install(package: str) -> str | None:
    """``apt-get install`` one package (as root); None when done, else why it cannot be."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{package} is absent and cannot be installed here (needs root and apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:  # the package lists may be stale on a fresh machine
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=900)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    return None if done.returncode == 0 else f"apt-get install {package} failed: {done.stderr[-500:]}"
