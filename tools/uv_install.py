"""Install into this interpreter's environment with uv, configured as pip is here.

Usage: ``.venv/bin/python tools/uv_install.py -e '.[dev]'`` (after ``.venv/bin/pip install -q uv``).

Why: the test command makes its virtual environment from nothing on every run, and pip spends
about two minutes of a two-core machine on it, most of them unpacking torch and byte-compiling
24,000 files one at a time; uv installs the same set from the same caches and compiles in
parallel, in under 30 s. uv reads its own configuration, not pip's, so the machine's pip
configuration (``pip config list``: its index, extra indexes, find-links, constraints and CA
file, from its files and ``PIP_*`` variables) is passed on as uv's flags: both resolve against the
same sources. Every index is considered for every package, as pip does (uv's default takes a
package from the first index that has it). The interpreter is this one; bytecode is compiled
(this machine's image sets ``PYTHONDONTWRITEBYTECODE``, so nothing is cached at import)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

_LISTS = {"extra-index-url": "--extra-index-url", "find-links": "--find-links", "constraint": "--constraint"}


def pip_config() -> dict[str, str]:
    """pip's effective settings for ``pip install``: ``pip config list`` prints each ``section.key``
    once, its files already merged; a ``PIP_*`` variable (``:env:``) wins over the ``install``
    section, which wins over ``global``."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    by_section: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        scoped, sep, value = line.partition("=")
        section, dot, key = scoped.rpartition(".")
        if sep and dot:
            by_section.setdefault(section, {})[key] = " ".join(shlex.split(value))
    settings: dict[str, str] = {}
    for section in ("global", "install", ":env:"):  # the later wins
        settings.update(by_section.get(section, {}))
    return settings


def uv_flags(settings: dict[str, str]) -> list[str]:
    """uv's flags for pip's settings: the same sources, every index considered for every package."""
    flags = ["--index-strategy", "unsafe-best-match"]
    if "index-url" in settings:
        flags += ["--index-url", settings["index-url"]]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        flags.append("--no-index")
    for key, flag in _LISTS.items():
        for value in settings.get(key, "").split():
            flags += [flag, value]
    return flags


def main(argv: list[str]) -> int:
    settings = pip_config()
    env = dict(os.environ)
    if settings.get("cert"):
        env.setdefault("SSL_CERT_FILE", settings["cert"])  # uv's way to trust pip's CA file
    uv = Path(sys.executable).with_name("uv")
    cmd = [str(uv), "pip", "install", "--quiet", "--compile-bytecode", "--python", sys.executable]
    return subprocess.run([*cmd, *uv_flags(settings), *argv], env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
