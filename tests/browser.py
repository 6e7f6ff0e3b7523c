"""A real headless browser for the tests that look at a page: Debian's Chromium, driven by Playwright.

Chromium is installed from Debian's packages by the first test that needs it
where it is absent (as root, with apt); where it cannot be, the test is skipped
saying why. Started with the flags a closed network needs: no background
connections, no component updates, a fresh profile.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from .apt import install

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",  # as root in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    """The path of a Chromium binary, installing it first if need be (one installer at a time)."""
    with open("/tmp/rollcut-chromium.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not Path(CHROMIUM).exists():
            why = install("chromium")
            if why:
                pytest.skip(why)
    return CHROMIUM


@contextmanager
def page(path: Path) -> Iterator[tuple[Any, list[str]]]:
    """``path`` opened in headless Chromium: the page, and every console message and page error."""
    from playwright.sync_api import sync_playwright

    binary = chromium()
    seen: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=binary, args=FLAGS)
        try:
            pg = browser.new_page(viewport={"width": 1280, "height": 900})
            pg.on("console", lambda m: seen.append(f"console {m.type}: {m.text}"))
            pg.on("pageerror", lambda e: seen.append(f"page error: {e}"))
            pg.on("requestfailed", lambda r: seen.append(f"request failed: {r.url}"))
            pg.goto(path.absolute().as_uri(), wait_until="load")
            yield pg, seen
        finally:
            browser.close()
