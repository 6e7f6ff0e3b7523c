"""Claude Code, the real ``claude`` CLI, from the npm registry: installed once into the user's cache
by the first test that needs it (a pinned version, so its requests are the ones docs/opaque-agents.md
justifies each normalisation rule against), one installer at a time. Where npm or the registry is
out of reach the session stops saying why, rather than quietly testing less."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

VERSION = "2.1.197"
"""The CLI version the tests and the documented normalisation rules were taken against."""
CLAUDE_CODE_RULES = [
    "metadata.user_id",
    "system.*.text~Date: [0-9]{4}-[0-9]{2}-[0-9]{2}",
    "messages.*.content.*.text~Today's date is [0-9]{4}-[0-9]{2}-[0-9]{2}",
]
"""Claude Code's declared normalisation (``--normalise``), each rule justified in docs/opaque-agents.md."""
HOME = Path.home() / ".cache" / "rollcut" / f"claude-code-{VERSION}"


def claude_code() -> Path:
    """The ``claude`` executable (a native binary: its own directory holds everything it runs)."""
    exe = HOME / "lib" / "node_modules" / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe"
    HOME.parent.mkdir(parents=True, exist_ok=True)
    with open(HOME.parent / "claude-code.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not exe.is_file():
            npm = shutil.which("npm")
            if npm is None:
                pytest.exit("Claude Code's tests need npm (Debian: nodejs) to install the CLI", returncode=3)
            done = subprocess.run(
                [npm, "install", "-g", "--prefix", str(HOME), f"@anthropic-ai/claude-code@{VERSION}"],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if done.returncode != 0 or not exe.is_file():
                pytest.exit(
                    f"npm could not install Claude Code {VERSION}: {done.stderr[-1500:]}", returncode=3
                )
    return exe
