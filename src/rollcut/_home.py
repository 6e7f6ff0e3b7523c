"""Resolving where the bus, ledger and token store are, and who we are on the bus.

With no URL, rollcut runs the embedded default: a nats-server under
``HOME/nats`` whose per-role credentials are generated once and kept
(0600) in ``HOME/nats/credentials.json``. With a URL, credentials come from
``--credentials`` / ``$ROLLCUT_CREDENTIALS`` when given.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from ._errors import ConfigError
from .bus import BusConfig, Credentials, EmbeddedServer, EventLog, load_credentials

__all__ = ["credentials_for", "default_home", "home_namespace", "open_log"]


def default_home() -> Path:
    """``$ROLLCUT_HOME``, else ``./.rollcut``: embedded server data, ledger and tokens live here."""
    return Path(os.environ.get("ROLLCUT_HOME", ".rollcut"))


def home_namespace(home: Path) -> str | None:
    """The namespace the embedded server under ``home`` was set up for (None: no server there yet):
    a command pointed at a home works in the namespace the home holds unless told otherwise."""
    path = home / "nats" / "credentials.json"
    return load_credentials(path).namespace if path.exists() else None


def credentials_for(data_dir: Path, namespace: str) -> Credentials:
    """The embedded server's credentials, created on first use."""
    path = data_dir / "credentials.json"
    if path.exists():
        creds = load_credentials(path)
        if creds.namespace != namespace:
            raise ConfigError(
                f"the server in {data_dir} was set up for namespace {creds.namespace!r}, not {namespace!r}"
            )
        return creds
    creds = Credentials.generate(namespace)
    creds.save(path)
    return creds


@asynccontextmanager
async def open_log(
    url: str | None,
    *,
    home: Path,
    namespace: str = "default",
    role: str = "admin",
    credentials: Path | None = None,
    sync_interval: str | None = None,
    name: str = "rollcut",
    replicas: int = 1,
) -> AsyncIterator[EventLog]:
    """An EventLog as ``role``: on ``url``, or on an embedded server started for the duration."""
    server: EmbeddedServer | None = None
    config = BusConfig(url=url, namespace=namespace, replicas=replicas)
    if not url:
        creds = credentials_for(home / "nats", namespace)
        server = EmbeddedServer(home / "nats", sync_interval=sync_interval, credentials=creds).start()
        config = BusConfig(url=server.url, replicas=replicas).as_role(creds, role)
    elif credentials is not None:
        config = config.as_role(load_credentials(credentials), role)
    try:
        log = await EventLog.connect(config, name=name)
        try:
            yield log
        finally:
            await log.close()
    finally:
        if server is not None:
            server.stop()
