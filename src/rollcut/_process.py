"""Whether a process of this host still exists: a lease or a harness asks before it trusts a pid."""

from __future__ import annotations

import os

__all__ = ["pid_alive"]


def pid_alive(pid: int) -> bool:
    """True while ``pid`` names a process here (someone else's, which we may not signal, counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
