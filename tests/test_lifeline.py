"""Processes die with their parent: a SIGKILLed server leaves no worker serving alone, and a parent
that starts any program under ``lifeline()`` takes it with it (issue 34)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from rollcut._process import lifeline
from rollcut.testing import ServerProcess

from .leftovers import running


def _gone(pids: list[int], within_s: float = 30.0) -> list[int]:
    """The pids still running after waiting up to ``within_s`` for all of them to end."""
    deadline = time.monotonic() + within_s
    while (alive := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling /proc: these processes are not our children to wait on
    return alive


def test_a_servers_workers_die_when_its_parent_alone_is_killed(nats_url: str, namespace: str) -> None:
    srv = ServerProcess(
        ["resources", "scratchpad", "--url", nats_url, "--namespace", namespace, "--workers", "2"], workers=2
    )
    srv.start()
    try:
        assert srv.p is not None and len(srv.pids) == 2 and all(running(p) for p in srv.pids)
        os.kill(srv.p.pid, signal.SIGKILL)  # the parent only, not its process group
        srv.p.wait()
        assert _gone(srv.pids) == []
    finally:
        srv.close()


_PARENT = textwrap.dedent(
    """
    import subprocess, sys
    from rollcut._process import lifeline
    child = subprocess.Popen(["sleep", "600"], preexec_fn=lifeline())
    print(child.pid, flush=True)
    sys.stdin.read()
    """
)


def test_a_program_started_under_a_lifeline_dies_with_its_parent() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert running(child)
        parent.kill()
        parent.wait()
        assert _gone([child]) == []
    finally:
        parent.kill()
        parent.wait()


def test_no_lifeline_is_promised_off_the_main_thread() -> None:
    """The kernel signals a child when the thread that forked it ends: a lifeline armed from a
    worker thread would kill the child when that thread finished, so none is given there."""
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(lifeline()))
    t.start()
    t.join()
    assert got == [None]
    assert callable(lifeline())
