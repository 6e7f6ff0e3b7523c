"""Resolving where the bus and ledger are: a URL, or the embedded default under a home dir."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from .bus import BusConfig, EmbeddedServer, EventLog

__all__ = ["default_home", "open_log"]


def default_home() -> Path:
    """``$ROLLCUT_HOME``, else ``./.rollcut``: embedded server data and ledger live here."""
    return Path(os.environ.get("ROLLCUT_HOME", ".rollcut"))


@asynccontextmanager
async def open_log(
    url: str | None,
    *,
    home: Path,
    namespace: str = "default",
    sync_interval: str | None = None,
    name: str = "rollcut",
) -> AsyncIterator[EventLog]:
    """An EventLog on ``url``, or on an embedded server in ``home/nats`` started for the duration."""
    server: EmbeddedServer | None = None
    if not url:
        server = EmbeddedServer(home / "nats", sync_interval=sync_interval).start()
        url = server.url
    try:
        log = await EventLog.connect(BusConfig(url=url, namespace=namespace), name=name)
        try:
            yield log
        finally:
            await log.close()
    finally:
        if server is not None:
            server.stop()
