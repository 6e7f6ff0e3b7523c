"""bubblewrap, which sandboxes every opaque agent's program, installed where it is absent.

Installed from Debian's packages by the first test session that needs it (as root, with apt),
one installer at a time. Where it cannot be, the session stops saying why: an opaque agent server
refuses to start without it (unless ``--unisolated``), and the suite does not quietly test less.
"""

from __future__ import annotations

import fcntl
import shutil

import pytest

from .apt import install


def bubblewrap() -> str:
    """The path of bwrap, installing it first if need be."""
    with open("/tmp/rollcut-bubblewrap.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which("bwrap") is None:
            why = install("bubblewrap")
            if why:
                pytest.exit(why, returncode=3)
    path = shutil.which("bwrap")
    assert path is not None
    return path
