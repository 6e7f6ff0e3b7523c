"""bubblewrap, which sandboxes every opaque agent's program, installed where it is absent.

Installed from Debian's packages by the first test session that needs it (as root, with apt),
one installer at a time. Where it cannot be, the session stops saying why: an opaque agent server
refuses to start without it (unless ``--unisolated``), and the suite does not quietly test less.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess

import pytest


def _install() -> str | None:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "bubblewrap is absent and cannot be installed here (needs root and apt-get)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "bubblewrap"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:  # the package lists may be stale on a fresh machine
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=900)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    return None if done.returncode == 0 else f"apt-get install bubblewrap failed: {done.stderr[-500:]}"


def bubblewrap() -> str:
    """The path of bwrap, installing it first if need be."""
    with open("/tmp/rollcut-bubblewrap.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which("bwrap") is None:
            why = _install()
            if why:
                pytest.exit(why, returncode=3)
    path = shutil.which("bwrap")
    assert path is not None
    return path
